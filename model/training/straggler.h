// model/training/straggler.h — --log-straggler: which ranks are slow, named with their hosts
// at every log line (docs/training.md "Stragglers").
//
// A rank's compute time of a step is the wall time of its forward and backward less the
// time it spent waiting in collectives meanwhile (parallel/comm_stats.h): a slow rank's
// peers wait for it, and that waiting is not theirs. At each log line every rank's
// compute ms per iteration over the interval is gathered, and each rank gets
//   - a score against the best rank: fastest / its own, in (0, 1], 1 the fastest
//     (nvidia-resiliency-ext's relative score);
//   - a score against its own history: its best interval / this one.
// The --straggler-minmax-count slowest and fastest ranks go on the log line; every
// score, and the slowest ranks with hosts, go to the metrics JSONL and TensorBoard.
// On a GPU the step is device-synchronised around its forward and backward for this.
#pragma once
#include <cstdint>
#include <vector>

#include "model/training/host_groups.h"
#include "model/training/model_kind.h"

namespace mpitron {

class StragglerDetector {
 public:
  StragglerDetector(bool enabled, int64_t minmax_count, const HostGroups& groups)
      : enabled_(enabled), minmax_(minmax_count), groups_(groups) {}
  bool enabled() const { return enabled_; }
  // One step's forward and backward: its wall seconds, and the seconds spent waiting in
  // collectives meanwhile.
  void add_step(double wall_s, double waited_s);
  // A log line (collective over every rank when enabled; nothing otherwise): its text,
  // scalars and metrics go into `out`.
  void report(LogFields& out);

 private:
  bool enabled_;
  int64_t minmax_;
  const HostGroups& groups_;
  double compute_s_ = 0, waited_s_ = 0;
  int64_t steps_ = 0;
  double best_ms_ = 0;  // this rank's best interval so far
};

}  // namespace mpitron
