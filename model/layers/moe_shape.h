// model/layers/moe_shape.h — what an MoE layer's MLP is (from the configuration) and what
// one run of it does besides (from the trainer): BlockShape::moe.
#pragma once
#include <cstdint>
#include <map>
#include <vector>

#include "tensor/moe_router.h"

namespace mpitron {

// Per-step sums of the MoE layers' losses and routing, for the log line (the trainer
// clears it at a step's start and reads it at its end). Summed over this rank's MoE
// layers and micro-batches; recomputed forwards do not add.
struct MoeStats {
  double aux_loss = 0;  // Σ of the layers' load-balancing losses (times their coefficient)
  double z_loss = 0;    // Σ of the layers' z-losses (times their coefficient)
  int64_t layers = 0;   // the (layer, micro-batch) pairs summed
  std::vector<int64_t> tokens_per_expert;  // (E) choices per expert before capacity, over the layers
  int64_t dropped = 0;  // choices over capacity
  // Per MoE layer (global index → (E) choices before capacity, this rank's tokens): the expert
  // bias's update (--moe-router-enable-expert-bias); filled only when the run updates a bias.
  std::map<int64_t, std::vector<int64_t>> layer_tokens;
  void clear() { *this = MoeStats(); }
};

// The run's MoE settings (Megatron's flags), the same for every MoE layer.
struct MoeRun {
  float aux_loss_coeff = 0.0f;  // --moe-aux-loss-coeff (with --moe-router-load-balancing-type aux_loss)
  float z_loss_coeff = 0.0f;    // --moe-z-loss-coeff
  double capacity_factor = 0;   // --moe-expert-capacity-factor; 0: dropless
  bool drop_by_probs = true;    // --moe-token-drop-policy probs (false: position)
  double expert_bias_update_rate = 0;  // --moe-router-bias-update-rate with --moe-router-enable-expert-bias; 0: no bias
  float loss_scale = 1.0f;      // the main loss's backward seed (loss scale / micro-batches): the auxiliary
                                //   losses' gradients are added at that scale, without changing the forward
  MoeStats* stats = nullptr;    // where the forward adds its losses and counts (null: nowhere)
};

// An MoE layer's settings (its MoeMlp sublayer's, model/layers/moe_layer.h); what a call adds
// (expert parallelism, the run's losses and statistics) is BlockShape::moe (MoeCall).
struct MoeShape {
  int64_t experts = 0;       // E; 0: a dense MLP
  int64_t topk = 2;          // k
  int64_t ffn = 0;           // Fe, each expert's width (before the TP split)
  int64_t shared_ffn = 0;    // Fs, the shared experts' width (0: none)
  bool shared_gate = false;  // sigmoid gate on the shared experts
  MoeScore score = MoeScore::Softmax;
  bool pre_softmax = false;
  float scaling = 1.0f;
  int64_t num_groups = 0, group_topk = 0;  // group-limited routing (0: none)
  int64_t group_score_topk = 0;            // a group's score: its best this-many (0: topk / group_topk)
  bool active() const { return experts > 0; }
};

}  // namespace mpitron
