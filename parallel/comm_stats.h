// parallel/comm_stats.h — how long this process has waited in communicator calls, and
// whether it waits in one now: what a rank's step time owes to others (straggler scores,
// model/training/straggler.h) and whether a rank whose phase overran was waiting for a
// peer or stuck itself (failure records).
#pragma once

namespace mpitron {

// Seconds this process has spent in Communicator waits so far (every thread).
double comm_wait_seconds();
// True while a thread of this process waits in a Communicator call.
bool comm_waiting_now();

// Counts one wait (parallel/communicator.cpp's wait loop).
class CommWaitScope {
 public:
  CommWaitScope();
  ~CommWaitScope();
  CommWaitScope(const CommWaitScope&) = delete;
  CommWaitScope& operator=(const CommWaitScope&) = delete;

 private:
  double start_;
};

}  // namespace mpitron
