// tensor/swiglu.h — the gated activations of a gated MLP: SwiGLU (Llama; Megatron's
// `--swiglu`) and GeGLU (Gemma; `--geglu`).
//
//   x (N, 2F) = [a | b]: the fc1 output, split in two halves along the last dim
//               (Megatron: torch.chunk(x, 2, dim=-1)); a = x[:, :F], b = x[:, F:].
//   SwiGLU  out (N, F) = silu(a) · b,   silu(a) = a·σ(a)
//   GeGLU   out (N, F) = gelu(a) · b,   gelu the tanh approximation (tensor/gelu.h; HF's
//           gelu_pytorch_tanh), computed by tensor/cuda/gelu_math.h on both backends
// N is any leading dims flattened (x (B, T, 2F) gives out (B, T, F)). Under tensor
// parallelism each rank's fc1 slice holds its own [a | b] halves, so the op is local.
// Math in f32; out rounded once to x's dtype. x, out, dout, dx share a dtype and are contiguous.
#pragma once
#include "tensor/tensor.h"

namespace mpitron {

void swiglu_forward(const Tensor& x, const Tensor& out, Stream s = Stream());
// dx (N, 2F) (overwritten; may alias x) = [dout·b·silu'(a) | dout·silu(a)],
//   silu'(a) = σ(a)·(1 + a·(1 − σ(a))).  dout: (N, F).
void swiglu_backward(const Tensor& dout, const Tensor& x, const Tensor& dx, Stream s = Stream());
void geglu_forward(const Tensor& x, const Tensor& out, Stream s = Stream());
// dx (N, 2F) (overwritten; may alias x) = [dout·b·gelu'(a) | dout·gelu(a)].
void geglu_backward(const Tensor& dout, const Tensor& x, const Tensor& dx, Stream s = Stream());

}  // namespace mpitron
