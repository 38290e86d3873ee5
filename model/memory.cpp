#include "model/memory.h"

#include <algorithm>
#include <cstdio>

#include "core/error.h"

namespace mpitron {

std::string MemoryEstimate::to_string() const {
  auto mb = [](int64_t b) { return static_cast<double>(b) / 1e6; };
  char buf[384];
  std::snprintf(buf, sizeof buf,
                "weights %.1f MB | gradients %.1f MB | master weights %.1f MB | moments %.1f MB | "
                "activations %.1f MB%s | total %.1f MB",
                mb(weights), mb(gradients), mb(master_weights), mb(moments), mb(activations),
                comm_staging ? str(" | MPI reduce-scatter staging ", static_cast<double>(comm_staging) / 1e6, " MB").c_str()
                             : "",
                mb(total()));
  return buf;
}

MemoryEstimate estimate_memory(const GPTConfig& c, int64_t micro_batch, int dp, int zero_stage, bool recompute,
                               const RankShard& r) {
  const int64_t P = r.params, C = c.hidden_size, F = c.ffn(), t = r.tp;
  const int64_t N = micro_batch * c.seq_length, Nl = r.sequence_parallel ? N / t : N, V = c.padded_vocab_size;
  const int64_t e = static_cast<int64_t>(dtype_size(c.compute_dtype));
  const int64_t shard = zero_stage > 0 ? (P + dp - 1) / dp : P;
  MemoryEstimate m;
  m.weights = P * e;
  m.gradients = 4 * P;
  m.master_weights = c.compute_dtype == DType::F32 ? 0 : 4 * shard;
  m.moments = 8 * shard;
  const int64_t per_block = (4 * N * C / t + 4 * Nl * C + 2 * N * F / t) * e +
                            4 * (4 * Nl + micro_batch * (c.num_attention_heads / t) * c.seq_length);
  const int64_t L = r.layers_per_chunk;
  int64_t first_ends = 0, last_ends = 0;
  if (r.first_stage) first_ends = (N * C + 2 * Nl * C) * e;  // lookups and their sum
  if (r.last_stage)  // lnf, its gathered copy (t > 1), logits (= dlogits, kept to backward), head backward temporaries
    last_ends = (Nl * C + (t > 1 ? N * C : 0) + N * V / t + N * C) * e + 4 * 2 * Nl;
  // What one (micro-batch, chunk) keeps from its forward to its backward; with
  // recompute only the blocks' inputs/outputs (one block is rebuilt at a time).
  auto chunk_bytes = [&](int c) {
    const int64_t Lr = !recompute ? 0 : r.recompute_layers > 0 ? std::min(L, r.recompute_layers) : L;
    int64_t b = Lr * 2 * Nl * C * e + (L - Lr) * per_block;
    if (c == 0) b += first_ends;
    if (c == r.num_chunks - 1) b += last_ends;
    return b;
  };
  int64_t peak = 0;
  if (r.compute_order.empty()) {
    for (int c = 0; c < r.num_chunks; ++c) peak += chunk_bytes(c);
  } else {
    int64_t live = 0;
    for (const auto& [c, fwd] : r.compute_order) {
      live += fwd ? chunk_bytes(c) : -chunk_bytes(c);
      peak = std::max(peak, live);
    }
  }
  // Backward of one block at a time: its gradient temporaries (dmlp, dg, dln2, dx2,
  // dproj, datt, dqkv, dln1, dx).
  const int64_t block_bwd = (5 * N * C + 4 * N * C / t + 2 * Nl * C + N * F / t + (Nl < N ? N * C : 0)) * e;
  m.activations = peak + (recompute ? per_block : 0) + (L > 0 ? block_bwd : 0);
  if (r.mpi_zero_staging && zero_stage > 0) m.comm_staging = 4 * shard;
  return m;
}

}  // namespace mpitron
