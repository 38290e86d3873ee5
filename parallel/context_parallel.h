// parallel/context_parallel.h — context parallelism: one sequence split over the
// ranks of a cp group, attention computed across them (Megatron's
// --context-parallel-size, --cp-comm-type; DeepSpeed's Ulysses).
//
// Layout (causal load balance): a sequence of T tokens is cut into 2·P chunks of
// Tc = T/(2P) tokens; cp rank r holds chunks r and 2P − 1 − r, in that order, as its
// Tl = T/P local rows: local row t < Tc is global position r·Tc + t, row Tc + t is
// (2P − 1 − r)·Tc + t. Every rank then does the same causal attention work.
// Everything outside attention (norms, MLP, dropout, the loss) is per token and
// runs on the local rows as is; attention needs every earlier key:
//
//   p2p (default)  ring attention: each rank's K/V (both chunks) travel around the
//                  ring, posted as non-blocking send/recv before the attention of the
//                  K/V at hand, so the transfer overlaps the compute. Each (query
//                  chunk, key chunk) block runs attention_block_forward (attention_block.h)
//                  and merges by log-sum-exp; blocks whose keys are all later than
//                  their queries (fully masked) are skipped, so a step costs 2 blocks
//                  (3 on the first). Backward: the K/V go around again; each rank adds
//                  its queries' dK/dV share into the dK/dV accumulator that travels with
//                  them (f32), one more hop bringing each home; dQ stays local.
//   all_gather     every rank's K/V gathered first (all_gather), put in sequence order;
//                  each query chunk attends to keys [0, its end) in one block call
//                  (bottom-right causal). Backward gathers again; the dK/dV of all
//                  keys are reduce-scattered (f32, summed) to their owners.
//   a2a            Ulysses: all-to-all from sequence sharding to head sharding
//                  (rank r gets the whole sequence for query heads [r·NH/P, (r+1)·NH/P)
//                  and kv groups [r·G/P, …)), ordinary attention over the whole
//                  sequence, all-to-all back. NH and G must be divisible by P.
//                  The saved lse is then the head-sharded (B, NH/P, T): the same
//                  numel as (B, NH, Tl), stored in the same tensor.
// Attention dropout keys on global positions and global heads (attention_block.h),
// so every comm type drops exactly what one process drops. Attention is causal
// (decoders); a padding mask is not supported (BERT is refused by the model).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "parallel/communicator.h"
#include "tensor/attention.h"

namespace mpitron {

enum class CpCommType { P2P, AllGather, AllToAll };
const char* cp_comm_type_name(CpCommType t);  // "p2p", "all_gather", "a2a"
// Parses --cp-comm-type; throws naming the flag and the choices.
CpCommType parse_cp_comm_type(const std::string& s);

struct ContextParallel {
  Communicator* comm = nullptr;  // the cp group; may be null when size == 1
  int size = 1, rank = 0;
  CpCommType type = CpCommType::P2P;
  bool active() const { return size > 1; }
  // Tc of a sequence of T tokens, and T/P local rows.
  int64_t chunk_len(int64_t T) const { return T / (2 * size); }
  int64_t local_seq(int64_t T) const { return T / size; }
  // The global chunk index of this rank's local chunk l (0 or 1).
  int chunk_id(int l) const { return l == 0 ? rank : 2 * size - 1 - rank; }
  // Global position of local row t (0 <= t < T/P) of a sequence of T tokens.
  int64_t global_position(int64_t t, int64_t T) const;
  // This rank's rows as runs of consecutive global positions: (local row, global
  // position, length) — two runs (one when size == 1). A T-token sequence.
  struct Run {
    int64_t local, global, len;
  };
  std::vector<Run> runs(int64_t T) const;
  // "cp 2 (p2p): rank 1 holds chunks 1 and 2 of 4 (T/4 = 256 tokens each)"
  std::string describe(int64_t T) const;
};

// Attention of this rank's queries over every key of the sequence (causal).
//   qkv  (B, Tl, NH + 2G, HD) this rank's rows of the packed QKV (after rope), contiguous
//   out  (B, Tl, NH, HD) contiguous, lse (B, NH, Tl) f32 (saved for backward; a2a: see above)
//   drop: first_head is the global head of local head 0 (the TP offset); seq is T = Tl·P.
// Collective over cp.comm (every rank of the group calls it with the same shapes).
void cp_attention_forward(const ContextParallel& cp, const Tensor& qkv, const Tensor& out, const Tensor& lse,
                          float scale, const AttentionDropout& drop = {});
// dqkv (qkv's shape) overwritten.
void cp_attention_backward(const ContextParallel& cp, const Tensor& dout, const Tensor& qkv, const Tensor& out,
                           const Tensor& lse, const Tensor& dqkv, float scale, const AttentionDropout& drop = {});

// Checks that a sequence of T tokens with NH query heads and G kv groups (this TP
// rank's) splits over cp; the error names the flags.
void check_context_parallel(const ContextParallel& cp, int64_t T, int64_t heads, int64_t groups);

}  // namespace mpitron
