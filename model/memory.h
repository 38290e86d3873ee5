// model/memory.h — what one rank's tensors will hold, printed at start-up.
//
// Weights, gradients, master weights and Adam moments are exact byte counts of
// this rank's flat buffers (with ZeRO: the shards of parallel/zero.h's ShardLayout). Activations
// are the tensors alive at the peak, walked over the rank's schedule (RankShard).
// N = micro-batch × sequence tokens. Workspace of the ops (BLAS scratch,
// cuBLASLt / cuDNN workspaces) is not included.
#pragma once
#include <algorithm>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "model/config.h"
#include "parallel/context_parallel.h"

namespace mpitron {

struct MemoryEstimate {
  int64_t weights = 0, gradients = 0, master_weights = 0, moments = 0, activations = 0;
  // ZeRO over the MPI backend: reduce-scatter results are staged (MPI_IN_PLACE
  // would leave them at the buffer's start), one shard in total; they live
  // while the gradients are reduced, when most activations are gone, so the
  // peak counts the larger of the two. ZeRO-3: the piece of a table's reduction.
  int64_t comm_staging = 0;
  // CUDA: the cuBLASLt workspace (32 MiB per stream, tensor/cuda/common.cu), held
  // from the first matmul for the process lifetime. 0 on the CPU.
  int64_t device_workspace = 0;
  // --optimizer-cpu-offload: master weights and moments in host memory (not in total()),
  // and the update's host copies of the gradients (and 16-bit values).
  int64_t host_optimizer = 0;
  int64_t total() const {
    return weights + gradients + master_weights + moments + std::max(activations, comm_staging) + device_workspace;
  }
  std::string to_string() const;
};

// One rank's share (one process: the defaults with params and layers set):
// its parameters, the layers of each of its chunks, whether it holds the
// embeddings / the head, and which (micro-batch, chunk) forwards the schedule
// keeps alive at once. With t tp ranks and Nl = N (or N/t with sequence
// parallelism) local rows, compute dtype unless noted:
//   per block, saved for its backward: ln1, ln2, x2, y (4·Nl·C; sequence
//     parallelism gathers ln1/ln2 again in backward), qkv and att (4·N·C/t),
//     fc and gelu (2·N·F/t); f32 mean/rstd ×2 (4·Nl), lse (B·NH/t·T);
//     with --recompute-activations only its input and output (2·Nl·C), and one
//     block's set is rebuilt at a time;
//   one block's backward temporaries at a time;
//   first stage: the word/position lookups and their sum; last stage: final
//     LN, logits = dlogits in place (N·V/t) and the head's backward temporaries.
struct RankShard {
  int64_t params = 0;              // this rank's parameter count (ParamSet::numel)
  int optimizer_states = 2;        // f32 optimizer states per element (--optimizer adam 2, sgd 1)
  // Elements of the master weights and optimizer states this rank holds when its ZeRO shard is not the
  // even split (dist_muon's whole tensors: ShardLayout::whole_tensors); -1: ceil(params / dp).
  int64_t optimizer_shard = -1;
  int tp = 1;
  bool sequence_parallel = false;
  int64_t layers_per_chunk = 0;
  int num_chunks = 1;
  bool first_stage = true, last_stage = true;  // chunk 0 holds the embeddings / the last chunk the head
  // This rank's pipeline compute actions in order: (local chunk, 'F', 'B' or 'W').
  // Activations of a (micro-batch, chunk) live from its F to its B; with a split
  // backward (W actions) B frees all but what the deferred weight gradients hold
  // (BlockMemory::deferred_act per block), which W frees. The estimate takes the
  // largest sum over the schedule. Empty: one micro-batch through every chunk at
  // a time (no pipeline).
  std::vector<std::pair<int, char>> compute_order;
  bool mpi_zero_staging = false;  // ZeRO with the MPI backend (see MemoryEstimate::comm_staging)
  int64_t recompute_layers = 0;   // with recompute: blocks of each chunk recomputed (0: all;
                                  //   --recompute-method block --recompute-num-layers N)
  // Context parallelism: every activation above holds T/cp tokens per sample (N =
  // micro-batch × T/cp), and one attention call's transient buffers (the comm type's:
  // the ring's K/V pair and f32 dK/dV accumulators; all_gather's whole-sequence K/V
  // and their f32 gradients; a2a's head-sharded copies) add to the backward peak.
  int cp = 1;
  CpCommType cp_comm = CpCommType::P2P;
  // ZeRO-3 (model/training/states_zero3.cpp): besides its shards a rank holds the
  // persistent units whole (values and gradients), and gathered either blocks or one table:
  // `zero3_live` blocks of at most zero3_block elements and two blocks' gradients (one
  // computing, one reducing, with this rank's piece of its sum; under a split backward (W
  // actions in compute_order) every local block may hold its values and gradients until its
  // W), or an embedding/output table of at most zero3_outside elements, its values or its
  // f32 gradient (never both).
  int64_t zero3_block = 0, zero3_outside = 0, zero3_persistent = 0;
  int zero3_live = 1;
  // --optimizer-cpu-offload on a device: the master weights and moments are host memory.
  bool optimizer_offload = false;
};
// Before anything is allocated: a lower bound of one rank's bytes (its share of
// the weights, f32 gradients, master weights and Adam moments, plus one block's
// saved activations), computed in double so absurd sizes (--num-layers
// 99999999999) cannot overflow, against `capacity` bytes of `device_name`.
// Throws, with the numbers, when it cannot fit.
// cp: the context-parallel size (the activations hold T/cp tokens per sample); dp is the
// number of ranks ZeRO shards over (dp × cp with context parallelism; the edp group with
// expert parallelism). ep: the expert-parallel size (each rank holds E/ep experts).
void check_fits_memory(const GPTConfig& c, int64_t micro_batch, int tp, int pp, int dp, int zero_stage,
                       int64_t capacity, const std::string& device_name, int cp = 1, int ep = 1);
// The full estimate (estimate_memory) against the capacity: the same refusal.
void check_estimate_fits(const MemoryEstimate& e, int64_t capacity, const std::string& device_name);

// dp: the ranks ZeRO shards over (dp × cp with context parallelism).
MemoryEstimate estimate_memory(const GPTConfig& c, int64_t micro_batch, int dp, int zero_stage, bool recompute,
                               const RankShard& r);
// One context-parallel attention call's transient bytes at its peak (its backward),
// for B samples of T tokens split over r.cp ranks (0 without context parallelism).
int64_t cp_attention_bytes(const GPTConfig& c, int64_t micro_batch, const RankShard& r);

}  // namespace mpitron
