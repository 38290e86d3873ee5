// parallel/job_exit.h — how every rank of an MPI job ends after an error, in
// bounded time (docs/training.md "A frozen or failed rank").
//
// MPI cannot cancel a blocking call, and MPI_Finalize waits for every rank. So
// a rank whose collective timed out because a peer is frozen (SIGSTOP, a hung
// GPU, a stuck node) cannot simply return from main: its MPI_Finalize, or a
// wait on another group while its error unwinds, would hang for ever. Hence:
//   - install_job_exit() (main, after MPI_Init): from then on a Communicator
//     that fails (a timeout names the collective and the silent rank) arms
//     the job's exit deadline, before its Error is thrown;
//   - finish_job(rc) (main's last call): rc 0 finalizes. A non-zero rc in a
//     job of several ranks after a communicator failure aborts the job at once
//     (the silent peer will not finalize); after any other error it arms the
//     deadline and tries MPI_Finalize: when every rank failed alike (a bad
//     flag) they all finalize and exit rc;
//   - a deadline that expires (kJobExitGraceS after it was armed) prints what
//     armed it and calls MPI_Abort, which ends every rank of the job, the
//     frozen one included (mpirun kills it), with a non-zero exit status.
// JobDeadline bounds one blocking step that has no timeout of its own (a raw
// MPI collective, collective MPI-IO): if it has not finished after `seconds`,
// the job is aborted the same way. One watchdog thread serves them all.
#pragma once
#include <mpi.h>

#include <cstdint>
#include <functional>
#include <string>

namespace mpitron {

// Seconds between the first error of a rank and the abort of the job, if the
// job has not ended by itself (covers unwinding, the error print, MPI_Finalize).
constexpr double kJobExitGraceS = 10.0;
// Seconds a rank whose collective timed out waits before aborting the job, so that the
// other ranks that time out too write their failure records (parallel/failure_record.h).
constexpr double kRecordWaitS = 3.0;

// Also gathers every rank's host name (collective over MPI_COMM_WORLD; parallel/failure_record.h).
void install_job_exit();
// Arms the exit deadline (the earliest one stays). `why` is printed if it expires.
void arm_job_exit(const std::string& why, double grace_s = kJobExitGraceS);
// main()'s last call (instead of MPI_Finalize): returns rc.
int finish_job(int rc);

class JobDeadline {
 public:
  // `what`: the step ("sum of the bytes written over world ranks 0-3"); `hint`:
  // what the user can do; seconds <= 0: no deadline. `on_expire` runs on the watchdog's
  // thread before the abort (a failure record; parallel/phase_watch.h).
  JobDeadline(std::string what, std::string hint, double seconds, std::function<void()> on_expire = {});
  ~JobDeadline();
  JobDeadline(const JobDeadline&) = delete;
  JobDeadline& operator=(const JobDeadline&) = delete;

 private:
  uint64_t token_ = 0;
};

// MPI_Allreduce in place under a JobDeadline of MPITRON_COMM_TIMEOUT_S: for host
// scalars where no Communicator is at hand (`what` names it in the abort message).
void allreduce_bounded(void* buf, int count, MPI_Datatype type, MPI_Op op, MPI_Comm comm, const char* what);

}  // namespace mpitron
