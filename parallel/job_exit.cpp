// parallel/job_exit.cpp — the job's exit deadline and JobDeadline: one watchdog thread.
#include "parallel/job_exit.h"

#include <mpi.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <mutex>
#include <thread>

#include "core/log.h"
#include "parallel/communicator.h"
#include "parallel/failure_record.h"

namespace mpitron {

namespace {

using Clock = std::chrono::steady_clock;

struct Step {
  std::string what, hint;
  std::function<void()> on_expire;
  double seconds = 0;
  Clock::time_point deadline;
};

class Watchdog {
 public:
  static Watchdog& get() {
    static Watchdog* w = new Watchdog();  // never destroyed: the thread outlives static destruction
    return *w;
  }
  uint64_t arm(Step s) {
    std::lock_guard<std::mutex> lock(mu_);
    const uint64_t t = ++next_;
    s.deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(s.seconds));
    steps_[t] = std::move(s);
    if (!thread_.joinable()) thread_ = std::thread([this] { loop(); });
    cv_.notify_all();
    return t;
  }
  void disarm(uint64_t t) {
    std::lock_guard<std::mutex> lock(mu_);
    steps_.erase(t);
  }

 private:
  Watchdog() = default;
  [[noreturn]] static void expire(const Step& s) {
    if (s.on_expire) s.on_expire();
    int init = 0, fin = 0, rank = 0;
    MPI_Initialized(&init);
    MPI_Finalized(&fin);
    if (init && !fin) MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    std::fprintf(stderr, "[rank %d] error: %s\n  hint: %s\n", rank, s.what.c_str(), s.hint.c_str());
    std::fflush(stderr);
    std::fflush(stdout);
    if (init && !fin) MPI_Abort(MPI_COMM_WORLD, 1);
    std::_Exit(1);
  }
  void loop() {
    std::unique_lock<std::mutex> lock(mu_);
    while (true) {
      if (steps_.empty()) {
        cv_.wait(lock);
        continue;
      }
      auto first = steps_.begin();
      for (auto it = steps_.begin(); it != steps_.end(); ++it)
        if (it->second.deadline < first->second.deadline) first = it;
      if (Clock::now() >= first->second.deadline) expire(first->second);
      const Clock::time_point deadline = first->second.deadline;  // a copy: disarm() may erase the step
      cv_.wait_until(lock, deadline);
    }
  }

  std::mutex mu_;
  std::condition_variable cv_;
  std::map<uint64_t, Step> steps_;
  uint64_t next_ = 0;
  std::thread thread_;
};

std::mutex g_exit_mu;
bool g_exit_armed = false;  // the exit deadline is one per process: the first error starts the clock
std::atomic<bool> g_comm_failed{false};

// The first failure of this rank's communicators: a record naming the silent rank(s) for
// the launcher (parallel/failure_record.h), then the exit deadline.
void on_comm_failure(const std::string& what) {
  if (!g_comm_failed.exchange(true)) {
    const std::vector<int> silent = noted_silent_ranks();  // a timeout's diagnosis, just made
    FailureRecord r;
    r.cause = silent.empty() ? "comm_failure" : "comm_timeout";
    r.rank = silent.empty() ? -1 : silent.front();
    r.message = what;
    write_failure_record(r);
  }
  arm_job_exit(what);
}

int world_size() {
  int init = 0, fin = 0, n = 1;
  MPI_Initialized(&init);
  MPI_Finalized(&fin);
  if (init && !fin) MPI_Comm_size(MPI_COMM_WORLD, &n);
  return n;
}

}  // namespace

void install_job_exit() {
  set_comm_failure_hook(&on_comm_failure);
  install_host_table();  // errors and records name the hosts of silent ranks
}

void arm_job_exit(const std::string& why, double grace_s) {
  {
    std::lock_guard<std::mutex> lock(g_exit_mu);
    if (g_exit_armed) return;
    g_exit_armed = true;
  }
  Step s;
  s.what = str("this rank failed ", grace_s, " s ago and the job has not ended; aborting every rank. The failure: ", why);
  s.hint = "another rank is frozen, hung or waiting where this one cannot follow; MPI_Abort ends them all "
           "(docs/training.md \"A frozen or failed rank\")";
  s.seconds = grace_s;
  Watchdog::get().arm(std::move(s));  // never disarmed: only the end of the process stops it
}

int finish_job(int rc) {
  if (rc != 0 && world_size() > 1) {
    std::fflush(stdout);
    std::fflush(stderr);
    // A peer that did not answer a collective will not reach MPI_Finalize either: end the job,
    // after a moment in which the other survivors' timeouts write their failure records
    // (they started waiting at about the same time; the launcher compares what they name).
    if (g_comm_failed) {
      std::this_thread::sleep_for(std::chrono::duration<double>(kRecordWaitS));
      MPI_Abort(MPI_COMM_WORLD, rc);
    }
    arm_job_exit(str("exit status ", rc));
  }
  MPI_Finalize();
  return rc;
}

JobDeadline::JobDeadline(std::string what, std::string hint, double seconds, std::function<void()> on_expire) {
  if (seconds <= 0) return;
  Step s;
  s.on_expire = std::move(on_expire);
  s.what = str(what, " did not finish within ", seconds, " s; aborting every rank");
  s.hint = std::move(hint);
  s.seconds = seconds;
  token_ = Watchdog::get().arm(std::move(s));
}

JobDeadline::~JobDeadline() {
  if (token_) Watchdog::get().disarm(token_);
}

void allreduce_bounded(void* buf, int count, MPI_Datatype type, MPI_Op op, MPI_Comm comm, const char* what) {
  JobDeadline d(str("MPI_Allreduce (", what, ")"), "a rank of the group is frozen, hung or dead; MPITRON_COMM_TIMEOUT_S sets the timeout",
                comm_timeout_from_env());
  MPI_Allreduce(MPI_IN_PLACE, buf, count, type, op, comm);
}

}  // namespace mpitron
