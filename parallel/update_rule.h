// parallel/update_rule.h — what an optimizer does to one run of parameters, given their
// (clipped, unscaled) gradients: the part of a step that differs between optimizers.
// parallel/flat_optimizer.h runs the rest (the norm, the veto, clipping, the weight-decay
// segments, offload) the same for every rule, so every way of holding model states
// (model/training/model_states.h) gets every optimizer; a new optimizer is a row of
// update_rules() below, nothing else.
//
//   adam  torch.optim.AdamW (decoupled weight decay; Megatron's --optimizer adam):
//         states exp_avg, exp_avg_sq (tensor/adamw.h's fused kernel)
//   sgd   torch.optim.SGD with momentum, dampening 0, no Nesterov, and L2 weight decay
//         added to the gradient (Megatron's --optimizer sgd, --sgd-momentum):
//           d = g + wd·p;  buf = momentum·buf + d  (buf = d at the first step);  p -= lr·buf
//         state momentum_buffer
//   muon  Megatron-Core's Muon (--optimizer muon | dist_muon; parallel/muon_rule.cpp): each 2-D weight's
//         momentum orthogonalised by Newton–Schulz, the rest (embeddings, output layer, norms, biases)
//         on AdamW; states exp_avg (muon: the momentum buffer) and exp_avg_sq (AdamW's only)
// Each state is one (n) f32 tensor per slice; checkpoints store state i of parameter P
// as optim/<state_names()[i]>/P (model/checkpoint/checkpointing.h).
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "tensor/tensor.h"

namespace mpitron {

struct OptimizerConfig;
struct FlatParam;

// One step's numbers for a run of parameters.
struct UpdateArgs {
  float lr = 0;
  float weight_decay = 0;  // 0 for the parameters that do not decay
  float grad_scale = 1;    // 1/loss scale (and 1/dp, the clipping coefficient) folded into the gradients
  int64_t step = 1;        // the optimizer's step count, from 1
  // Matrix-wise rules (UpdateRule::matrix_wise): the run is this one parameter, whole; null: a run of
  // parameters without a matrix (FlatParam::rows 0), taken elementwise.
  const FlatParam* param = nullptr;
};

class UpdateRule {
 public:
  virtual ~UpdateRule() = default;
  virtual const char* name() const = 0;  // --optimizer's value: what a checkpoint records
  // The per-element f32 states, in order (at most two: OptimState's exp_avg and exp_avg_sq slots).
  virtual std::vector<std::string> state_names() const = 0;
  // Whether apply() needs each matrix parameter whole in one run (muon: yes; FlatOptimizer then
  // gives it one run per matrix and refuses a slice that cuts one).
  virtual bool matrix_wise() const { return false; }
  // master (n) f32, grad (n) f32/bf16/f16, states[i] (n) f32, copy (n) compute dtype or undefined
  // (receives the new values rounded).
  virtual void apply(const Tensor& master, const Tensor& grad, const std::vector<Tensor>& states, const Tensor& copy,
                     const UpdateArgs& a) const = 0;
};

// Muon (parallel/muon_rule.cpp): a row of the rules' table for muon and dist_muon.
std::unique_ptr<UpdateRule> make_muon_rule(const OptimizerConfig& cfg);

// The rule --optimizer names (cfg.optimizer); an optimizer not built is refused naming it.
std::unique_ptr<UpdateRule> make_update_rule(const OptimizerConfig& cfg);
// The optimizers built, for --optimizer's check and help: "adam", "sgd", "muon", "dist_muon".
std::vector<std::string> built_optimizers();
// An optimizer's state names (checkpoints; {} for one not built).
std::vector<std::string> optimizer_state_names(const std::string& optimizer);

}  // namespace mpitron
