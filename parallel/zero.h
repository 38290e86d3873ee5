// parallel/zero.h — the distributed optimizer: ZeRO-1 / ZeRO-2 (AdamW or SGD, --optimizer) over the
// flat parameter buffer (--use-distributed-optimizer, --zero-stage 1|2).
//
// Every dp rank keeps the whole compute-dtype value buffer (N) but owns only a
// contiguous shard [begin, end) of the optimizer state (ShardLayout: shard =
// ceil(N / dp), the last shard short):
//   master (shard) f32   — a view of the values when they are f32 (as ReplicatedOptimizer)
//   m, v   (shard) f32
// One step:
//   1. gradients are reduce-scattered (summed over dp; the 1/dp is folded into the update) to their owners in
//      buckets (GradBuckets, overlapped with backward);
//   2. the global grad norm = sqrt(all-reduce over dp [and the model-parallel
//      group, when given] of each shard's Σg²); non-finite → step skipped on
//      every rank; clipping as torch.nn.utils.clip_grad_norm_;
//   3. the update (parallel/flat_optimizer.h, the one every way of holding states uses) on the
//      shard, writing the new master and compute-dtype copy;
//   4. the values are all-gathered in place (all_gather_v: the shards are uneven).
//      With overlap_param_gather (--overlap-param-gather, Megatron's) step() only
//      starts them, one all-gather per bucket (the gradient buckets' ranges), and
//      the next forward waits for each bucket right before it reads it
//      (params_needed, ForwardOptions::params_needed), so the gathers overlap the
//      forward. Buckets are gathered in the order the last forward needed them
//      (ascending offsets before any forward): the same on every dp rank.
// The math equals ReplicatedOptimizer on the dp-averaged gradients up to the f32
// summation order of the reductions (tests/parallel/test_zero.cpp: 1e-6 rel).
//
// Gradients are reduced as SUMS into the owned slice of the flat f32 grad
// buffer itself (in place: no shard buffer), and the 1/dp of the average is
// folded into AdamW's grad_scale and the norm.
// Stage 1: gradients accumulate over micro-batches in the full buffer and are
// reduce-scattered once, during the last micro-batch's backward.
// Stage 2: every micro-batch's gradients are reduce-scattered right after its
// backward (added into the owned slice, which holds the running sum), then the
// rest of the buffer is zeroed: between micro-batches the only gradient state
// is the shard, and the non-owned part is scratch for one backward.
// Memory: ParamSet owns ONE full f32 grad buffer, so today both stages hold
// 4·N gradient bytes (stage 2's non-owned part is scratch for one backward: what a
// bucket-sized scratch would save once ParamSet can release its grad buffer between
// micro-batches). model/memory.h prints each rank's bytes.
#pragma once
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "parallel/data_parallel.h"
#include "parallel/flat_optimizer.h"

namespace mpitron {

// ZeRO-3's knobs (DeepSpeed's names; its units are the model's blocks,
// model/training/states_zero3.cpp).
struct Zero3Config {
  bool prefetch = true;               // stage3_prefetch_bucket_size > 0: gather the next block while one runs
  int64_t persistence_threshold = 0;  // stage3_param_persistence_threshold: blocks this small stay gathered
  int64_t max_live_parameters = 0;    // stage3_max_live_parameters: at most this many gathered block elements
                                      // (0: no limit; below two blocks the prefetch is off, below one refused)
};

struct ZeroConfig {
  int stage = 1;                      // --zero-stage: 1 (= --use-distributed-optimizer) or 2
  OptimizerConfig optim;              // --optimizer, its hyper-parameters and --clip-grad
  DDPConfig ddp;                      // bucket size, overlap (averaging is always on)
  bool overlap_param_gather = false;  // --overlap-param-gather: step() leaves the all-gathers in flight
};

class ZeroOptimizer {
 public:
  // values: (N) compute dtype, grads: (N) f32 (ParamSet's flat buffers, same
  // device as dp expects); params: every parameter's slice in ParamSet order.
  // norm_group: when given (the model-parallel group with TP/PP), the squared
  // norm is also summed over it. Collective over dp.
  ZeroOptimizer(const Tensor& values, const Tensor& grads, std::vector<FlatParam> params, Communicator& dp,
                const ZeroConfig& cfg, Communicator* norm_group = nullptr);
  ~ZeroOptimizer();

