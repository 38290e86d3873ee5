// model/training/parallel_context.h — the parallel layout the trainer runs in
// (model/training/parallel_runtime.h builds it from a Grid).
//
// Data parallelism: every rank of the dp group runs the same Trainer on its slice of
// each global batch; gradients are averaged over dp (in buckets overlapped with
// backward), or reduce-scattered to ZeRO shards. Tensor parallelism splits every layer
// over the tp group; pipeline parallelism splits the layers over the pp group and runs
// a schedule.
#pragma once
#include <mpi.h>

namespace mpitron {

class Communicator;

struct ParallelContext {
  MPI_Comm dp_comm = MPI_COMM_NULL;  // the dp group (host scalars: losses, flags); NULL: one process
  Communicator* dp = nullptr;        // gradient reduction (the device's backend)
  int dp_rank = 0, dp_size = 1;
  MPI_Comm world = MPI_COMM_NULL;    // every rank (stop decisions); NULL: dp_comm
  int tp_rank = 0, tp_size = 1;
  Communicator* tp = nullptr;        // tensor-parallel group (device tensors)
  int pp_rank = 0, pp_size = 1;
  Communicator* pp = nullptr;        // pipeline group: activations and their gradients
  MPI_Comm pp_comm = MPI_COMM_NULL;  // the same group for host scalars (the last stage's loss)
  Communicator* mp = nullptr;        // tp × pp (same dp rank): the grad norm's sum
  Communicator* embedding = nullptr; // first + last pipeline stage: the tied word embedding's grads
  // Context parallelism (--context-parallel-size): each sequence split over the cp group.
  int cp_rank = 0, cp_size = 1;
  Communicator* cp = nullptr;          // attention across the group (device tensors)
  MPI_Comm cp_comm = MPI_COMM_NULL;    // the same group for host scalars (the loss's mean over its ranks)
  // dp × cp: where gradients are reduced and ZeRO shards when cp > 1 (the cp ranks
  // hold the same parameters); null: dp / dp_comm.
  Communicator* dp_cp = nullptr;
  MPI_Comm dp_cp_comm = MPI_COMM_NULL;
  // Expert parallelism (--expert-model-parallel-size, parallel/grid.h): the ep group, the
  // expert-data-parallel group and tp × pp × ep (the grad norm's sum); null when ep == 1.
  int ep_rank = 0, ep_size = 1;
  Communicator* ep = nullptr;
  Communicator* edp = nullptr;
  Communicator* mp_ep = nullptr;
  MPI_Comm edp_comm = MPI_COMM_NULL;  // the edp group for host scalars
};

}  // namespace mpitron
