// model/layers/moe_layer.h — the Mixture-of-Experts MLP sublayer (Megatron-Core's MoELayer:
// TopKRouter, token permutation, grouped experts, shared experts), a block's MLP sublayer
// (model/layers/sublayer.h) in the layers --num-experts / --moe-layer-freq name. E experts of width Fe, k per
// token; under tensor parallelism every expert is split as the dense MLP (fc column-, proj
// row-parallel: Megatron's expert tensor parallelism = TP), the router replicated.
//
//   in      (Nl, C)            the norm output (this rank's rows)
//   in_f    (N, C)             = in, or all-gathered under sequence parallelism
//   logits  (N, E) f32         = in_f · Wrᵀ (f32)
//   probs, indices (N, k)      the router (tensor/moe_router.h): softmax/sigmoid, top-k, scaling
//   routing                    tokens grouped by expert (tensor/moe_permute.h), capacity dropping
//   xp      (R, C)             = permute(in_f)                 R = kept choices (≤ N·k)
//   xe      (Re, C)            = xp; under expert parallelism the rows of this rank's experts from
//                                every ep rank (parallel/expert_parallel.h's dispatchers)
//   fc      (Re, FCel)         = grouped xe · Wfc_eᵀ + bfc_e    (tensor/grouped_gemm.h)
//   g       (Re, Fel)          = act(fc)
//   ye      (Re, C)            = grouped g · Wproj_eᵀ (+ bproj_e on TP rank 0): this rank's partial
//   yp      (R, C)             = ye, or under EP each row back from its expert's rank
//   out_f   (N, C)             = unpermute(yp, probs) [+ shared(in_f) · sigmoid(in_f · wgᵀ)]
//   out     (Nl, C)            = reduce(out_f)
// Auxiliary losses (MoeRun): the load-balancing loss (Megatron's switch_load_balancing_loss_func)
//   aux = coeff · E / (N² · k) · Σ_e count_e · Σ_n a[n, e]
// (count_e: choices of expert e before capacity, a: the router's aux scores) and the z-loss
//   z = coeff_z · mean_n logsumexp(logits[n])²
// change nothing in the forward: their gradients join d(logits) in the backward at the main
// loss's scale (Megatron's MoEAuxLossAutoScaler), their values go to MoeRun::stats.
// The backward splits as the dense MLP's: the input part now, the weight GEMMs (experts,
// router, gate) to `defer`.
#pragma once
#include <memory>
#include <vector>

#include "model/layers/mlp_layer.h"
#include "model/layers/moe_shape.h"

namespace mpitron {

// An MoE layer's parameters (this rank's TP slices; its experts under EP).
struct MoeParams {
  Var router;                                     // (E, C)
  std::vector<Var> fc_w, fc_b, proj_w, proj_b;    // per expert (FCel, C), (FCel), (C, Fel), (C); biases may be empty
  Var shared_fc, shared_proj, shared_gate;        // (FCsl, C), (C, Fsl), (1, C); undefined: none
  Tensor expert_bias;                             // (E) f32 selection-only bias (BlockParams::expert_bias); may be undefined
  static MoeParams from(const BlockParams& p);
};

struct MoeActs final : SublayerActs {
  Tensor in;                    // (Nl, C) the layer's input
  Tensor logits;                // (N, E) f32
  Tensor probs, indices;        // (N, k) f32, i32
  Tensor dest;                  // (N·k) i32: each choice's row in xp, −1 dropped
  std::vector<int64_t> counts;  // (El) rows per local expert (E without EP)
  std::shared_ptr<const ExpertExchange> exchange;  // EP: the rows' trip to their experts (null: none)
  Tensor aux_weight;            // (E) f32: d aux / d a[n, e] before the loss scale; undefined: no aux loss
  Tensor lse;                   // (N) f32 logsumexp (z-loss); undefined: none
  Tensor xe, fc, g, yp;         // (Re, C), (Re, FCel), (Re, Fel), (R, C)
  MlpActs shared;               // the shared experts' fc and g
  Tensor shared_out;            // (N, C) their partial output (before the gate)
  Tensor gate_logits, gate;     // (N, 1) f32: in_f · wgᵀ and its sigmoid
  Tensor gate_dest;             // (N) i32: 0 … N−1, the gate's one-choice routing (forward and backward)
};

class MoeMlp final : public Sublayer {
 public:
  // mlp: the experts' activation and biases (its ffn unused: the experts' width is moe.ffn).
  MoeMlp(const MoeShape& moe, const MlpSpec& mlp, int64_t layer, int64_t hidden)
      : m_(moe), mlp_(mlp), layer_(layer), hidden_(hidden) {}
  const MoeShape& shape() const { return m_; }
  const char* kind() const override { return "moe"; }
  void rows(std::vector<ParamSpec>& rows) const override;
  Tensor forward(const BlockShape& s, const BlockParams& p, const Tensor& in, std::unique_ptr<SublayerActs>& acts,
                 uint64_t seed) const override;
  Tensor backward(const BlockShape& s, const BlockParams& p, const SublayerActs& acts, const Tensor& dout,
                  uint64_t seed, WeightGradWork* defer) const override;
  void memory(const BlockShape& s, BlockMemory& m) const override;

 private:
  MlpSpec expert_spec() const { return {mlp_.kind, m_.ffn, mlp_.bias}; }
  MlpSpec shared_spec() const { return {mlp_.kind, m_.shared_ffn, false}; }
  MoeShape m_;
  MlpSpec mlp_;
  int64_t layer_, hidden_;
};

}  // namespace mpitron
