// model/training/optimizer.h — the optimizer (--optimizer: AdamW or SGD) over the whole flat
// parameter buffer (one process, or replicated over data parallelism): parallel/flat_optimizer.h over [0, N),
// with the grad norm summed over the model-parallel group. (fp16's loss scaler:
// model/checkpoint/loss_scaler.h.)
//
// With f32 compute the master weights ARE the parameter values; with bf16/f16
// compute a separate f32 master copy is updated and rounded into the values.
// Gradients arrive in the flat f32 grad buffer multiplied by the loss scale.
#pragma once
#include <cstdint>
#include <functional>
#include <vector>

#include "model/checkpoint/loss_scaler.h"  // LossScaler: its state is in every checkpoint
#include "model/params.h"
#include "parallel/flat_optimizer.h"

namespace mpitron {

class Communicator;

// Every parameter's slice of the flat buffers (parallel/data_parallel.h's view of a ParamSet).
std::vector<FlatParam> flat_params(const ParamSet& params);

class ReplicatedOptimizer {
 public:
  // norm_group: with tensor/pipeline parallelism, the model-parallel group over
  // which the squared grad norm is summed (each rank counts only its canonical
  // parameters, ParamInfo::canonical).
  ReplicatedOptimizer(ParamSet& params, const OptimizerConfig& cfg, Communicator* norm_group = nullptr);

  // One update with learning rate lr; grads are divided by loss_scale. A
  // non-finite gradient norm skips the update; so does `veto` returning true
  // when given the (unscaled, unclipped) grad norm. Every rank of the norm
  // group calls step and veto (a veto may run collectives; it must decide the
  // same on every rank).
  StepResult step(float lr, float loss_scale, const std::function<bool(double)>& veto = {});

  int64_t steps_taken() const { return adam_.steps_taken(); }
  void set_steps_taken(int64_t s) { adam_.set_steps_taken(s); }
  const Tensor& master() const { return adam_.master(); }  // (numel) f32
  const Tensor& exp_avg() const { return adam_.exp_avg(); }      // (numel) f32 (sgd: the momentum buffer)
  const Tensor& exp_avg_sq() const { return adam_.exp_avg_sq(); }  // (numel) f32 (sgd: undefined)
  const char* optimizer() const { return adam_.optimizer(); }     // --optimizer
  // After loading master weights: round them into the compute-dtype values.
  void sync_values_from_master() { adam_.sync_values_from_master(); }
  void set_weight_decay(float wd) { adam_.set_weight_decay(wd); }  // for the next steps
  const OptimizerConfig& config() const { return adam_.config(); }

 private:
  ParamSet& params_;
  Communicator* norm_group_ = nullptr;
  FlatOptimizer adam_;  // the state of the whole buffer [0, numel)
};

}  // namespace mpitron
