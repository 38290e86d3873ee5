// model/layers/cross_attention_layer.h — the cross-attention sublayer (model/layers/sublayer.h) of a
// T5 decoder block (model/t5.h): the decoder's rows query the encoder's output.
//
//   in    (Nl, C)     the norm output (this rank's decoder rows; N/t with sequence parallelism), N = B·Td
//   mem   (Ml, C)     the encoder's output (BlockShape::cross.memory: this rank's rows), M = B·Te
//   q     (N, Cl)     = gather(in) · Wqᵀ (+ bq)          Cl = NHl·HD: this rank's query heads
//   kv    (M, 2·Gl·HD) = gather(mem) · Wkvᵀ (+ bkv)     Gl key heads, then Gl value heads
//   att   (N, Cl)     = attention(q, k, v)               bidirectional; key j of sample b masked when
//                                                        j >= cross.lengths[b] (the encoder's padding)
//   lse   (B, NHl, Td) f32
//   out   (Nl, C)     = reduce(att · Wprojᵀ + bproj)    all-reduce, or reduce-scatter rows (SP);
//                                                        bproj added by TP rank 0 only
// Dropout and the residual belong to the block skeleton (model/block.h). Attention dropout draws
// (seed, cross.attention_offset) with keys numbered i·max(Td, Te) + j (tensor/attention_block.h).
// Backward: returns d(in) (Nl, C) and ADDS d(mem) (Ml, C) into cross.memory_grad: every decoder
// layer reads the same encoder output, so its gradient is the sum over them (model/t5.cpp moves it
// into the encoder's tape). The weight part (dWq, dWkv, dWproj and biases, +=) runs now or is deferred.
// Decoding (model/t5_decode.h) computes kv once per request with cross_attention_kv and passes it as
// cross.kv: every later step's forward reads it instead of projecting mem again (no backward then).
#pragma once
#include <cstdint>
#include <memory>
#include <vector>

#include "model/layers/attention_spec.h"
#include "model/layers/sublayer.h"

namespace mpitron {

struct CrossAttentionActs final : SublayerActs {
  Tensor in, q, kv, att, lse;  // in (Nl, C), q (N, Cl), kv (M, 2·Gl·HD), att (N, Cl), lse (B, NHl, Td)
};

// kv (M, 2·Gl·HD) = gather(mem) · Wkvᵀ (+ bkv) of layer p's cross-attention: what forward computes
// when cross.kv is undefined.
Tensor cross_attention_kv(const BlockShape& s, const BlockParams& p);

class CrossAttention final : public Sublayer {
 public:
  // spec: heads, groups, head_dim, biases (the rest unused: bidirectional, no rope, 1/√HD).
  CrossAttention(const AttentionSpec& spec, int64_t layer, int64_t hidden) : spec_(spec), layer_(layer), hidden_(hidden) {}
  const char* kind() const override { return "cross_attention"; }
  void rows(std::vector<ParamSpec>& rows) const override;
  Tensor forward(const BlockShape& s, const BlockParams& p, const Tensor& in, std::unique_ptr<SublayerActs>& acts,
                 uint64_t seed) const override;
  Tensor backward(const BlockShape& s, const BlockParams& p, const SublayerActs& acts, const Tensor& dout,
                  uint64_t seed, WeightGradWork* defer) const override;
  void memory(const BlockShape& s, BlockMemory& m) const override;

 private:
  AttentionSpec spec_;
  int64_t layer_, hidden_;
};

}  // namespace mpitron
