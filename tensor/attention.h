// tensor/attention.h — causal scaled-dot-product self-attention over a fused QKV.
//
//   qkv: (B, T, 3, NH, HD) — the fused QKV projection output (B, T, 3·C), C = NH·HD:
//        Q, then K, then V, each with heads contiguous.
//   out: (B, T, NH, HD)  = softmax(Q·Kᵀ·scale, causal) · V  per (batch, head)
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
// dqkv (B, T, 3, NH, HD): overwritten.
void attention_backward(const Tensor& dout, const Tensor& qkv, const Tensor& out, const Tensor& lse,
                        const Tensor& dqkv, float scale, Stream s = Stream());

// Which implementation attention_* uses on CUDA right now ("cudnn" or "cublas").
std::string cuda_attention_backend();
// Force the cuBLAS + softmax path (tests compare the two).
void cuda_attention_force_fallback(bool on);

}  // namespace mpitron
