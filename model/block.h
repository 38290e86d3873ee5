// model/block.h — one pre-norm transformer block, composed from sublayers
// (model/layers/): the skeleton that training, recompute, the KV-cache decoder
// and the memory estimate all use. Every family is this skeleton with its own
// sublayer choices (BlockShape: LayerNorm/RMSNorm, rope or not, query groups,
// GELU/SwiGLU, biases or not).
//
//   x (Nl, C), N = B·T tokens of the micro-batch (Nl = N/t with sequence parallelism)
//   h1 = norm1(x)                               (Nl, C)
//   x2 = x + dropout(attention(h1))             attention_layer.h
//   x3 = x2 + dropout(xattn(norm3(x2), mem))    T5 decoder blocks only (cross_attention_layer.h); else x3 = x2
//   h2 = norm2(x3)
//   y  = x3 + dropout(mlp(h2))                  mlp_layer.h
// Post-LN (BlockShape::post_ln, the original BERT; same sublayers and parameters):
//   x2 = norm1(r1), r1 = x + dropout(attention(x))
//   y  = norm2(r2), r2 = x2 + dropout(mlp(x2))
// Dropout masks are named by (seed, offset): the attention output's mask at offset,
// the MLP output's at offset + N·C, the cross-attention output's at offset + 2·N·C (global
// element index, so TP/SP ranks and a recompute draw the single-process masks); attention probabilities use
// (seed, s.attention_offset) in attention.h's streams.
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
#include <string>

#include "autograd/tape.h"
#include "model/config.h"
#include "model/layers/attention_layer.h"
#include "model/layers/block_shape.h"
#include "model/layers/cross_attention_layer.h"
#include "model/layers/mlp_layer.h"
#include "model/layers/norm.h"
#include "model/params.h"
#include "model/tensor_parallel.h"

namespace mpitron {

// A block's parameters: layer l's rows of the parameter table (model/param_table.h), by
// role. The sublayers take their parts (a role the configuration has no row for is an
// undefined Var: no bias, no norm bias), so a new sublayer is new roles in the table.
struct BlockParams {
  std::vector<std::pair<ParamRole, Var>> rows;  // in table order (consecutive in the ParamSet)
  bool norm_1p = false;                          // the norms scale by (1 + w) (--apply-layernorm-1p)
  // An MoE layer's expert bias (E) f32, a buffer, not a parameter: aux-loss-free balancing
  // (--moe-router-enable-expert-bias; GPT::enable_expert_bias). Undefined: none.
  Tensor expert_bias;
  static BlockParams from(const ParamSet& ps, const GPTConfig& cfg, int64_t layer);
  const Var& operator[](ParamRole r) const;     // undefined when the layer has no such row
  int64_t count() const { return static_cast<int64_t>(rows.size()); }
  NormParams norm1() const { return {(*this)[ParamRole::Norm1Weight], (*this)[ParamRole::Norm1Bias], norm_1p}; }
  NormParams norm2() const { return {(*this)[ParamRole::Norm2Weight], (*this)[ParamRole::Norm2Bias], norm_1p}; }
  AttentionParams attn() const {
    return {(*this)[ParamRole::QkvWeight], (*this)[ParamRole::QkvBias], (*this)[ParamRole::ProjWeight],
            (*this)[ParamRole::ProjBias]};
  }
  NormParams norm3() const { return {(*this)[ParamRole::Norm3Weight], (*this)[ParamRole::Norm3Bias], norm_1p}; }
  CrossAttentionParams cross() const {
    return {(*this)[ParamRole::CrossQWeight], (*this)[ParamRole::CrossQBias], (*this)[ParamRole::CrossKvWeight],
            (*this)[ParamRole::CrossKvBias], (*this)[ParamRole::CrossProjWeight], (*this)[ParamRole::CrossProjBias]};
  }
  std::vector<Var> all(ParamRole r) const;      // every row of a role, in table order (the experts')
  MlpParams mlp() const {
    return {(*this)[ParamRole::FcWeight], (*this)[ParamRole::FcBias], (*this)[ParamRole::MlpProjWeight],
            (*this)[ParamRole::MlpProjBias],
            MoeParams{(*this)[ParamRole::RouterWeight], all(ParamRole::ExpertFcWeight), all(ParamRole::ExpertFcBias),
                      all(ParamRole::ExpertProjWeight), all(ParamRole::ExpertProjBias),
                      (*this)[ParamRole::SharedFcWeight], (*this)[ParamRole::SharedProjWeight],
                      (*this)[ParamRole::SharedGateWeight], expert_bias}};
  }
};

// Saved activations of one block's forward.
struct BlockActs {
  NormActs n1, n2, n3;  // n3: the cross-attention's norm (T5 decoder blocks)
  CrossAttentionActs xattn;  // xattn.in = norm3's output
  Tensor x3;                 // (Nl, C) the residual after cross-attention (T5 decoder blocks)
  AttentionActs attn;  // attn.in = norm1's output
  MlpActs mlp;         // mlp.in = norm2's output
  Tensor x2;           // (Nl, C); post-LN: norm1's output
  Tensor r1, r2;       // post-LN only: the residual sums norm1 and norm2 read (Nl, C)
  void release() { *this = BlockActs(); }
};

// y = block(x); fills acts. core: see AttentionCore (nullptr: causal attention).
void block_forward(const BlockShape& s, const BlockParams& p, const Tensor& x, const Tensor& y, BlockActs& a,
                   uint64_t seed, uint64_t offset, const AttentionCore* core = nullptr);
// dx (Nl, C) overwritten; the weight part goes to defer (run now when null).
void block_backward_input(const BlockShape& s, const BlockParams& p, const Tensor& x, const Tensor& dy,
                          const Tensor& dx, const BlockActs& a, uint64_t seed, uint64_t offset,
                          WeightGradWork* defer);

// What one block holds, in elements of the compute dtype (act) and f32 (f32), for
// the memory estimate (model/memory.h): `saved` from its forward to its backward
// (acts, plus its output, the next block's input), `backward` the peak of the
// temporaries its backward allocates, `deferred` what its input part leaves for a
// deferred weight part (split backward). Kept next to block_forward: change both.
struct BlockMemory {
  int64_t saved_act = 0, saved_f32 = 0, backward_act = 0, deferred_act = 0;
};
BlockMemory block_memory(const BlockShape& s);

// The block as one tape node; with recompute it keeps only x and replays the forward.
// grads_ready (may be empty) is called once the block's parameter gradients are
// final for this micro-batch: after its backward, or after its deferred weight
// part when the tape defers weight gradients. before_backward (may be empty) is
// called before the backward (and its recompute) reads the parameters (ZeRO-3
// gathers them there).
Var block(Tape& tape, const BlockShape& s, const BlockParams& p, const Var& x, uint64_t seed, uint64_t offset,
          bool recompute, std::function<void()> grads_ready = {}, std::function<void()> before_backward = {});

}  // namespace mpitron