  // ---- hooks the trainer calls around each micro-batch ----
  // Zero the gradient buffer (start of a step).
  void zero_grad();
  // Before micro-batch k's backward; last = k is the step's last micro-batch.
  void begin_micro_batch(bool last);
  // From backward: parameter i's gradient is final for this micro-batch.
  void mark_ready(size_t param_index) { buckets_->mark_ready(param_index); }
  // After the tape finished. Stage 2: waits for this micro-batch's reductions
  // (summed into the owned slice) and zeroes the rest of the buffer.
  void on_backward_done();

  // Waits for outstanding reductions (when no hook ran since zero_grad(), first
  // reduces the whole accumulated buffer, so hook-less use is correct, just not
  // overlapped), then one optimizer update with learning rate
  // lr (gradients divided by loss_scale), then all-gathers the values.
  // veto: as ReplicatedOptimizer::step (given the unscaled grad norm; true skips the update).
  StepResult step(float lr, float loss_scale, const std::function<bool(double)>& veto = {});

  // ---- the parameter all-gather (overlap_param_gather) ----
  // The forward is about to read parameters [first, end) (ParamSet order): waits for
  // the all-gathers of the buckets holding them. Without overlap: nothing to wait for.
  void params_needed(size_t first, size_t end);
  // For ForwardOptions::params_needed: empty without overlap_param_gather.
  std::function<void(size_t, size_t)> params_hook();
  // Waits for every all-gather still in flight: before anything but the training
  // forward reads the values (evaluation, a checkpoint, the end of the run).
  void finish_param_gather();

  // ---- state (checkpoints: a rank writes/reads its hyperslab [shard_begin, shard_end)) ----
  const ShardLayout& layout() const { return layout_; }
  int64_t shard_begin() const { return layout_.begin(dp_.rank()); }
  int64_t shard_end() const { return layout_.end(dp_.rank()); }
  const Tensor& master_shard() const { return adam_.master(); }         // (shard) f32
  const Tensor& exp_avg_shard() const { return adam_.exp_avg(); }        // (shard) f32
  const Tensor& exp_avg_sq_shard() const { return adam_.exp_avg_sq(); }  // (shard) f32 (sgd: undefined)
  const char* optimizer() const { return adam_.optimizer(); }            // --optimizer
  const Tensor& grad_shard() const { return shard_grads_; }  // (shard) f32 dp-SUM, valid after step()
  int64_t steps_taken() const { return adam_.steps_taken(); }
  void set_steps_taken(int64_t s) { adam_.set_steps_taken(s); }
  // After loading master shards: round them into the values and all-gather.
  void sync_values_from_master();
  void set_weight_decay(float wd) { adam_.set_weight_decay(wd); }  // for the next steps
  const ZeroConfig& config() const { return cfg_; }
  // Expert parallelism (before the first step): the ZeroOptimizer was built over groups.edp;
  // the dense gradients are summed over groups.ep too and the average is over ep × edp.
  void set_expert_groups(const ExpertGroups& groups) {
    buckets_->set_expert_groups(groups);
    experts_ = groups;
    dense_ = groups.active() ? dense_runs(params_) : std::vector<std::pair<int64_t, int64_t>>{};
  }
  GradBuckets& buckets() { return *buckets_; }

 private:
  void all_gather_values();
  void start_param_gather();

  Tensor values_, grads_;
  std::vector<FlatParam> params_;
  Communicator& dp_;
  Communicator* norm_group_;
  ExpertGroups experts_;                            // expert parallelism (inactive: none)
  std::vector<std::pair<int64_t, int64_t>> dense_;  // its dense runs (dense_runs)
  ZeroConfig cfg_;
  ShardLayout layout_;
  FlatOptimizer adam_;  // the shard's master weights and moments
  Tensor shard_grads_;
  std::unique_ptr<GradBuckets> buckets_;
  bool reduced_ = false;  // a reduction ran since zero_grad() (else step() reduces the buffer itself)
  struct Gather {
    int64_t begin = 0, end = 0;  // elements of the flat value buffer (a gradient bucket's range)
    WorkPtr work;                // in flight until the forward needs it
  };
  std::vector<Gather> gathers_;          // ascending offsets
  std::vector<size_t> gather_order_;     // gathers_ indices in the order the last forward needed them
  std::vector<size_t> needed_order_;     // this forward's order so far
};

}  // namespace mpitron
