// model/training/lr_schedule.h — learning-rate schedule and batch-size ramp-up (Megatron's semantics).
//
// LR: linear warmup from 0 to lr over warmup_steps, then decay to min_lr over
// [warmup_steps, decay_steps] (cosine, linear or constant), min_lr afterwards.
// A "step" is an iteration, or a sample when the run is specified in samples
// (--train-samples with --lr-decay-samples / --lr-warmup-samples).
#pragma once
#include <cstdint>
#include <string>

namespace mpitron {

struct LRScheduleConfig {
  float lr = 1e-4f;             // --lr: peak learning rate
  float min_lr = 0.0f;          // --min-lr
  std::string style = "linear"; // --lr-decay-style: constant | linear | cosine
  int64_t warmup_steps = 0;     // from --lr-warmup-iters / -samples / -fraction
  int64_t decay_steps = 0;      // from --lr-decay-iters / -samples (default: the whole run)
};

class LRSchedule {
 public:
  explicit LRSchedule(const LRScheduleConfig& c);
  float lr_at(int64_t step) const;
  const LRScheduleConfig& config() const { return c_; }

 private:
  LRScheduleConfig c_;
};

// --rampup-batch-size START INCREMENT SAMPLES: the global batch grows from
// START by INCREMENT in equal steps over SAMPLES consumed samples.
class BatchRampup {
 public:
  BatchRampup(int64_t global_batch, int64_t micro_batch, int64_t data_parallel);  // no ramp-up
  BatchRampup(int64_t start, int64_t increment, int64_t ramp_samples, int64_t global_batch, int64_t micro_batch,
              int64_t data_parallel);
  int64_t global_batch(int64_t consumed_samples) const;
  int64_t num_micro_batches(int64_t consumed_samples) const;

 private:
  int64_t start_, increment_, ramp_samples_, final_, micro_, dp_;
  bool ramp_ = false;
};

}  // namespace mpitron
