// parallel/schedule_check.h — proves a pipeline schedule complete and
// deadlock-free before any rank runs it.
//
// Checks, in this order; the result names the FIRST offending action found
// (phases in order, and within a phase ranks in order, then actions in order):
//  1. each action alone: micro-batch and chunk in range; a send/recv names the
//     rank that really holds the neighbour stage (SA/RG: stage + 1, RA/SG:
//     stage - 1), never its own rank; batches hold only sends/recvs.
//  0. the placement is valid (every rank holds virtual_stages stages).
//  2. each rank in order (local data flow): no action twice; F(mb, s) has its
//     input (stage 0: the data; else RA before it, or F(mb, s-1) earlier on
//     this rank when that stage is local); B(mb, s) comes after F(mb, s) and
//     has its output gradient (last stage: the loss; else RG before it, or
//     B(mb, s+1) earlier when local); W(mb, s) after B(mb, s); SA after its F;
//     SG after its B. Measures the peak in flight (F run, W — or B when there is
//     no W — not yet) and enforces `max-in-flight` when the schedule sets it.
//  3. completeness: every rank runs F and B of every (micro-batch, chunk), and
//     W of each once when the schedule has any W;
//     every recv has its send on the peer and every send its recv.
//  4. the p2p replay (schedule_replay.h): blocking rendezvous sends/recvs,
//     batches posted together, in-order pairing per rank pair; a pairing of
//     different messages, or a state where no rank can move, is rejected.
// Together 2-4 give the cross-stage dependencies: F(mb, s) runs after
// F(mb, s-1) finished on its rank, B(mb, s) after B(mb, s+1).
#pragma once
#include <string>
#include <vector>

#include "parallel/schedule.h"

namespace mpitron::parallel {

struct CheckResult {
  bool ok = true;
  int rank = -1;            // pipeline rank of the first offending action
  int index = -1;           // its position in schedule.ranks[rank]; -1 when the problem is a missing action
  std::string action;       // its text, e.g. "SA3.0>1" (or the missing action's)
  int line = 0, column = 0; // where it was read from (0 when generated)
  std::string why;          // what is wrong and what would fix it
  // Per rank: most (micro-batch, chunk) forwards in flight at once — F run, and
  // its W (its B, when the schedule has no W) not yet: what the stage keeps saved.
  std::vector<int> peak_in_flight;
  std::string source;       // the schedule's file (Schedule::source), "" when generated

  // "rank 1, action 7 (SA3.0>2, line 4:20): why"
  std::string message() const;
  // "FILE:LINE:COLUMN: " when the offending action was read from a file, else "".
  std::string located() const;
};

// Reports (never throws) whatever is wrong, bad sizes included.
CheckResult check_schedule(const Schedule& s);
// Throws mpitron::Error carrying check_schedule's message when the schedule is bad.
void validate_schedule(const Schedule& s);

}  // namespace mpitron::parallel
