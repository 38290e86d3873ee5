// model/memory.h — what one rank's tensors will hold, printed at start-up.
//
// Weights, gradients, master weights and Adam moments are exact byte counts of
// the flat buffers (parallel/zero.h's accounting for ZeRO). Activations are the
// tensors alive at the peak of a micro-batch, which is the start of backward:
//   per block (saved for its backward, compute dtype unless noted):
//     ln1, att, x2, ln2, y: 5·N·C   qkv: 3·N·C   fc, gelu: 2·N·F
//     mean/rstd ×2: 4·N f32         lse: B·NH·T f32
//   with --recompute-activations a block keeps only its input and output
//   (2·N·C) and one block's set is rebuilt at a time during backward;
//   embeddings and head: wte/wpe lookups and their sum (3·N·C), final LN
//   (N·C + 2·N f32), logits = dlogits in place (N·V), and the head's backward
//   temporaries (N·C).
// N = micro-batch × sequence tokens. Workspace of the ops (BLAS scratch,
// cuBLASLt / cuDNN workspaces) is not included.
#pragma once
#include <algorithm>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "model/config.h"

namespace mpitron {

struct MemoryEstimate {
  int64_t weights = 0, gradients = 0, master_weights = 0, moments = 0, activations = 0;
  // ZeRO over the MPI backend: reduce-scatter results are staged (MPI_IN_PLACE
  // would leave them at the buffer's start), one shard in total; they live
  // while the gradients are reduced, when most activations are gone, so the
  // peak counts the larger of the two.
  int64_t comm_staging = 0;
  int64_t total() const {
    return weights + gradients + master_weights + moments + std::max(activations, comm_staging);
  }
  std::string to_string() const;
};

MemoryEstimate estimate_memory(const GPTConfig& c, int64_t micro_batch, int dp, int zero_stage, bool recompute);

// One rank's share under tensor/pipeline parallelism: its parameters, the
// layers of each of its chunks, whether it holds the embeddings / the head,
// and which (micro-batch, chunk) forwards the schedule keeps alive at once. Per block with t tp
// ranks and Nl = N (or N/t with sequence parallelism) local rows:
//   ln1, ln2, x2 and y (4·Nl·C; sequence parallelism re-gathers ln1/ln2 in
//   backward), qkv and att (4·N·C/t),
//   fc and gelu (2·N·F/t); f32 mean/rstd ×2 (4·Nl), lse (B·NH/t·T).
struct RankShard {
  int64_t params = 0;              // this rank's parameter count (ParamSet::numel)
  int tp = 1;
  bool sequence_parallel = false;
  int64_t layers_per_chunk = 0;
  int num_chunks = 1;
  bool first_stage = true, last_stage = true;  // chunk 0 holds the embeddings / the last chunk the head
  // This rank's pipeline compute actions in order: (local chunk, is forward).
  // Activations of a (micro-batch, chunk) live from its F to its B; the
  // estimate takes the largest sum over the schedule. Empty: one micro-batch
  // through every chunk at a time (no pipeline).
  std::vector<std::pair<int, bool>> compute_order;
  bool mpi_zero_staging = false;  // ZeRO with the MPI backend (see MemoryEstimate::comm_staging)
};
MemoryEstimate estimate_memory(const GPTConfig& c, int64_t micro_batch, int dp, int zero_stage, bool recompute,
                               const RankShard& r);

}  // namespace mpitron
