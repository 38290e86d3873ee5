// model/layers/attention_spec.h — one layer's self-attention settings, built once from the
// configuration (model/layers/layer_spec.cpp) and read by the sublayer and its core.
#pragma once
#include <cmath>
#include <cstdint>

#include "model/config.h"
#include "model/layers/norm.h"
#include "model/tensor_parallel.h"
#include "tensor/rope.h"

namespace mpitron {

struct AttentionSpec {
  int64_t heads = 0, groups = 0, head_dim = 0;  // NH, G query groups, HD (global)
  AttentionMaskKind mask = AttentionMaskKind::Causal;
  int64_t window = 0;   // SlidingWindow: query i sees keys i − window … i (tensor/attention.h)
  bool rope = false;
  RopeArgs rope_args{};  // this layer's rope (Gemma 3's sliding layers have a base of their own)
  float scale = 0.0f;    // the scores' scale: 1/√HD, or query_pre_attn_scalar^−½ (Gemma 2/3)
  float softcap = 0.0f;  // scores ← softcap·tanh(scores/softcap) before the mask (Gemma 2); 0: none
  QkNorm qk_norm = QkNorm::None;
  NormSpec qk_norm_spec{};  // RMSNorm (Gemma 3: with 1 + w)
  bool qkv_bias = false, proj_bias = false;

  int64_t local_heads(const TensorParallel& tp) const { return heads / tp.size; }    // NHl
  int64_t local_groups(const TensorParallel& tp) const { return groups / tp.size; }  // Gl
  int64_t local_qkv(const TensorParallel& tp) const { return (local_heads(tp) + 2 * local_groups(tp)) * head_dim; }
  int64_t local_att(const TensorParallel& tp) const { return local_heads(tp) * head_dim; }  // Cl
  // The first key a causal query at position p sees (0, or p − window with a sliding window):
  // the KV-cache decoders attend over keys first_key(p) … p.
  int64_t first_key(int64_t p) const { return mask == AttentionMaskKind::SlidingWindow && p > window ? p - window : 0; }
};

}  // namespace mpitron
