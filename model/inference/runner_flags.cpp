#include "model/inference/runner_flags.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "model/inference/kv_block_allocator.h"

namespace mpitron {

RunnerOptions runner_options(const InferenceFlags& f) {
  RunnerOptions o;
  o.tp = static_cast<int>(f.tp);
  o.pp = static_cast<int>(f.pp);
  o.dtype = f.dtype();
  o.device = f.device;
  o.force_mpi_for_device = f.force_mpi_for_device;
  o.num_speculative_tokens = f.batching.num_speculative_tokens;
  return o;
}

int64_t kv_cache_blocks(const DynamicBatchingFlags& b, const ModelRunner& runner, int64_t max_requests) {
  const int64_t per_block = runner.kv_bytes_per_block(b.block_size);
  const int64_t one_seq = blocks_for(runner.config().max_position_embeddings, b.block_size);
  const double gib = 1024.0 * 1024.0 * 1024.0;
  if (b.buffer_size_gb > 0) {
    const int64_t n = static_cast<int64_t>(std::floor(b.buffer_size_gb * gib / static_cast<double>(per_block)));
    MPT_CHECK(n >= one_seq,
              str("--inference-dynamic-batching-buffer-size-gb ", b.buffer_size_gb, " holds ", n, " KV blocks of ",
                  per_block, " bytes; one sequence of max_position_embeddings = ",
                  runner.config().max_position_embeddings, " needs ", one_seq, " (",
                  static_cast<double>(one_seq * per_block) / gib, " GiB)"),
              "raise --inference-dynamic-batching-buffer-size-gb");
    return n;
  }
  const int64_t cap = static_cast<int64_t>(gib / static_cast<double>(per_block));
  return std::max(one_seq, std::min(std::max<int64_t>(max_requests, 1) * one_seq, cap));
}

EngineConfig engine_config(const DynamicBatchingFlags& b, int64_t max_requests) {
  EngineConfig e;
  e.max_requests = max_requests;
  e.max_tokens = b.max_tokens;
  e.chunked_prefill = b.chunked_prefill;
  e.num_speculative_tokens = b.num_speculative_tokens;
  e.prefix_caching.enabled = b.prefix_caching;
  e.prefix_caching.eviction = parse_prefix_eviction(b.prefix_caching_eviction_policy);
  return e;
}

}  // namespace mpitron
