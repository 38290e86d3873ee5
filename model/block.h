// model/block.h — one transformer block: the layer's residual branches (model/layers/layer_spec.h)
// run in order, each a sublayer object (model/layers/sublayer.h) with its norms around it. The
// skeleton that training, recompute, the KV-cache decoder and the memory estimate all use; it knows
// no sublayer's kind, so every family is this skeleton with its own layer specs.
//
//   x (Nl, C), N = B·T tokens of the micro-batch (Nl = N/t with sequence parallelism)
//   for each branch b (NormPlace):   h = norm_b(x) (Pre, Sandwich) or x
//                                    o = op_b(h);  o = norm_out_b(o) (Sandwich, Output)
//                                    r = x + dropout(o)
//                                    x = norm_b(r) (AfterResidual) or r
//   y = x
// A pre-norm decoder: x2 = x + drop(attention(norm1(x))), y = x2 + drop(mlp(norm2(x2)));
// a T5 decoder block adds x3 = x2 + drop(xattn(norm3(x2), mem)) between them.
// Dropout masks are named by (seed, offset): branch b's output at offset + slot_b·N·C (the
// attention's slot 0, the MLP's 1, the cross-attention's 2; global element index, so TP/SP ranks and
// a recompute draw the single-process masks); attention probabilities use (seed, s.attention_offset)
// in attention.h's streams.
//
// Backward in two parts (zero-bubble pipelines split them into B and W):
//   block_backward_input: dx (= d(block)/dx · dy, overwritten); the weight-gradient
//     GEMMs and the norm weight gradients go to `defer` (or run at once when null: both
//     parts at once). Parameter gradients use +=.
// With sequence parallelism the norm weight gradients are partial sums over this
// rank's rows; the weight part all-reduces them over the TP group.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "autograd/tape.h"
#include "model/config.h"
#include "model/layers/block_shape.h"
#include "model/layers/layer_spec.h"
#include "model/layers/norm.h"
#include "model/layers/sublayer.h"
#include "model/params.h"
#include "model/tensor_parallel.h"

namespace mpitron {

// A block's parameters: layer l's rows of the parameter table (model/param_table.h), by role,
// and its layer spec. The sublayers take their parts (a role the configuration has no row for is
// an undefined Var: no bias, no norm bias), so a new sublayer is new roles in the table.
struct BlockParams {
  std::vector<std::pair<ParamRole, Var>> rows;  // in table order (consecutive in the ParamSet)
  std::shared_ptr<const LayerSpec> spec;        // what the layer is made of
  // An MoE layer's expert bias (E) f32, a buffer, not a parameter: aux-loss-free balancing
  // (--moe-router-enable-expert-bias; GPT::enable_expert_bias). Undefined: none.
  Tensor expert_bias;
  static BlockParams from(const ParamSet& ps, const GPTConfig& cfg, int64_t layer);
  const Var& operator[](ParamRole r) const;     // undefined when the layer has no such row
  std::vector<Var> all(ParamRole r) const;      // every row of a role, in table order (the experts')
  int64_t count() const { return static_cast<int64_t>(rows.size()); }
  NormParams norm(const BranchNorm& n, const NormSpec& s) const { return {(*this)[n.weight], (*this)[n.bias], s.one_plus}; }
};

// Saved activations of one branch.
struct BranchActs {
  Tensor in;        // (Nl, C) the branch's input (branch 0: the block's input)
  NormActs norm;    // the input (or after-residual) norm's statistics
  NormActs out;     // the output norm's
  Tensor raw;       // (Nl, C) the sublayer's output before the output norm (Sandwich, Output)
  Tensor sum;       // (Nl, C) x + drop(o), the after-residual norm's input (AfterResidual)
  std::unique_ptr<SublayerActs> op;
};

// Saved activations of one block's forward.
struct BlockActs {
  std::vector<BranchActs> branches;
  void release() { branches.clear(); }
};

// y = block(x); fills acts. The layer is p.spec; how attention runs, s.core.
void block_forward(const BlockShape& s, const BlockParams& p, const Tensor& x, const Tensor& y, BlockActs& a,
                   uint64_t seed, uint64_t offset);
// dx (Nl, C) overwritten; the weight part goes to defer (run now when null).
void block_backward_input(const BlockShape& s, const BlockParams& p, const Tensor& x, const Tensor& dy,
                          const Tensor& dx, const BlockActs& a, uint64_t seed, uint64_t offset,
                          WeightGradWork* defer);

// What the block of `spec` holds (model/layers/sublayer.h's BlockMemory): the residual stream's and
// norms' terms and each sublayer's. Kept next to block_forward: change both.
BlockMemory block_memory(const BlockShape& s, const LayerSpec& spec);

// The block as one tape node; with recompute it keeps only x and replays the forward.
// grads_ready (may be empty) is called once the block's parameter gradients are
// final for this micro-batch: after its backward, or after its deferred weight
// part when the tape defers weight gradients. before_backward (may be empty) is
// called before the backward (and its recompute) reads the parameters (ZeRO-3
// gathers them there).
Var block(Tape& tape, const BlockShape& s, const BlockParams& p, const Var& x, uint64_t seed, uint64_t offset,
          bool recompute, std::function<void()> grads_ready = {}, std::function<void()> before_backward = {});

}  // namespace mpitron
