// parallel/schedule_replay.h — runs every rank of a schedule step by step under
// blocking point-to-point semantics, with times. Shared by the checker (which
// only asks "does it finish, do the messages match?") and the simulator (which
// wants the timeline). Internal to parallel/: callers use schedule_check.h and
// schedule_sim.h.
//
// Semantics (also in docs/pipeline-schedules.md):
// - A rank runs its actions in order. F, B and W take their cost and need nothing
//   from other ranks at this point (their inputs were received by earlier
//   actions; the static checks in schedule_check.cpp prove that).
// - A send or recv, or a batch of them, is POSTED when the rank reaches it and
//   the rank then BLOCKS until every op of it has completed (rendezvous, like
//   NCCL send/recv or MPI_Ssend; a batch is torch's batch_isend_irecv + wait).
// - Between an ordered pair of ranks (src -> dst) the n-th send posted by src
//   pairs with the n-th recv posted by dst (no tags: NCCL matches in order).
//   A pair must be the same message (kind, micro-batch, adjacent stages).
// - A paired op completes at max(post times) + p2p cost.
#pragma once
#include <string>
#include <vector>

#include "parallel/schedule.h"

namespace mpitron::parallel::detail {

struct ReplayCosts {
  double forward = 1;   // one F of one model chunk
  double backward = 2;  // one B of one model chunk
  double p2p = 0;       // one send/recv pair, from the later post to completion
  double weight = 1;    // one W of one model chunk
  // Per global stage (used when non-empty): F, B and W costs of that stage.
  std::vector<double> stage_forward, stage_backward, stage_weight;

  double cost(Op op, int stage) const {
    const std::vector<double>& v = op == Op::Forward ? stage_forward : op == Op::Backward ? stage_backward : stage_weight;
    if (stage >= 0 && stage < static_cast<int>(v.size())) return v[stage];
    return op == Op::Forward ? forward : op == Op::Backward ? backward : weight;
  }
};

// A contiguous piece of a rank's timeline: one F/B (count 1) or one
// send/recv batch (count >= 1) covering actions [first, first + count).
struct Span {
  int first = 0;
  int count = 1;
  bool compute = true;
  double start = 0, end = 0;  // for p2p: from posting to completion (blocked time)
};

struct ReplayResult {
  bool ok = true;
  int rank = -1, index = -1;  // first failure, when !ok
  std::string why;
  std::vector<std::vector<Span>> spans;  // per rank, in order
  std::vector<double> finish;            // per rank: when its last action ends
};

// Precondition: every action passed the per-action checks (ranges, peers).
ReplayResult replay(const Schedule& s, const ReplayCosts& costs);

}  // namespace mpitron::parallel::detail
