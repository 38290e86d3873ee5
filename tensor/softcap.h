// tensor/softcap.h — logit soft-capping, Gemma 2's final_logit_softcapping (HF Gemma2ForCausalLM:
// logits = cap·tanh(logits/cap) between the LM head and the loss).
//
//   out = cap·tanh(x/cap)               (|out| < cap; ≈ x for |x| ≪ cap)
//   dx  = dout·(1 − (out/cap)²)         (tanh' = 1 − tanh², from the SAVED output)
// x, out, dout, dx: same shape and dtype (f32, bf16, f16), contiguous; math in f32, rounded
// once. cap: finite and > 0. out may alias x; dx may alias dout. The backward reads out as
// stored: in bf16, where |out| nears cap, 1 − (out/cap)² carries out's rounding (an absolute
// error up to ~2·2⁻⁹ on a factor ≤ 1), as a bf16 autograd graph that saves the output would.
// (The attention scores' soft-capping is AttentionMask::softcap / AttentionBlock::softcap.)
#pragma once
#include "tensor/tensor.h"

namespace mpitron {

void softcap_forward(const Tensor& x, const Tensor& out, float cap, Stream s = Stream());
// dx = dout·(1 − (out/cap)²)  (overwritten)
void softcap_backward(const Tensor& dout, const Tensor& out, const Tensor& dx, float cap, Stream s = Stream());

}  // namespace mpitron
