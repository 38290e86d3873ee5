// model/training/optimizer.h — AdamW over the flat parameter buffer, with f32 master
// weights, global-norm clipping and overflow detection.
//
// With f32 compute the master weights ARE the parameter values; with bf16/f16
// compute a separate f32 master copy is updated and rounded into the values.
// Gradients arrive in the flat f32 grad buffer multiplied by the loss scale.
#pragma once
#include <cstdint>
#include <functional>
#include <vector>

#include "model/params.h"
#include "tensor/adamw.h"

namespace mpitron {

struct OptimizerConfig {
  float beta1 = 0.9f;          // --adam-beta1
  float beta2 = 0.999f;        // --adam-beta2
  float eps = 1e-8f;           // --adam-eps
  float weight_decay = 0.01f;  // --weight-decay (not applied to biases and layernorm parameters)
  float clip_grad = 1.0f;      // --clip-grad: max global L2 norm; 0 disables clipping
};

struct StepResult {
  double grad_norm = 0;  // global L2 norm of the unscaled gradients, before clipping
  bool skipped = false;  // gradients were not finite: parameters unchanged
};

class Communicator;

class AdamWOptimizer {
 public:
  // norm_group: with tensor/pipeline parallelism, the model-parallel group over
  // which the squared grad norm is summed (each rank counts only its canonical
  // parameters, ParamInfo::canonical).
  AdamWOptimizer(ParamSet& params, const OptimizerConfig& cfg, Communicator* norm_group = nullptr);

  // One update with learning rate lr; grads are divided by loss_scale. A
  // non-finite gradient norm skips the update; so does `veto` returning true
  // when given the (unscaled, unclipped) grad norm. Every rank of the norm
  // group calls step and veto (a veto may run collectives; it must decide the
  // same on every rank).
  StepResult step(float lr, float loss_scale, const std::function<bool(double)>& veto = {});

  int64_t steps_taken() const { return step_; }
  void set_steps_taken(int64_t s) { step_ = s; }
  const Tensor& master() const { return master_; }  // (numel) f32
  const Tensor& exp_avg() const { return m_; }      // (numel) f32
  const Tensor& exp_avg_sq() const { return v_; }   // (numel) f32
  // After loading master weights: round them into the compute-dtype values.
  void sync_values_from_master();
  const OptimizerConfig& config() const { return cfg_; }

 private:
  struct Segment {
    int64_t begin, end;
    bool decay;
  };
  ParamSet& params_;
  OptimizerConfig cfg_;
  Communicator* norm_group_ = nullptr;
  Tensor master_, m_, v_;
  bool separate_master_;
  std::vector<Segment> segments_;
  int64_t step_ = 0;
};

// Megatron's dynamic loss scaler for --fp16 (DynamicGradScaler), or a constant.
struct LossScalerConfig {
  float initial_scale = 4294967296.0f;  // --initial-loss-scale (2^32)
  float min_scale = 1.0f;               // --min-loss-scale
  int64_t window = 1000;                // --loss-scale-window: clean steps before doubling
  int64_t hysteresis = 2;               // --hysteresis: overflows tolerated before halving
  float constant = 0.0f;                // --loss-scale: > 0 means a static scale
};

class LossScaler {
 public:
  LossScaler() : enabled_(false) {}
  explicit LossScaler(const LossScalerConfig& c);
  float scale() const { return enabled_ ? scale_ : 1.0f; }
  void update(bool found_inf);
  // State for checkpoints.
  struct State {
    float scale;
    int64_t growth_tracker, hysteresis_tracker;
  };
  State state() const { return {scale_, growth_tracker_, hysteresis_tracker_}; }
  void set_state(const State& s);
  bool enabled() const { return enabled_; }
  // A static scale, or a dynamic one already at --min-loss-scale: an overflow
  // now cannot be cured by scaling down.
  bool at_minimum() const { return enabled_ && (cfg_.constant > 0 || scale_ <= cfg_.min_scale); }

 private:
  bool enabled_ = true;
  LossScalerConfig cfg_;
  float scale_ = 1.0f;
  int64_t growth_tracker_ = 0, hysteresis_tracker_ = 0;
};

}  // namespace mpitron
