// tensor/attention.h — causal scaled-dot-product self-attention over a fused QKV,
// multi-head (MHA) or grouped-query (GQA: fewer key/value heads than query heads).
//
//   qkv: the fused QKV projection output, per token Q, then K, then V, heads contiguous:
//        (B, T, 3, NH, HD)   MHA: NH heads each (B, T, 3·C), C = NH·HD; or
//        (B, T, NH + 2G, HD) GQA (Megatron's --group-query-attention --num-query-groups G,
//                            HF's num_key_value_heads): NH query heads, then G key heads,
//                            then G value heads. Query head h uses kv group h / (NH/G)
//                            (HF's repeat_kv); NH must be divisible by G. G = NH is MHA
//                            (the same bytes as the 5-D form), G = 1 multi-query attention.
//        NH is out's head count, so G = (qkv.dim(2) − NH)/2 follows from the shapes.
//   out: (B, T, NH, HD)  = softmax(Q_h·K_gᵀ·scale, causal) · V_g  per (batch, head h)
//   lse: (B, NH, T) f32  = log Σ_j exp(score_ij) of each (scaled, masked) row;
//        saved by forward for backward (the flash-attention statistics).
// dtypes: qkv/out/dout/dqkv share f32, bf16 or f16; math in f32.
// CUDA: cuDNN fused flash attention when available (bf16/f16), otherwise a
// cuBLAS + softmax path; CPU: a direct implementation (the reference).
#pragma once
#include "tensor/tensor.h"

namespace mpitron {

void attention_forward(const Tensor& qkv, const Tensor& out, const Tensor& lse, float scale,
                       Stream s = Stream());
// dqkv (qkv's shape): overwritten; dK and dV of a kv group sum over the group's NH/G query heads.
void attention_backward(const Tensor& dout, const Tensor& qkv, const Tensor& out, const Tensor& lse,
                        const Tensor& dqkv, float scale, Stream s = Stream());

// Which implementation attention_* uses on CUDA right now ("cudnn" or "cublas").
std::string cuda_attention_backend();
// Force the cuBLAS + softmax path (tests compare the two).
void cuda_attention_force_fallback(bool on);

}  // namespace mpitron
