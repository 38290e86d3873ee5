#include "model/memory.h"

#include <cstdio>

#include "core/error.h"

namespace mpitron {

std::string MemoryEstimate::to_string() const {
  auto mb = [](int64_t b) { return static_cast<double>(b) / 1e6; };
  char buf[256];
  std::snprintf(buf, sizeof buf,
                "weights %.1f MB | gradients %.1f MB | master weights %.1f MB | moments %.1f MB | "
                "activations %.1f MB | total %.1f MB",
                mb(weights), mb(gradients), mb(master_weights), mb(moments), mb(activations), mb(total()));
  return buf;
}

MemoryEstimate estimate_memory(const GPTConfig& c, int64_t micro_batch, int dp, int zero_stage, bool recompute) {
  const int64_t P = c.num_parameters(), C = c.hidden_size, F = c.ffn(), L = c.num_layers;
  const int64_t N = micro_batch * c.seq_length, V = c.padded_vocab_size;
  const int64_t e = static_cast<int64_t>(dtype_size(c.compute_dtype));
  const int64_t shard = zero_stage > 0 ? (P + dp - 1) / dp : P;
  MemoryEstimate m;
  m.weights = P * e;
  m.gradients = 4 * P;  // one full f32 buffer (ZeRO-2 keeps it as scratch, see parallel/zero.h)
  m.master_weights = c.compute_dtype == DType::F32 ? 0 : 4 * shard;
  m.moments = 8 * shard;
  const int64_t per_block = (8 * N * C + 2 * N * F) * e + 4 * (4 * N + micro_batch * c.num_attention_heads * c.seq_length);
  const int64_t kept = recompute ? L * 2 * N * C * e + per_block : L * per_block;
  const int64_t ends = (3 * N * C + N * C + N * V + N * C) * e + 4 * 2 * N;
  m.activations = kept + ends;
  return m;
}

}  // namespace mpitron
