// tensor/gelu.h — GELU, the tanh approximation (as GPT-2 and Megatron's bias_gelu):
//   gelu(x) = 0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³)))
// and the exact form (torch's F.gelu default, HF BERT's hidden_act "gelu"):
//   gelu_erf(x) = x·Φ(x) = 0.5·x·(1 + erf(x/√2))
// The two differ by up to 4.7e-4 (at x ≈ −2.7), enough to matter for fp32 logit
// equality with a checkpoint trained on the other one (TransformerConfig::mlp, MlpKind::GeluErf or GeluTanh, picks).
// x, out, dout, dx: same shape and dtype, contiguous. out may alias x; dx may alias dout.
#pragma once
#include "tensor/tensor.h"

namespace mpitron {

void gelu_forward(const Tensor& x, const Tensor& out, Stream s = Stream());
// dx = dout · gelu'(x)  (overwritten)
void gelu_backward(const Tensor& dout, const Tensor& x, const Tensor& dx, Stream s = Stream());

// The exact (erf) GELU, same contract as above. dx = dout · (Φ(x) + x·φ(x)), φ the normal density.
void gelu_erf_forward(const Tensor& x, const Tensor& out, Stream s = Stream());
void gelu_erf_backward(const Tensor& dout, const Tensor& x, const Tensor& dx, Stream s = Stream());
// Either form: the op TransformerConfig::mlp selects.
inline void gelu_forward(const Tensor& x, const Tensor& out, bool exact, Stream s = Stream()) {
  exact ? gelu_erf_forward(x, out, s) : gelu_forward(x, out, s);
}
inline void gelu_backward(const Tensor& dout, const Tensor& x, const Tensor& dx, bool exact, Stream s = Stream()) {
  exact ? gelu_erf_backward(dout, x, dx, s) : gelu_backward(dout, x, dx, s);
}

}  // namespace mpitron
