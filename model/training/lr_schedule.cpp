#include "model/training/lr_schedule.h"

#include <algorithm>
#include <cmath>
#include <initializer_list>

#include "core/error.h"

namespace mpitron {

namespace {
bool one_of(const std::string& s, std::initializer_list<const char*> names) {
  for (const char* n : names)
    if (s == n) return true;
  return false;
}
}  // namespace

LRSchedule::LRSchedule(const LRScheduleConfig& c) : c_(c) {
  MPT_CHECK(one_of(c.style, {"constant", "linear", "cosine", "inverse-square-root", "WSD"}),
            str("--lr-decay-style '", c.style, "' is not supported"),
            "use constant, linear, cosine, inverse-square-root or WSD");
  MPT_CHECK(c.style != "WSD" || one_of(c.wsd_style, {"exponential", "linear", "cosine", "minus_sqrt"}),
            str("--lr-wsd-decay-style '", c.wsd_style, "' is not supported"),
            "use exponential, linear, cosine or minus_sqrt");
  MPT_CHECK(c.style != "WSD" || (c.wsd_decay_steps > 0 && c.wsd_decay_steps <= c.decay_steps),
            str("--lr-decay-style WSD anneals over ", c.wsd_decay_steps, " steps of a ", c.decay_steps, "-step decay"),
            "give --lr-wsd-decay-iters (or --lr-wsd-decay-samples) between 1 and the decay length");
  MPT_CHECK(c.min_lr >= 0 && c.min_lr <= c.lr, str("--min-lr (", c.min_lr, ") is not in [0, --lr (", c.lr, ")]"), "");
  MPT_CHECK(c.init_lr >= 0 && c.init_lr <= c.lr, str("--lr-warmup-init (", c.init_lr, ") is not in [0, --lr (", c.lr, ")]"),
            "");
  MPT_CHECK(c.warmup_steps >= 0, "negative warmup", "");
  MPT_CHECK(one_of(c.wd_incr_style, {"constant", "linear", "cosine"}),
            str("--weight-decay-incr-style '", c.wd_incr_style, "' is not supported"), "use constant, linear or cosine");
  MPT_CHECK(c.start_wd >= 0 && c.end_wd >= c.start_wd,
            str("--start-weight-decay (", c.start_wd, ") and --end-weight-decay (", c.end_wd,
                ") must satisfy 0 <= start <= end"),
            "");
  MPT_CHECK(c.wd_incr_style != "constant" || c.start_wd == c.end_wd,
            str("--weight-decay-incr-style constant with --start-weight-decay ", c.start_wd, " != --end-weight-decay ",
                c.end_wd),
            "give --weight-decay alone for a constant weight decay, or choose linear or cosine");
}

// megatron/core/optimizer_param_scheduler.py, get_lr, line for line.
double LRSchedule::lr_at(double step) const {
  const double max_lr = c_.lr, min_lr = c_.min_lr;
  if (c_.warmup_steps > 0 && step <= c_.warmup_steps) return c_.init_lr + (max_lr - c_.init_lr) * step / c_.warmup_steps;
  if (c_.style == "constant") return max_lr;
  if (step > static_cast<double>(c_.decay_steps)) return min_lr;
  if (c_.style == "inverse-square-root") {
    const double warmup = std::max(c_.warmup_steps, 1.0), n = std::max(step, 1.0);
    return std::max(min_lr, max_lr * std::sqrt(warmup) / std::sqrt(n));
  }
  const double span = static_cast<double>(c_.decay_steps) - c_.warmup_steps;
  if (span <= 0) return min_lr;  // warmup == decay: no decay left (Megatron refuses it)
  const double ratio = (step - c_.warmup_steps) / span;
  double coeff = 1.0;
  if (c_.style == "linear") {
    coeff = 1.0 - ratio;
  } else if (c_.style == "cosine") {
    coeff = 0.5 * (std::cos(M_PI * ratio) + 1.0);
  } else {  // WSD
    const double anneal_start = static_cast<double>(c_.decay_steps - c_.wsd_decay_steps);
    if (step > anneal_start) {
      const double r = (step - anneal_start) / static_cast<double>(c_.wsd_decay_steps);
      if (c_.wsd_style == "linear") coeff = 1.0 - r;
      else if (c_.wsd_style == "cosine") coeff = 0.5 * (std::cos(M_PI * r) + 1.0);
      else if (c_.wsd_style == "exponential") coeff = 2.0 * std::pow(0.5, r) - 1.0;
      else coeff = 1.0 - std::sqrt(r);  // minus_sqrt
    }
  }
  return min_lr + coeff * (max_lr - min_lr);
}

// get_wd: start_wd → end_wd over wd_incr_steps.
double LRSchedule::wd_at(double step) const {
  if (c_.wd_incr_steps <= 0 || step > static_cast<double>(c_.wd_incr_steps) || c_.wd_incr_style == "constant")
    return c_.end_wd;
  const double r = step / static_cast<double>(c_.wd_incr_steps);
  const double coeff = c_.wd_incr_style == "linear" ? r : 0.5 * (std::cos(M_PI * (1 - r)) + 1.0);
  return c_.start_wd + coeff * (c_.end_wd - c_.start_wd);
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
