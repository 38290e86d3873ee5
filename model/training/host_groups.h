// model/training/host_groups.h — sums of host scalars (losses, counts, stop decisions)
// over the trainer's groups.
//
// They run on MPI-backend Communicators of the same groups, so they have the
// communicator timeout: a frozen rank is named and the job ends (parallel/job_exit.h)
// instead of a blocking MPI_Allreduce spinning for ever. A null group (one process,
// or no such parallelism) is the identity.
#pragma once
#include <map>
#include <memory>
#include <vector>

#include <mpi.h>

#include "model/training/parallel_context.h"
#include "parallel/communicator.h"

namespace mpitron {

class HostGroups {
 public:
  // Collective over every group of `par`, in the same order on every rank.
  explicit HostGroups(const ParallelContext& par);

  // Element-wise sum of v over `comm`, one collective for the whole vector: the values are
  // gathered and summed in rank order, so every rank gets the same bits.
  std::vector<double> sum_over(MPI_Comm comm, std::vector<double> v) const;
  double sum_over(MPI_Comm comm, double v) const { return sum_over(comm, std::vector<double>{v})[0]; }
  // Every rank's v, rank after rank (group rank order), on every rank of `comm`.
  std::vector<double> gather_over(MPI_Comm comm, const std::vector<double>& v) const;

  // Sum over the pipeline group: the last stage's values reach every stage.
  double pp_sum(double v) const { return sum_over(par_.pp_comm, v); }
  double dp_sum(double v) const { return sum_over(par_.dp_comm, v); }
  // Context parallelism: each cp rank's loss is the mean over its part of every sequence
  // (equal token counts), so their mean is the whole sequence's.
  double cp_mean(double v) const { return sum_over(par_.cp_comm, v) / static_cast<double>(par_.cp_size); }
  std::vector<double> pp_sum(std::vector<double> v) const { return sum_over(par_.pp_comm, std::move(v)); }
  std::vector<double> dp_sum(std::vector<double> v) const { return sum_over(par_.dp_comm, std::move(v)); }
  // Last-stage values (0 elsewhere) summed over `count` micro-batches of every dp rank, as
  // their means: summed over the pipeline, averaged over cp, summed over dp, divided by count.
  std::vector<double> last_stage_mean(std::vector<double> v, double count) const;

  // Every rank (stop decisions): the sum of v, and the bitwise OR of v (one verdict for all).
  double world_sum(double v) const { return sum_over(world(), v); }
  int world_or(int v) const;
  // Every rank's v, world rank after world rank (fingerprints, timings).
  std::vector<double> world_gather(const std::vector<double>& v) const { return gather_over(world(), v); }
  MPI_Comm world() const { return par_.world != MPI_COMM_NULL ? par_.world : par_.dp_comm; }
  int dp_size() const { return par_.dp_size; }

 private:
  void make(MPI_Comm c, const char* name);
  Communicator& host(MPI_Comm c) const { return *comms_.at(c); }

  ParallelContext par_;
  std::map<MPI_Comm, std::unique_ptr<Communicator>> comms_;
};

}  // namespace mpitron
