// model/layers/norm.h — the block's normalisation sublayer: LayerNorm or RMSNorm.
//
//   out (Nl, C) = norm(x (Nl, C)) · w (+ b for LayerNorm); with one_plus (Megatron's
//                 --apply-layernorm-1p, Gemma's RMSNorm) · (1 + w), the sum in f32 then
//                 rounded to w's dtype, and dw the same Σ dout·x̂
//   saved: mean (Nl) (LayerNorm only), rstd (Nl), f32
// Backward in two parts: input (dx += norm'ᵀ·dout) and weight (dw, db +=), so a
// split backward can run the second later. With sequence parallelism the weight
// gradients are partial sums over this rank's rows (the block all-reduces them).
#pragma once
#include "autograd/variable.h"
#include "model/config.h"

namespace mpitron {

// A norm's settings (one per norm of a layer; model/layers/layer_spec.h).
struct NormSpec {
  Normalization kind = Normalization::LayerNorm;
  float eps = 1e-5f;      // --layernorm-epsilon / --norm-epsilon
  bool one_plus = false;  // scale by (1 + w) (--apply-layernorm-1p; Gemma)
};

struct NormParams {
  Var w, b;               // (C), (C) or undefined (RMSNorm)
  bool one_plus = false;  // scale by (1 + w)
};
// The scale the norm multiplies by: w, or a new (C) tensor 1 + w.
Tensor norm_scale(const NormParams& p);

struct NormActs {
  Tensor mean, rstd;  // (Nl) f32; mean undefined for RMSNorm
};

void norm_forward(Normalization kind, float eps, const NormParams& p, const Tensor& x, const Tensor& out, NormActs& a);
// dx (Nl, C) += norm'ᵀ·dout.
void norm_backward_input(Normalization kind, const NormParams& p, const Tensor& x, const NormActs& a,
                         const Tensor& dout, const Tensor& dx);
// dw (C) += Σ dout·x̂, db (C) += Σ dout (db undefined for RMSNorm).
void norm_backward_weight(Normalization kind, const NormParams& p, const Tensor& x, const NormActs& a,
                          const Tensor& dout, const Tensor& dw, const Tensor& db);

}  // namespace mpitron
