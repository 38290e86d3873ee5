// model/layers/mlp_layer.h — the MLP sublayer of a block, of any MlpKind (model/config.h),
// dense or a Mixture of Experts (s.moe.active(): model/layers/moe_layer.h, same entry points).
//
//   in   (Nl, C)   the norm output (this rank's rows)
//   in_f (N, C)    = in, or all-gathered rows under sequence parallelism
//   fc   (N, FCl)  = in_f · Wfcᵀ + bfc       FCl = Fl (GELU) or 2·Fl = [gate | up] (gated kinds),
//                                            this rank's slice of each half
//   g    (N, Fl)   = act(fc): gelu (tanh or erf form), relu, silu(gate)·up (SwiGLU) or gelu(gate)·up (GeGLU)
//   out  (Nl, C)   = reduce(g · Wprojᵀ + bproj)   bproj added by TP rank 0 only
// Backward in two parts as in attention_layer.h.
#pragma once
#include <memory>
#include <vector>

#include "autograd/tape.h"
#include "model/layers/block_shape.h"

namespace mpitron {

// An MoE MLP's parameters (model/param_table.h's MoE rows; this rank's TP slices).
struct MoeParams {
  Var router;                                     // (E, C)
  std::vector<Var> fc_w, fc_b, proj_w, proj_b;    // per expert (FCel, C), (FCel), (C, Fel), (C); biases may be empty
  Var shared_fc, shared_proj, shared_gate;        // (FCsl, C), (C, Fsl), (1, C); undefined: none
  Tensor expert_bias;                             // (E) f32 selection-only bias (BlockParams::expert_bias); may be undefined
};

struct MlpParams {
  Var fc_w, fc_b;      // (FC·t, C), bias may be undefined
  Var proj_w, proj_b;  // (C, F) split by columns, bias may be undefined
  MoeParams moe;       // an MoE layer's (then fc_w … are undefined)
};

struct MoeActs;  // model/layers/moe_layer.h

struct MlpActs {
  Tensor in, fc, g;  // in (Nl, C), fc (N, FCl), g (N, Fl)
  std::shared_ptr<MoeActs> moe;  // an MoE layer's
};

Tensor mlp_layer_forward(const BlockShape& s, const MlpParams& p, const Tensor& in, MlpActs& a);
// dout (Nl, C) → d(in) (Nl, C). defer null: the weight part runs now.
Tensor mlp_layer_backward(const BlockShape& s, const MlpParams& p, const MlpActs& a, const Tensor& dout,
                          WeightGradWork* defer);

// The activation of an MLP kind, for the dense and the MoE MLPs: g = act(fc) (fc (R, FC), g (R, F)); and
// its backward dg (R, F) → dfc (R, FC) (dg itself, overwritten, for the ungated kinds).
void activation_forward(MlpKind k, const Tensor& fc, const Tensor& g);
Tensor activation_backward(MlpKind k, const Tensor& dg, const Tensor& fc);
// The dense MLP on the gathered rows, without the TP reduction (the MoE layer's shared
// experts use it with s.ffn = Fs): in_f (N, C) → this rank's partial (N, C); a.fc, a.g saved.
Tensor mlp_core_forward(const BlockShape& s, const MlpParams& p, const Tensor& in_f, MlpActs& a);
// dout_f (N, C) → this rank's partial d(in_f) (N, C); the weight part to defer, reading
// gather_rows(s, in) (in: the forward's input rows; a shape without sequence parallelism
// takes in_f itself).
Tensor mlp_core_backward(const BlockShape& s, const MlpParams& p, const MlpActs& a, const Tensor& in,
                         const Tensor& dout_f, WeightGradWork* defer);

}  // namespace mpitron
