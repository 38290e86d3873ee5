// parallel/flat_optimizer.h — the one optimizer step of every way model states are held
// (model/training/model_states.h): the optimizer state of a slice [begin, end)
// of the flat parameter buffer, and the step's norm / clip / skip decision. What the
// update itself does is --optimizer's rule (parallel/update_rule.h: adam, sgd).
//
// Replicated training holds the slice [0, N); ZeRO-1/2/3 the rank's shard
// (parallel/zero.h, ShardLayout). Per slice:
//   master (n) f32 — a view of the compute-dtype values when they are f32, else a copy
//   m, v   (n) f32 — the rule's states (adam: exp_avg, exp_avg_sq; sgd: m the momentum
//                    buffer, v undefined)
// and the weight-decay segments of the parameters crossing it. One step:
//   1. Σg² of the gradients the slice owns (add_sum_squares: only the parameters
//      counted in the norm), summed over the rank's groups (reduced_step does both);
//   2. step(): the unscaled norm, the veto, non-finite → skipped, clipping as
//      torch.nn.utils.clip_grad_norm_, then the rule once per segment (AdamW:
//      tensor/adamw.h's fused kernel), writing the new master and the compute-dtype copy.
// With cpu_offload and device values, master / m / v live in host memory: step()
// copies the slice's gradients to the host (one device-to-host copy), runs the CPU
// kernel (OpenMP over all cores) and copies the compute-dtype values back (one
// host-to-device copy); the copies are not overlapped with the update yet.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "parallel/data_parallel.h"
#include "parallel/update_rule.h"

namespace mpitron {

struct OptimizerConfig {
  std::string optimizer = "adam";  // --optimizer adam | sgd | muon | dist_muon (parallel/update_rule.h)
  float sgd_momentum = 0.9f;   // --sgd-momentum (sgd)
  // Muon (--optimizer muon | dist_muon: parallel/muon_rule.cpp), Megatron-Core's flags and defaults.
  float muon_momentum = 0.95f;               // --muon-momentum
  bool muon_nesterov = false;                // --muon-use-nesterov (--muon-nesterov)
  bool muon_split_qkv = true;                // --muon-no-split-qkv turns it off: q, k, v orthogonalised apart
  std::string muon_scale_mode = "spectral";  // --muon-scale-mode spectral | unit_rms_norm | shape_scaling
  std::string muon_matmul_prec = "medium";   // --muon-fp32-matmul-prec: medium (bf16 operands) | high (f32)
  int muon_ns_steps = 5;                     // --muon-num-ns-steps
  std::string muon_coefficients = "quintic"; // --muon-coefficient-type (parallel/newton_schulz.h)
  std::string muon_tp_mode = "blockwise";    // --muon-tp-mode blockwise | duplicated
  float muon_extra_scale = 1.0f;             // --muon-extra-scale-factor
  Communicator* tp = nullptr;  // the tensor-parallel group (muon's duplicated mode); set by the runtime
  float beta1 = 0.9f;          // --adam-beta1
  float beta2 = 0.999f;        // --adam-beta2
  float eps = 1e-8f;           // --adam-eps
  float weight_decay = 0.01f;  // --weight-decay (not applied to biases and layernorm parameters); a
                               //   schedule sets each step's (set_weight_decay)
  float clip_grad = 1.0f;      // --clip-grad: max global L2 norm; 0 disables clipping
  // --optimizer-cpu-offload (DeepSpeed's offload_optimizer: {device: cpu}): the master
  // weights and moments in host memory, the update on the CPU (all cores), the gradients
  // copied there and the new values back. Nothing moves when the values are on the CPU.
  bool cpu_offload = false;
};

struct StepResult {
  double grad_norm = 0;  // global L2 norm of the unscaled gradients, before clipping
  bool skipped = false;  // gradients were not finite (or vetoed): parameters unchanged
};

class FlatOptimizer {
 public:
  FlatOptimizer() = default;
  // values: (end - begin) compute dtype, the slice's values (the master is a view of
  // them when f32); params: every parameter of the flat buffer, in order.
  FlatOptimizer(const Tensor& values, int64_t begin, const std::vector<FlatParam>& params, const OptimizerConfig& cfg);

  int64_t begin() const { return begin_; }
  int64_t end() const { return begin_ + master_.numel(); }
  // sq (1) f32 += Σg² over the slice's gradients (end - begin) of the parameters counted
  // in the norm (FlatParam::in_norm).
  void add_sum_squares(const Tensor& grads, const Tensor& sq) const;
  // One update from the slice's gradients (scaled by `unscale`: the loss scale, times
  // dp when they are dp sums) given the reduced squared norm of all of them.
  // veto(grad_norm) true skips the update (every rank must decide alike).
  StepResult step(const Tensor& grads, double scaled_sq_norm, double unscale, float lr,
                  const std::function<bool(double)>& veto = {});
  // The whole step of a rank's slice: Σg² summed over `dp` (the slice holds dp sums of
  // gradients: the 1/dp of the average is folded in; null: replicated gradients) and over
  // `norm_group` (model-parallel ranks; may be null), then step(). average: the sums are over
  // that many data-parallel ranks (0: dp's size; expert parallelism shards over edp < dp).
  StepResult reduced_step(const Tensor& grads, Communicator* dp, Communicator* norm_group, float loss_scale,
                          float lr, const std::function<bool(double)>& veto = {}, int average = 0);
  // After loading master weights: round them into the compute-dtype values.
  void sync_values_from_master();
  // The weight decay of the next steps (the schedule's, --weight-decay-incr-style).
  void set_weight_decay(float wd) { cfg_.weight_decay = wd; }

  const Tensor& master() const { return master_; }      // (n) f32
  const Tensor& exp_avg() const { return m_; }          // (n) f32: the rule's first state (sgd: momentum)
  const Tensor& exp_avg_sq() const { return v_; }       // (n) f32: its second (undefined for sgd)
  const char* optimizer() const { return rule_->name(); }  // --optimizer: what checkpoints record
  const Tensor& values() const { return values_; }      // (n) compute dtype
  int64_t steps_taken() const { return step_; }
  void set_steps_taken(int64_t s) { step_ = s; }
  const OptimizerConfig& config() const { return cfg_; }

 private:
  struct Segment {
    int64_t begin, end;  // slice elements
    bool decay;
    bool in_norm;
    int matrix = -1;  // matrix-wise rules: the one parameter of the run (matrices_), -1: elementwise
  };
  std::vector<FlatParam> matrices_;  // the slice's matrices (matrix-wise rules only)
  OptimizerConfig cfg_;
  std::shared_ptr<const UpdateRule> rule_;
  int64_t begin_ = 0;
  Tensor values_, master_, m_, v_;
  bool separate_master_ = false;
  bool all_in_norm_ = true;
  bool offload_ = false;  // master / m / v on the host, the values on a device
  Tensor host_values_;    // (n) compute dtype on the host: the update's rounded copy (offload, 16-bit)
  std::vector<Segment> segments_;
  int64_t step_ = 0;
};

}  // namespace mpitron
