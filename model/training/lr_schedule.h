// model/training/lr_schedule.h — learning-rate and weight-decay schedules and the
// batch-size ramp-up, as megatron-core's OptimizerParamScheduler computes them.
//
// LR: linear warmup from init_lr to lr over warmup_steps, then by style
//   constant             lr
//   linear / cosine      lr → min_lr over (warmup_steps, decay_steps]
//   inverse-square-root  lr · sqrt(max(warmup, 1)) / sqrt(max(step, 1)), at least min_lr
//   WSD                  lr until the annealing starts at decay_steps − wsd_decay_steps,
//                        then to min_lr by wsd_style (exponential: 2·0.5^r − 1, linear,
//                        cosine, minus_sqrt: 1 − sqrt(r)) over wsd_decay_steps
// and min_lr after decay_steps (all but constant).
// Weight decay: start_wd → end_wd over wd_incr_steps (constant | linear | cosine), end_wd
// afterwards; the optimizer applies it to the parameters that decay (not biases or norms).
// A "step" is an iteration, or a sample when the run is given in samples
// (--train-samples with --lr-decay-samples / --lr-warmup-samples / --lr-wsd-decay-samples);
// Megatron counts iteration runs in samples (iterations × global batch), which gives the
// same ratios. Every value is computed in double, as Python does.
#pragma once
#include <cstdint>
#include <string>

namespace mpitron {

struct LRScheduleConfig {
  double lr = 1e-4;                      // --lr: the peak (Megatron's max_lr)
  double min_lr = 0.0;                   // --min-lr
  double init_lr = 0.0;                  // --lr-warmup-init: where the warmup starts
  std::string style = "linear";          // --lr-decay-style: constant | linear | cosine | inverse-square-root | WSD
  double warmup_steps = 0;               // from --lr-warmup-iters / -samples / -fraction (a fraction is not rounded)
  int64_t decay_steps = 0;               // from --lr-decay-iters / -samples (default: the whole run)
  int64_t wsd_decay_steps = 0;           // WSD: --lr-wsd-decay-iters / -samples, the annealing's length
  std::string wsd_style = "exponential"; // --lr-wsd-decay-style: exponential | linear | cosine | minus_sqrt
  double start_wd = 0.01, end_wd = 0.01; // --start-weight-decay / --end-weight-decay (default: --weight-decay)
  int64_t wd_incr_steps = 0;             // the whole run (train iters or samples)
  std::string wd_incr_style = "constant";  // --weight-decay-incr-style: constant | linear | cosine
};

class LRSchedule {
 public:
  explicit LRSchedule(const LRScheduleConfig& c);
  double lr_at(double step) const;
  double wd_at(double step) const;  // the weight decay of the parameters that decay
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
