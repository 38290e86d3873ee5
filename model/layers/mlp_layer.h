// model/layers/mlp_layer.h — the MLP sublayer of a block, of any MlpKind (model/config.h).
//
//   in   (Nl, C)   the norm output (this rank's rows)
//   in_f (N, C)    = in, or all-gathered rows under sequence parallelism
//   fc   (N, FCl)  = in_f · Wfcᵀ + bfc       FCl = Fl (GELU) or 2·Fl = [gate | up] (gated kinds),
//                                            this rank's slice of each half
//   g    (N, Fl)   = gelu(fc) (tanh or erf form) or silu(gate)·up (SwiGLU)
//   out  (Nl, C)   = reduce(g · Wprojᵀ + bproj)   bproj added by TP rank 0 only
// Backward in two parts as in attention_layer.h.
#pragma once
#include "autograd/tape.h"
#include "model/layers/block_shape.h"

namespace mpitron {

struct MlpParams {
  Var fc_w, fc_b;      // (FC·t, C), bias may be undefined
  Var proj_w, proj_b;  // (C, F) split by columns, bias may be undefined
};

struct MlpActs {
  Tensor in, fc, g;  // in (Nl, C), fc (N, FCl), g (N, Fl)
};

Tensor mlp_layer_forward(const BlockShape& s, const MlpParams& p, const Tensor& in, MlpActs& a);
// dout (Nl, C) → d(in) (Nl, C). defer null: the weight part runs now.
Tensor mlp_layer_backward(const BlockShape& s, const MlpParams& p, const MlpActs& a, const Tensor& dout,
                          WeightGradWork* defer);

}  // namespace mpitron
