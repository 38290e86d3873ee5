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
#include <cstdint>
#include <string>

#include "model/config.h"

namespace mpitron {

struct MemoryEstimate {
  int64_t weights = 0, gradients = 0, master_weights = 0, moments = 0, activations = 0;
  int64_t total() const { return weights + gradients + master_weights + moments + activations; }
  std::string to_string() const;
};

MemoryEstimate estimate_memory(const GPTConfig& c, int64_t micro_batch, int dp, int zero_stage, bool recompute);

}  // namespace mpitron
