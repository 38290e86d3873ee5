// parallel/expert_parallel.h — expert parallelism (--expert-model-parallel-size): the E experts
// of an MoE layer split over the ep ranks of a data-parallel group (rank r holds experts
// [r·El, (r+1)·El), El = E / ep), and the token dispatchers that carry each rank's permuted
// rows to their experts' ranks and the experts' outputs back (Megatron-Core's
// MoEAlltoAllTokenDispatcher and MoEAllGatherTokenDispatcher).
//
//   xp (R, C)    this rank's rows grouped by global expert (tensor/moe_permute.h), counts (E)
//   xe (Re, C)   the rows this rank's experts run on, grouped by local expert, local_counts (El)
//   to_experts:   xp → xe
//   from_experts: ye (Re, C) → yp (R, C), row for row the adjoint of to_experts (every row of
//                 xe is one row of some rank's xp), so each is the other's backward.
// alltoall:  the rows for rank j's experts (contiguous in xp) are sent to j; each rank receives
//            them source by source and regroups them by local expert; back the same way.
// allgather: every rank's xp is all-gathered over the group (Σ R rows) and the rows of local
//            experts selected; back: the outputs scattered into zeros and reduce-scattered
//            (each row has exactly one nonzero contributor, so the sums are exact). It moves
//            ep × the rows of alltoall: Megatron's choice when tokens are few or EP small.
// Both dispatchers give the same xe (bit for bit) and the same yp.
// A rank whose experts receive no rows, or that sends none, takes part with empty pieces:
// nothing waits for it (Megatron-LM #1444, #1877).
//
// Tensor parallelism: the group holds ranks of one tp rank, which route the same tokens
// (gathered under sequence parallelism), so each tp rank exchanges the same rows with its
// ep peers and its experts' slices run on them; the tp reduce of the layer sums the slices.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "parallel/communicator.h"

namespace mpitron {

enum class MoeDispatcher { AllGather, AllToAll };
MoeDispatcher parse_moe_dispatcher(const std::string& s);  // "allgather" | "alltoall" (throws naming the flag)
const char* moe_dispatcher_name(MoeDispatcher d);

struct ExpertParallel {
  Communicator* comm = nullptr;  // the ep group (same tp, cp, pp; consecutive dp ranks); null when size == 1
  int size = 1, rank = 0;
  MoeDispatcher dispatcher = MoeDispatcher::AllGather;
  bool active() const { return size > 1; }
  // This rank's experts of E: [first(E), first(E) + E / size).
  int64_t first(int64_t experts) const { return rank * (experts / size); }
  bool holds(int64_t expert, int64_t experts) const {
    return expert >= first(experts) && expert < first(experts) + experts / size;
  }
};

// One layer forward's exchange plan (kept for its backward). Construction is collective
// over ep.comm (an all-gather of every rank's E counts).
class ExpertExchange {
 public:
  // counts (E): rows of xp per global expert; dev: where the rows live.
  ExpertExchange(const ExpertParallel& ep, const std::vector<int64_t>& counts, Device dev);
  const std::vector<int64_t>& local_counts() const { return local_counts_; }  // (El)
  int64_t local_rows() const { return local_rows_; }                           // Re
  int64_t rows() const { return rows_; }                                       // R
  // Collective over ep.comm (every rank of the group, in the same order).
  Tensor to_experts(const Tensor& xp) const;    // (R, C) → (Re, C)
  Tensor from_experts(const Tensor& ye) const;  // (Re, C) → (R, C)

 private:
  ExpertParallel ep_;
  int64_t experts_ = 0, local_ = 0;             // E, El
  std::vector<int64_t> all_counts_;             // (ep · E): rank s's count of expert e at s·E + e
  std::vector<int64_t> local_counts_;           // (El) Σ over sources
  int64_t local_rows_ = 0, rows_ = 0;
  std::vector<int64_t> send_, recv_;            // (ep) alltoall: rows to / from each rank
  std::vector<int64_t> gathered_;               // (ep) allgather: each rank's R
  Tensor regroup_;  // i32: alltoall (Re): received row → its row in xe; allgather (Σ R): gathered row → xe row or −1
};

}  // namespace mpitron
