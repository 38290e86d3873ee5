// parallel/phase_watch.h — a heartbeat per phase (--ft-timeouts; docs/training.md
// "Heartbeats per phase").
//
// Each time a rank enters a phase (enter_phase, parallel/failure_record.h: setup, step,
// checkpoint-save, checkpoint-load, evaluation) the previous phase's deadline ends and the
// new one's starts, on the job's one watchdog thread (parallel/job_exit.h). A phase that
// overruns its timeout ends the job within the timeout (plus the records' 3 s when the
// rank was waiting for a peer) naming the rank, its host, the phase and the iteration,
// with a failure record of cause "phase_timeout": rank = this rank when it was not
// waiting in a collective (stuck itself: a hung kernel, a stuck file system), -1 when it
// was (a peer is late; that peer, if it can, writes its own record).
// Timeouts are given per phase group (setup, step, checkpoint, evaluation) or learned:
// step after kWarmupSteps steps, checkpoint and evaluation after their first, as the
// longest seen times kSafetyFactor, at least kLearnedFloorS.
#pragma once
#include <cstdint>
#include <map>
#include <string>

namespace mpitron {

constexpr int64_t kWarmupSteps = 10;
constexpr double kSafetyFactor = 5.0;
constexpr double kLearnedFloorS = 10.0;

// Seconds per phase group; a negative value: learned. Groups not named: no deadline.
using PhaseTimeouts = std::map<std::string, double>;
// "setup=600,step=auto,checkpoint=900,evaluation=300", or "auto" (every group learned but
// setup, which has no history). An Error names --ft-timeouts and the bad part.
PhaseTimeouts parse_ft_timeouts(const std::string& spec);
void configure_phase_timeouts(const PhaseTimeouts& t);
// The phase's group: checkpoint-save and checkpoint-load are "checkpoint".
std::string phase_group(const std::string& phase);
// Called by enter_phase(): ends the previous phase's heartbeat, starts this one's.
void phase_heartbeat(const std::string& phase, int64_t step);

}  // namespace mpitron
