// model/layers/attention_layer.h — the self-attention sublayer of a block (model/layers/sublayer.h).
//
//   in   (Nl, C)   the norm output (this rank's rows; N/t with sequence parallelism)
//   in_f (N, C)    = in, or all-gathered rows under sequence parallelism
//   qkv  (N, QL)   = in_f · Wqkvᵀ + bqkv     QL = (NHl + 2·Gl)·HD: this rank's NHl query
//                                            heads, then Gl key and Gl value heads
//   qkv  ← qk_norm(qkv) on the query and key heads (QkNorm; in place)
//   qkv  ← rope(qkv) on the NHl + Gl query and key heads (rope only; in place; at the rows'
//                                            global positions, or the core's positions)
//   att  (N, Cl)   = core(qkv)               the call's attention core (model/layers/attention_core.h):
//                                            local, context-parallel, T5's biased, or a KV cache's
//   lse  (B, NHl, T) f32                     (cores that train)
//   out  (Nl, C)   = reduce(att · Wprojᵀ + bproj)   all-reduce, or reduce-scatter rows (SP);
//                                                   bproj added by TP rank 0 only
// Backward in two parts: the input part returns d(in) and either runs the weight
// part (dWqkv, dbqkv, dWproj, dbproj +=) at once or defers it to a WeightGradWork.
#pragma once
#include <cstdint>
#include <memory>
#include <vector>

#include "model/layers/attention_core.h"
#include "model/layers/attention_spec.h"
#include "model/layers/sublayer.h"

namespace mpitron {

struct AttentionActs final : SublayerActs {
  Tensor in, qkv, att, lse;  // in (Nl, C), qkv (N, QL) after QK-norm and rope, att (N, Cl), lse (B, NHl, T)
  Tensor qkv_raw;            // QK-norm: qkv before it (N, QL); undefined: none
  Tensor q_rstd, k_rstd;     // QK-norm's statistics (N, NHl or 1), (N, Gl or 1) f32
};

class SelfAttention final : public Sublayer {
 public:
  // Layer `layer` of a model of hidden width C.
  SelfAttention(const AttentionSpec& spec, int64_t layer, int64_t hidden);
  const AttentionSpec& spec() const { return spec_; }

  const char* kind() const override { return "self_attention"; }
  void rows(std::vector<ParamSpec>& rows) const override;
  Tensor forward(const BlockShape& s, const BlockParams& p, const Tensor& in, std::unique_ptr<SublayerActs>& acts,
                 uint64_t seed) const override;
  Tensor backward(const BlockShape& s, const BlockParams& p, const SublayerActs& acts, const Tensor& dout,
                  uint64_t seed, WeightGradWork* defer) const override;
  void memory(const BlockShape& s, BlockMemory& m) const override;
  double attention_flops_per_token(int64_t seq) const override;
  int64_t kv_elements_per_token(const TensorParallel& tp) const override;

 private:
  void apply_rope(const BlockShape& s, const Tensor& qkv, bool inverse) const;
  void qk_norm_forward(const BlockShape& s, const BlockParams& p, AttentionActs& a) const;
  void qk_norm_backward(const BlockShape& s, const BlockParams& p, const AttentionActs& a, const Tensor& dqkv,
                        WeightGradWork* defer) const;
  AttentionSpec spec_;
  int64_t layer_, hidden_;
};

// The keys a query of a sequence of T tokens attends on average, less one half (the diagonal
// counted half): T/2 causal, T bidirectional, the mean of min(i, W) + 1/2 with a sliding window W.
double attended_keys(AttentionMaskKind mask, int64_t window, int64_t T);

}  // namespace mpitron
