// model/training/rerun.h — --rerun-mode (Megatron's rerun machine): a step whose loss or
// gradient norm is not finite or spikes is run again, on the same micro-batches from the
// same state (kept in memory: the first run's update was held back by the optimizer's
// veto), to tell a fault of the hardware from the model's own divergence
// (docs/training.md "NaN and spike re-runs").
//   - reproduced (the re-run is rejected too): the model's; the step's usual rules follow
//     (--check-for-nan-in-loss-and-grad stops, a spike is skipped, --spike-rerun …);
//   - not reproduced: a fault. validate_results ends the job on every rank with a
//     HostFault naming the rank whose own loss differed between the two runs and its host
//     (exit code kExitHostFault, a failure record for tools/mpitron-launch); report_stats
//     logs it and goes on with the re-run's result.
#pragma once
#include <cstdint>
#include <string>

#include "model/training/host_groups.h"
#include "model/training/step_guard.h"

namespace mpitron {

enum class RerunMode { Disabled, ValidateResults, ReportStats };
// "disabled" | "validate_results" | "report_stats"; an Error names --rerun-mode otherwise.
RerunMode parse_rerun_mode(const std::string& s);

// What one run of a step showed: the agreed verdict and values, and this rank's own part.
struct StepRun {
  StepVerdict verdict;
  double loss = 0, grad_norm = 0;  // over every rank
  double local_loss = 0;           // this rank's loss sum over its micro-batches, before any reduction
  float local_seed = 0;            // the backward seed this rank used
};

class RerunMachine {
 public:
  // fp16: a non-finite step is an overflow, the loss scaler's business, never re-run.
  RerunMachine(RerunMode mode, bool fp16, const HostGroups& groups) : mode_(mode), fp16_(fp16), groups_(groups) {}
  bool enabled() const { return mode_ != RerunMode::Disabled; }
  // The first run of a step: hold back (veto) the update of a suspicious step for its re-run.
  bool holds(const StepVerdict& v) const { return enabled() && (v.spike() || (v.nonfinite() && !fp16_)); }
  // After the re-run (collective over every rank): the model's (returns), or a fault
  // (validate_results throws HostFault; report_stats logs and returns).
  void settle(int64_t iteration, const StepRun& first, const StepRun& again) const;

 private:
  RerunMode mode_;
  bool fp16_;
  const HostGroups& groups_;
};

}  // namespace mpitron
