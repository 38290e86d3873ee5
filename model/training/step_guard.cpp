#include "model/training/step_guard.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"

namespace mpitron {

std::string StepVerdict::describe(double loss, double grad_norm) const {
  std::string out;
  auto add = [&](const std::string& s) { out += out.empty() ? s : " and " + s; };
  if (bits & kLossNonFinite) add(str("the loss (", loss, ")"));
  if (bits & kGradNonFinite) add(str("the gradient norm (", grad_norm, ")"));
  if (!nonfinite()) {
    if (bits & kLossSpike) add(str("the loss ", loss));
    if (bits & kGradSpike) add(str("the gradient norm ", grad_norm));
  }
  return out;
}

double SpikeWindow::z(double x) const {
  if (static_cast<int64_t>(values_.size()) < window_) return 0;
  double mean = 0;
  for (double v : values_) mean += v;
  mean /= static_cast<double>(values_.size());
  double var = 0;
  for (double v : values_) var += (v - mean) * (v - mean);
  const double sd = std::sqrt(var / static_cast<double>(values_.size() - 1));
  // A flat window (sd ~ 0) still needs a visible jump: a floor relative to the mean.
  const double floor = 1e-6 * std::max(1.0, std::fabs(mean));
  return (x - mean) / std::max(sd, floor);
}

void SpikeWindow::push(double x) {
  values_.push_back(x);
  while (static_cast<int64_t>(values_.size()) > window_) values_.pop_front();
}

StepVerdict StepGuard::judge(double loss_value, double grad_norm) const {
  StepVerdict v;
  if (!std::isfinite(loss_value)) v.bits |= StepVerdict::kLossNonFinite;
  if (!std::isfinite(grad_norm)) v.bits |= StepVerdict::kGradNonFinite;
  if (!v.nonfinite()) {
    if (loss.is_spike(loss_value)) v.bits |= StepVerdict::kLossSpike;
    if (grad.is_spike(grad_norm)) v.bits |= StepVerdict::kGradSpike;
  }
  return v;
}

void StepGuard::accept(double loss_value, double grad_norm) {
  if (!std::isfinite(loss_value) || !std::isfinite(grad_norm)) return;
  loss.push(loss_value);
  grad.push(grad_norm);
}

}  // namespace mpitron
