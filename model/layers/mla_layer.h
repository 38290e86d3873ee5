// model/layers/mla_layer.h — multi-latent attention (DeepSeek-V2/V3; Megatron-Core's
// MLASelfAttention, --multi-latent-attention), a self-attention sublayer (model/layers/sublayer.h).
//
// NH heads of query/key width Dqk = dn + dr (dn "nope" dims, dr rope dims) and value width dv;
// the keys and values of every head come from one compressed latent per token:
//   in_f (N, C)       = in, or all-gathered rows under sequence parallelism
//   q    (N, NHl·Dqk) = in_f·Wqᵀ, or with --q-lora-rank qr: qn = norm(in_f·Wq_downᵀ) (N, qr),
//                       q = qn·Wq_upᵀ                      per head [q_nope (dn) | q_pe (dr)]
//   kva  (N, kr + dr) = in_f·Wkv_downᵀ = [c (kr) | k_pe (dr)]   one k_pe per token, shared by the heads
//   kv   (N, NHl·(dn + dv)) = norm(c)·Wkv_upᵀ                  per head [k_nope (dn) | v (dv)]
//   q_pe, k_pe ← rope (rotate-half over the dr dims; DeepSeek's interleaved pairs are permuted at
//                the Hugging Face boundary, model/families/deepseek.cpp)
//   att  (N, NHl·dv)  = attention([q_nope|q_pe], [k_nope|k_pe], v)   causal, scale Dqk^−½ × YaRN's mscale²
//   out  (Nl, C)      = reduce(att·Woᵀ)
// Tensor parallelism splits the heads (q / q_up and kv_up by rows, the output by columns); the
// down-projections and their norms are replicated, as Megatron does: their output gradients are the
// sums over the ranks' heads (all-reduced), and their input gradient is added once (TP rank 0).
// Backward in two parts as every sublayer: the input part now, the weight GEMMs and the latent norms'
// weight gradients to `defer`.
#pragma once
#include <cstdint>
#include <memory>
#include <vector>

#include "model/layers/norm.h"
#include "model/layers/sublayer.h"
#include "tensor/rope.h"

namespace mpitron {

struct MlaSpec {
  int64_t heads = 0;           // NH
  int64_t q_lora_rank = 0;     // qr; 0: a plain query projection
  int64_t kv_lora_rank = 0;    // kr
  int64_t qk_nope = 0, qk_rope = 0, v_dim = 0;  // dn, dr, dv
  RopeArgs rope_args{};        // over the dr rope dims (percent 1)
  float scale = 0.0f;          // the scores' scale
  NormSpec latent_norm{};      // the two latent RMSNorms
  int64_t qk_dim() const { return qk_nope + qk_rope; }  // Dqk
  int64_t local_heads(const TensorParallel& tp) const { return heads / tp.size; }
};

struct MlaActs final : SublayerActs {
  Tensor in;               // (Nl, C)
  Tensor qa, qn;           // (N, qr) the query latent before and after its norm (q_lora_rank > 0)
  NormActs qa_norm;
  Tensor c, cn;            // (N, kr) the key/value latent before and after its norm (contiguous)
  NormActs c_norm;
  Tensor q, k, v;          // (N, NHl, Dqk) after rope, (N, NHl, Dqk) after rope, (N, NHl, dv)
  Tensor att, lse;         // (N, NHl·dv), (B, NHl, T) f32
};

class MultiLatentAttention final : public Sublayer {
 public:
  MultiLatentAttention(const MlaSpec& spec, int64_t layer, int64_t hidden) : spec_(spec), layer_(layer), hidden_(hidden) {}
  const MlaSpec& spec() const { return spec_; }
  const char* kind() const override { return "self_attention"; }
  void rows(std::vector<ParamSpec>& rows) const override;
  Tensor forward(const BlockShape& s, const BlockParams& p, const Tensor& in, std::unique_ptr<SublayerActs>& acts,
                 uint64_t seed) const override;
  Tensor backward(const BlockShape& s, const BlockParams& p, const SublayerActs& acts, const Tensor& dout,
                  uint64_t seed, WeightGradWork* defer) const override;
  void memory(const BlockShape& s, BlockMemory& m) const override;
  double attention_flops_per_token(int64_t seq) const override;
  // The latent cache: kr + dr values per token per layer, on every TP rank (replicated).
  int64_t kv_elements_per_token(const TensorParallel& tp) const override;

 private:
  // Decoding over the latent KV cache (s.core a decoding core), the up-projections absorbed.
  Tensor decode(const BlockShape& s, const BlockParams& p, const Tensor& in) const;

  MlaSpec spec_;
  int64_t layer_, hidden_;
};

}  // namespace mpitron
