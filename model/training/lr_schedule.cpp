#include "model/training/lr_schedule.h"

#include <cmath>

#include "core/error.h"

namespace mpitron {

LRSchedule::LRSchedule(const LRScheduleConfig& c) : c_(c) {
  MPT_CHECK(c.style == "constant" || c.style == "linear" || c.style == "cosine",
            str("--lr-decay-style '", c.style, "' is not supported"), "use constant, linear or cosine");
  MPT_CHECK(c.min_lr <= c.lr, str("--min-lr (", c.min_lr, ") is above --lr (", c.lr, ")"), "");
  MPT_CHECK(c.warmup_steps >= 0, "negative warmup", "");
}

float LRSchedule::lr_at(int64_t step) const {
  if (c_.warmup_steps > 0 && step <= c_.warmup_steps)
    return c_.lr * static_cast<float>(step) / static_cast<float>(c_.warmup_steps);
  if (c_.style == "constant") return c_.lr;
  if (step > c_.decay_steps) return c_.min_lr;
  const int64_t span = c_.decay_steps - c_.warmup_steps;
  if (span <= 0) return c_.min_lr;
  const double ratio = static_cast<double>(step - c_.warmup_steps) / static_cast<double>(span);
  const double delta = c_.lr - c_.min_lr;
  const double coeff = c_.style == "linear" ? 1.0 - ratio : 0.5 * (std::cos(M_PI * ratio) + 1.0);
  return static_cast<float>(c_.min_lr + coeff * delta);
}

BatchRampup::BatchRampup(int64_t gb, int64_t mb, int64_t dp)
    : start_(gb), increment_(0), ramp_samples_(0), final_(gb), micro_(mb), dp_(dp) {
  MPT_CHECK(gb % (mb * dp) == 0,
            str("--global-batch-size (", gb, ") is not divisible by --micro-batch-size (", mb,
                ") × data-parallel size (", dp, ")"),
            "choose a global batch that is a multiple of micro batch × data-parallel size");
}

BatchRampup::BatchRampup(int64_t start, int64_t inc, int64_t samples, int64_t gb, int64_t mb, int64_t dp)
    : start_(start), increment_(inc), ramp_samples_(samples), final_(gb), micro_(mb), dp_(dp), ramp_(true) {
  MPT_CHECK(start > 0 && inc > 0 && samples >= 0,
            str("--rampup-batch-size ", start, " ", inc, " ", samples, ": start and increment must be > 0"), "");
  MPT_CHECK(gb >= start && (gb - start) % inc == 0,
            str("--rampup-batch-size: global batch ", gb, " minus start ", start, " must be a multiple of the increment ",
                inc),
            "");
  MPT_CHECK(start % (mb * dp) == 0 && inc % (mb * dp) == 0 && gb % (mb * dp) == 0,
            str("--rampup-batch-size start (", start, "), increment (", inc, ") and --global-batch-size (", gb,
                ") must be multiples of micro batch × data-parallel size (", mb * dp, ")"),
            "");
}

int64_t BatchRampup::global_batch(int64_t consumed) const {
  if (!ramp_ || consumed > ramp_samples_ || final_ == start_) return final_;
  const int64_t increments = (final_ - start_) / increment_;
  const double per = static_cast<double>(ramp_samples_) / static_cast<double>(increments);
  const int64_t steps = static_cast<int64_t>(static_cast<double>(consumed) / per);
  return std::min(final_, start_ + steps * increment_);
}

int64_t BatchRampup::num_micro_batches(int64_t consumed) const { return global_batch(consumed) / (micro_ * dp_); }

}  // namespace mpitron
