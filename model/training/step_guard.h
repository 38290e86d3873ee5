// model/training/step_guard.h — may this step's update be applied? Non-finite loss or
// gradient norm, and loss / grad-norm spikes over a moving window.
//
// The trainer asks the guard between the gradient norm and the AdamW update
// (ReplicatedOptimizer::step / ZeroOptimizer::step take it as their veto), so a bad
// step never touches the weights. The verdict is OR-ed over every rank before
// anyone acts on it: all ranks skip, stop or rerun together.
#pragma once
#include <cstdint>
#include <deque>
#include <string>

namespace mpitron {

struct StepVerdict {
  enum Bits : int { kLossNonFinite = 1, kGradNonFinite = 2, kLossSpike = 4, kGradSpike = 8 };
  int bits = 0;
  bool nonfinite() const { return bits & (kLossNonFinite | kGradNonFinite); }
  bool spike() const { return !nonfinite() && (bits & (kLossSpike | kGradSpike)); }
  // "the loss (nan) and the gradient norm (inf)" / "the loss 9.1 (z-score 12.3 over 100 steps)".
  std::string describe(double loss, double grad_norm) const;
};

// Mean and standard deviation of the last `window` accepted values; a value
// more than `zscore` deviations ABOVE the mean is a spike (a falling loss never
// is). Nothing is a spike until the window is full.
class SpikeWindow {
 public:
  SpikeWindow(double zscore, int64_t window) : zscore_(zscore), window_(window) {}
  bool enabled() const { return zscore_ > 0; }
  double z(double x) const;  // 0 while the window fills
  bool is_spike(double x) const { return enabled() && z(x) > zscore_; }
  void push(double x);
  int64_t size() const { return static_cast<int64_t>(values_.size()); }

 private:
  double zscore_;
  int64_t window_;
  std::deque<double> values_;
};

// The loss and grad-norm windows of one run.
struct StepGuard {
  StepGuard(double zscore, int64_t window) : loss(zscore, window), grad(zscore, window) {}
  SpikeWindow loss, grad;
  // This rank's verdict (not yet agreed over ranks).
  StepVerdict judge(double loss_value, double grad_norm) const;
  // After an applied step: its values join the windows.
  void accept(double loss_value, double grad_norm);
};

}  // namespace mpitron
