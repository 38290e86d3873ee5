// io/io_watchdog.cpp — IoDeadline: one watchdog thread, one armed step at a time.
#include "io/io_watchdog.h"

#include <mpi.h>

#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <mutex>
#include <thread>

#include "core/log.h"
#include "parallel/communicator.h"

namespace mpitron::io {

namespace {

using Clock = std::chrono::steady_clock;

struct Step {
  std::string what;
  Clock::time_point deadline;
};

// The watchdog: steps by token; the thread sleeps until the earliest deadline.
class Watchdog {
 public:
  static Watchdog& get() {
    static Watchdog* w = new Watchdog();  // never destroyed: the thread outlives static destruction
    return *w;
  }
  uint64_t arm(std::string what, double seconds) {
    std::lock_guard<std::mutex> lock(mu_);
    const uint64_t t = ++next_;
    steps_[t] = Step{std::move(what), Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                                          std::chrono::duration<double>(seconds))};
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
  [[noreturn]] void expire(const Step& s, double seconds) {
    int init = 0, fin = 0, rank = 0;
    MPI_Initialized(&init);
    MPI_Finalized(&fin);
    if (init && !fin) MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    std::fprintf(stderr,
                 "[rank %d] error: checkpoint I/O step did not finish within %.0f s: %s\n"
                 "  hint: another rank failed or hung inside collective MPI-IO/HDF5 I/O, which cannot be cancelled "
                 "(a full or read-only disk, a dead rank); the job is aborted instead of hanging. The previous "
                 "checkpoint and latest_checkpointed_iteration.txt are intact. MPITRON_COMM_TIMEOUT_S sets the "
                 "timeout (0 = never).\n",
                 rank, seconds, s.what.c_str());
    std::fflush(stderr);
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
      if (Clock::now() >= first->second.deadline) expire(first->second, io_timeout_s());
      // A copy: wait_until keeps reading its time_point while the lock is released,
      // and disarm() may erase this step meanwhile (ASan on the simulated device caught it).
      const Clock::time_point deadline = first->second.deadline;
      cv_.wait_until(lock, deadline);
    }
  }

  std::mutex mu_;
  std::condition_variable cv_;
  std::map<uint64_t, Step> steps_;
  uint64_t next_ = 0;
  std::thread thread_;
};

}  // namespace

double io_timeout_s() {
  static const double t = comm_timeout_from_env();
  return t;
}

IoDeadline::IoDeadline(std::string what) {
  const double s = io_timeout_s();
  if (s > 0) token_ = Watchdog::get().arm(std::move(what), s);
}

IoDeadline::~IoDeadline() {
  if (token_) Watchdog::get().disarm(token_);
}

}  // namespace mpitron::io
