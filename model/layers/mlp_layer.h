// model/layers/mlp_layer.h — the dense MLP sublayer of a block (model/layers/sublayer.h), of any
// MlpKind (model/config.h). The Mixture-of-Experts MLP is its own sublayer (moe_layer.h), which
// runs this one's core for its shared experts.
//
//   in   (Nl, C)   the norm output (this rank's rows)
//   in_f (N, C)    = in, or all-gathered rows under sequence parallelism
//   fc   (N, FCl)  = in_f · Wfcᵀ + bfc       FCl = Fl (GELU, ReLU) or 2·Fl = [gate | up] (gated kinds),
//                                            this rank's slice of each half
//   g    (N, Fl)   = act(fc): gelu (tanh or erf form), relu, silu(gate)·up (SwiGLU) or gelu(gate)·up (GeGLU)
//   out  (Nl, C)   = reduce(g · Wprojᵀ + bproj)   bproj added by TP rank 0 only
// Backward in two parts as in attention_layer.h.
#pragma once
#include <memory>
#include <vector>

#include "model/layers/sublayer.h"

namespace mpitron {

// A dense MLP's settings.
struct MlpSpec {
  MlpKind kind = MlpKind::GeluTanh;
  int64_t ffn = 0;    // F (global, before the TP split)
  bool bias = false;  // biases on both linears
  int64_t local_ffn(const TensorParallel& tp) const { return ffn / tp.size; }  // Fl
  int64_t local_fc(const TensorParallel& tp) const { return (mlp_gated(kind) ? 2 : 1) * local_ffn(tp); }
};

// The two linears of a dense MLP (the dense sublayer's by role, or the shared experts').
struct MlpParams {
  Var fc_w, fc_b;      // (FC·t, C), bias may be undefined
  Var proj_w, proj_b;  // (C, F) split by columns, bias may be undefined
};

struct MlpActs final : SublayerActs {
  Tensor in, fc, g;  // in (Nl, C), fc (N, FCl), g (N, Fl)
};

class DenseMlp final : public Sublayer {
 public:
  DenseMlp(const MlpSpec& spec, int64_t layer, int64_t hidden) : spec_(spec), layer_(layer), hidden_(hidden) {}
  const MlpSpec& spec() const { return spec_; }
  const char* kind() const override { return "mlp"; }
  void rows(std::vector<ParamSpec>& rows) const override;
  Tensor forward(const BlockShape& s, const BlockParams& p, const Tensor& in, std::unique_ptr<SublayerActs>& acts,
                 uint64_t seed) const override;
  Tensor backward(const BlockShape& s, const BlockParams& p, const SublayerActs& acts, const Tensor& dout,
                  uint64_t seed, WeightGradWork* defer) const override;
  void memory(const BlockShape& s, BlockMemory& m) const override;

 private:
  MlpSpec spec_;
  int64_t layer_, hidden_;
};

// The activation of an MLP kind, for the dense and the MoE MLPs: g = act(fc) (fc (R, FC), g (R, F)); and
// its backward dg (R, F) → dfc (R, FC) (dg itself, overwritten, for the ungated kinds).
void activation_forward(MlpKind k, const Tensor& fc, const Tensor& g);
Tensor activation_backward(MlpKind k, const Tensor& dg, const Tensor& fc);
// The dense MLP on the gathered rows, without the TP reduction (the MoE layer's shared
// experts use it with their own width): in_f (N, C) → this rank's partial (N, C); a.fc, a.g saved.
Tensor mlp_core_forward(const BlockShape& s, const MlpSpec& m, const MlpParams& p, const Tensor& in_f, MlpActs& a);
// dout_f (N, C) → this rank's partial d(in_f) (N, C); the weight part to defer, reading in_f (the
// forward's gathered input rows).
Tensor mlp_core_backward(const BlockShape& s, const MlpSpec& m, const MlpParams& p, const MlpActs& a,
                         const Tensor& in_f, const Tensor& dout_f, WeightGradWork* defer);

}  // namespace mpitron
