#include "model/training/rerun.h"

#include <cmath>
#include <cstring>
#include <vector>

#include "core/log.h"
#include "parallel/failure_record.h"

namespace mpitron {

RerunMode parse_rerun_mode(const std::string& s) {
  if (s == "disabled") return RerunMode::Disabled;
  if (s == "validate_results") return RerunMode::ValidateResults;
  if (s == "report_stats") return RerunMode::ReportStats;
  MPT_THROW(str("--rerun-mode ", s, " is not one of disabled, validate_results, report_stats"),
            "validate_results re-runs a NaN or spiking step to tell a hardware fault from divergence");
}

namespace {
// The same value both times: bitwise, or non-finite both times.
bool same(double a, double b) {
  if (!std::isfinite(a) && !std::isfinite(b)) return true;
  return std::memcmp(&a, &b, sizeof a) == 0;
}
}  // namespace

void RerunMachine::settle(int64_t iteration, const StepRun& first, const StepRun& again) const {
  // Every rank's own loss and seed of both runs: who computed something else the second time.
  const std::vector<double> all = groups_.world_gather(
      {first.local_loss, static_cast<double>(first.local_seed), again.local_loss, static_cast<double>(again.local_seed)});
  std::vector<int> differing;
  std::string who;
  for (size_t r = 0; r * 4 < all.size(); ++r) {
    const double* v = &all[r * 4];
    if (same(v[0], v[2]) && same(v[1], v[3])) continue;
    differing.push_back(static_cast<int>(r));
    const std::string host = host_of_rank(static_cast<int>(r));
    who += str(who.empty() ? "" : "; ", "world rank ", r, host.empty() ? "" : " on host " + host, " (its loss ", v[0],
               " then ", v[2], ", backward seed ", v[1], " then ", v[3], ")");
  }
  const std::string what = first.verdict.describe(first.loss, first.grad_norm);
  if (again.verdict.bits != 0) {
    log_warn("iteration ", iteration, ": ", what, " reproduced by a re-run of the same step on the same data (",
             again.verdict.describe(again.loss, again.grad_norm), "): the model's, not a fault (--rerun-mode)");
    return;
  }
  const std::string text =
      str("iteration ", iteration, ": ", what, what.find(" and ") == std::string::npos ? " was" : " were",
          " not reproduced by a re-run of the same step on the same data "
          "(loss ", again.loss, ", grad norm ", again.grad_norm, "): a fault of the hardware, not the model; ",
          differing.empty() ? std::string("every rank computed the same loss both times (the rank is unknown)")
                            : "computed differently: " + who);
  if (mode_ == RerunMode::ReportStats) {
    log_warn(text, " (--rerun-mode report_stats: going on with the re-run's result)");
    return;
  }
  const int faulty = differing.empty() ? -1 : differing.front();
  throw HostFault(faulty, text + str("; the job ends with exit code ", kExitHostFault),
                  "tools/mpitron-launch excludes that host and restarts from the newest checkpoint; by hand: resume "
                  "with --load on other nodes (docs/training.md \"NaN and spike re-runs\")",
                  __FILE__, __LINE__);
}

}  // namespace mpitron
