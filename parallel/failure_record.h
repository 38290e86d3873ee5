// parallel/failure_record.h — what a failed job leaves for whoever restarts it: a small
// JSON record per rank that saw the failure, naming the cause, the rank at fault, its
// host, the phase and the step (docs/training.md "Restarting on failure").
//
//   {"cause": "comm_timeout", "rank": 2, "host": "node07", "phase": "step", "step": 61,
//    "reporter": 0, "reporter_host": "node03", "exit_code": 1, "message": "..."}
//
// Causes: "comm_timeout" (a collective timed out; `rank` is the rank that did not
// answer), "comm_failure" (an MPI/NCCL call failed; rank -1), "host_fault" (a re-run of a step did not reproduce it: --rerun-mode,
// exit code kExitHostFault), "error" (an error on this rank: `rank` is the reporter).
// The records go to $MPITRON_FAILURE_DIR (tools/mpitron-launch sets one per attempt)
// or the directory set_failure_record_dir() names (pretrain: <--save>/failures); with
// neither nothing is written. Every rank knows every rank's host from one all-gather
// at start-up (install_host_table), so a survivor can name a frozen rank's host.
#pragma once
#include <mpi.h>

#include <cstdint>
#include <string>
#include <vector>

#include "core/error.h"

namespace mpitron {

// The exit status of a job that found a fault of the hardware rather than of the model
// (a NaN or spike that a re-run of the same step on the same data did not reproduce):
// the launcher excludes the named host and restarts. Megatron's
// EXIT_CODE_RESUME_TO_DISAMBIGUATE has the same number and meaning.
constexpr int kExitHostFault = 16;

// Collective over MPI_COMM_WORLD (bounded by MPITRON_COMM_TIMEOUT_S): every rank's host name.
void install_host_table();
// The host of a world rank ("" when unknown); this process's own when rank < 0.
std::string host_of_rank(int world_rank);

// This rank enters a phase ("setup", "step", "checkpoint-save", "checkpoint-load",
// "evaluation") of iteration `step`: the records name it, and MPITRON_FAULT's kill and
// freeze faults fire here (parallel/fault_injection.h). Thread-safe.
void enter_phase(const std::string& phase, int64_t step);
std::string job_phase();
int64_t job_step();

// The world ranks the last communicator timeout of this process found silent (not in any
// call of the group): parallel/communicator.cpp notes them, the failure hook reads them.
void note_silent_ranks(const std::vector<int>& world_ranks);
std::vector<int> noted_silent_ranks();

// Sets the records' directory when $MPITRON_FAILURE_DIR is not set ("" : none).
void set_failure_record_dir(const std::string& dir);

// Thrown on every rank when a re-run found a fault of rank `faulty_rank`'s hardware;
// main() exits with kExitHostFault.
class HostFault : public Error {
 public:
  HostFault(int faulty_rank, std::string what, std::string hint, const char* file, int line)
      : Error(std::move(what), std::move(hint), file, line), faulty_rank_(faulty_rank) {}
  int faulty_rank() const { return faulty_rank_; }

 private:
  int faulty_rank_;
};

struct FailureRecord {
  std::string cause;    // comm_timeout | comm_failure | host_fault | phase_timeout | error
  int rank = -1;        // the world rank at fault (-1: unknown)
  std::string message;  // the error text
  int exit_code = 1;    // what this process will exit with
};
// Writes <dir>/rank-<reporter>.json (atomically: temp + rename); the first record of a
// process is the one kept (a timeout's, not the error it then unwinds with). Never throws.
void write_failure_record(const FailureRecord& r);

}  // namespace mpitron
