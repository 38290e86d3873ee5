// model/layers/sublayer.h — one part of a transformer block, as an object.
//
// A block (model/block.h) is a per-layer list of residual branches (model/layers/layer_spec.h),
// each a norm placement around ONE sublayer: self-attention, cross-attention, a dense MLP, a
// Mixture of Experts. The block composes them and knows none of their kinds; each sublayer owns
//   - its settings for its layer (heads, rope, window, MLP kind, …: built once from the
//     configuration by layer_spec()),
//   - its parameter rows (model/param_table.h; the Hugging Face names are the family's, by role),
//   - its forward and its backward in two parts (input now; weight GEMMs deferred for zero-bubble
//     pipelines), side by side,
//   - its memory term (model/memory.h's estimate), its attention FLOPs and its KV-cache layout.
//
//   forward   in (Nl, C) → out (Nl, C): this rank's rows (N/t with sequence parallelism), the
//             output already reduced over the tensor-parallel group; fills its acts.
//   backward  dout (Nl, C) → d(in) (Nl, C) (overwritten); parameter gradients use +=, the weight
//             part goes to `defer` (run at once when null).
// Dropout on the output and the residual belong to the block.
#pragma once
#include <cstdint>
#include <memory>
#include <vector>

#include "autograd/tape.h"
#include "model/layers/block_shape.h"
#include "model/param_table.h"

namespace mpitron {

struct BlockParams;  // model/block.h: a layer's parameters by role

// What one block holds, in elements of the compute dtype (act) and f32 (f32), for the memory
// estimate (model/memory.h): `saved` from its forward to its backward, `backward` the peak of the
// temporaries its backward allocates, `deferred` what its input part leaves for a deferred weight
// part (split backward). Each sublayer adds its own terms; the block adds the residual stream's.
struct BlockMemory {
  int64_t saved_act = 0, saved_f32 = 0, backward_act = 0, deferred_act = 0;
};

// A sublayer's saved activations (its own type; the block only holds them).
struct SublayerActs {
  virtual ~SublayerActs() = default;
};

class Sublayer {
 public:
  virtual ~Sublayer() = default;
  // "self_attention", "cross_attention", "mlp", "moe" (logs, errors, tests).
  virtual const char* kind() const = 0;
  // Its parameter rows of its layer, in table order, appended to `rows`.
  virtual void rows(std::vector<ParamSpec>& rows) const = 0;
  // seed: the dropout key (attention dropout inside the sublayer).
  virtual Tensor forward(const BlockShape& s, const BlockParams& p, const Tensor& in,
                         std::unique_ptr<SublayerActs>& acts, uint64_t seed) const = 0;
  virtual Tensor backward(const BlockShape& s, const BlockParams& p, const SublayerActs& acts, const Tensor& dout,
                          uint64_t seed, WeightGradWork* defer) const = 0;
  // Adds its terms to the block's memory (see BlockMemory).
  virtual void memory(const BlockShape& s, BlockMemory& m) const = 0;
  // Training FLOPs per token besides its matmul weights' (those are 6 per weight element, counted
  // from the parameter rows): attention's score and value products, 12·NH·HD·K for K keys attended
  // on average (docs/flops.md). seq: the whole sequence's length T.
  virtual double attention_flops_per_token(int64_t seq) const { (void)seq; return 0.0; }
  // Elements of the KV cache per token that this sublayer keeps on one tensor-parallel rank
  // (self-attention: keys and values of its Gl groups); 0: none.
  virtual int64_t kv_elements_per_token(const TensorParallel& tp) const { (void)tp; return 0; }
};

}  // namespace mpitron
