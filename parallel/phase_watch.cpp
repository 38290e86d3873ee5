#include "parallel/phase_watch.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <sstream>
#include <thread>

#include "core/error.h"
#include "core/log.h"
#include "core/timer.h"
#include "parallel/comm_stats.h"
#include "parallel/failure_record.h"
#include "parallel/job_exit.h"

namespace mpitron {

namespace {

const char* const kGroups[] = {"setup", "step", "checkpoint", "evaluation"};

struct Watch {
  std::mutex mu;
  PhaseTimeouts timeouts;
  std::map<std::string, double> longest;   // per group, seconds
  std::map<std::string, int64_t> seen;     // per group, phases ended
  std::string phase;
  Timer timer;
  std::unique_ptr<JobDeadline> deadline;
};

Watch& watch() {
  static Watch* w = new Watch();  // never destroyed: the watchdog may run until exit
  return *w;
}

double timeout_of(Watch& w, const std::string& group) {
  const auto it = w.timeouts.find(group);
  if (it == w.timeouts.end()) return 0;
  if (it->second >= 0) return it->second;
  const int64_t need = group == "step" ? kWarmupSteps : 1;
  if (w.seen[group] < need) return 0;
  return std::max(kLearnedFloorS, w.longest[group] * kSafetyFactor);
}

}  // namespace

std::string phase_group(const std::string& phase) {
  return phase.rfind("checkpoint", 0) == 0 ? "checkpoint" : phase;
}

PhaseTimeouts parse_ft_timeouts(const std::string& spec) {
  PhaseTimeouts out;
  if (spec.empty()) return out;
  if (spec == "auto") {
    for (const char* g : kGroups)
      if (std::string(g) != "setup") out[g] = -1;
    return out;
  }
  std::stringstream ss(spec);
  std::string part;
  while (std::getline(ss, part, ',')) {
    const size_t eq = part.find('=');
    const std::string key = part.substr(0, eq), v = eq == std::string::npos ? "" : part.substr(eq + 1);
    const bool known = std::any_of(std::begin(kGroups), std::end(kGroups), [&](const char* g) { return key == g; });
    MPT_CHECK(eq != std::string::npos && known,
              str("--ft-timeouts ", spec, ": '", part, "' is not phase=seconds with phase one of setup, step, "
                  "checkpoint, evaluation"),
              "e.g. --ft-timeouts setup=600,step=60,checkpoint=900 (or step=auto: learned; or auto)");
    if (v == "auto") {
      MPT_CHECK(key != "setup", str("--ft-timeouts ", spec, ": setup=auto: the setup has no history to learn from"),
                "give setup=SECONDS or leave it out");
      out[key] = -1;
      continue;
    }
    char* end = nullptr;
    const double s = std::strtod(v.c_str(), &end);
    MPT_CHECK(!v.empty() && *end == '\0' && std::isfinite(s) && s > 0,
              str("--ft-timeouts ", spec, ": ", key, "=", v, " is not a number of seconds > 0 (or auto)"), "");
    out[key] = s;
  }
  return out;
}

void configure_phase_timeouts(const PhaseTimeouts& t) {
  Watch& w = watch();
  std::lock_guard<std::mutex> lock(w.mu);
  w.timeouts = t;
}

void phase_heartbeat(const std::string& phase, int64_t step) {
  Watch& w = watch();
  std::lock_guard<std::mutex> lock(w.mu);
  if (!w.phase.empty()) {  // the previous phase ended: what it took teaches the learned timeouts
    const std::string g = phase_group(w.phase);
    w.longest[g] = std::max(w.longest[g], w.timer.seconds());
    ++w.seen[g];
  }
  w.deadline.reset();
  w.phase = phase;
  w.timer.reset();
  const std::string group = phase_group(phase);
  const double seconds = timeout_of(w, group);
  if (seconds <= 0) return;
  const std::string host = host_of_rank(-1);
  const std::string what = str("phase '", phase, "' of iteration ", step, " on host ", host, " (--ft-timeouts ", group,
                               "=", seconds, " s)");
  w.deadline = std::make_unique<JobDeadline>(
      what,
      "a rank still in its phase and not waiting for a peer is stuck itself (a hung kernel or file system); "
      "one waiting in a collective waits for a late peer, which the failure records name (docs/training.md "
      "\"Heartbeats per phase\")",
      seconds, [what, seconds] {
        const bool waiting = comm_waiting_now();
        FailureRecord r;
        r.cause = "phase_timeout";
        r.rank = waiting ? -1 : std::max(0, process_rank());
        r.message = str(what, " did not finish within ", seconds, " s",
                        waiting ? " (this rank was waiting in a collective for a peer)" : " (this rank was not waiting for a peer)");
        write_failure_record(r);
        // A rank that waits for a peer gives that peer's own watchdog the time to say so.
        if (waiting) std::this_thread::sleep_for(std::chrono::duration<double>(kRecordWaitS));
      });
}

}  // namespace mpitron
