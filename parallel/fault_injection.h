// parallel/fault_injection.h — faults on purpose, for tests (off unless MPITRON_FAULT is
// set; docs/training.md "Fault injection").
//
//   MPITRON_FAULT="kill:rank=1:step=30;freeze:rank=2:step=60:attempt=1"
//
// One or more faults separated by ';', each a kind and key=value fields:
//   kill    the rank SIGKILLs itself when it enters `phase` (default step) `step`
//   freeze  the rank SIGSTOPs itself there (a hung GPU or node, as the others see it)
//   hang    the rank's main thread stops there for good, the process lives on (a hung kernel)
//   slow    from `step` (default 1) on, each step's compute takes `factor` (default 2) times as long
//   nan     the rank's loss and backward seed of step `step` are NaN (a NaN in its gradient)
//   flip    one bit flipped in the rank's loss and backward seed of step `step` (the exponent's
//           top bit: a huge value)
// Fields: rank (world rank, required), step (required but for slow), phase (kill,
// freeze, hang: setup, step, checkpoint-save, checkpoint-load, evaluation), factor (slow),
// attempt (only in that attempt of tools/mpitron-launch, which sets MPITRON_LAUNCH_ATTEMPT).
// nan and flip fire once: a re-run of the same step (--rerun-mode) runs clean, as a
// transient hardware fault would.
#pragma once
#include <cstdint>
#include <string>

namespace mpitron {

// Parses MPITRON_FAULT (once; an Error names the variable and the bad part).
void check_fault_plan();
// kill / freeze faults of this rank at (phase, step). Called by enter_phase().
void fault_point(const std::string& phase, int64_t step);

// A corruption of one step on this rank (nan, flip), or none: applied to the backward seed
// before the step and to this rank's loss sum after it.
class StepCorruption {
 public:
  enum Kind { kNone, kNan, kFlip };
  StepCorruption() = default;
  explicit StepCorruption(Kind k) : kind_(k) {}
  float seed(float s) const;
  double loss(double l) const;
  bool active() const { return kind_ != kNone; }

 private:
  Kind kind_ = kNone;
};
// This rank's corruption of step `step` (the first call only: a re-run runs clean).
StepCorruption take_step_corruption(int64_t step);
// slow: sleeps (factor - 1) x `compute_s` when this rank is slowed at `step`.
void fault_slow_down(int64_t step, double compute_s);

}  // namespace mpitron
