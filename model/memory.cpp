#include "model/memory.h"

#include <algorithm>
#include <cstdio>

#include "core/error.h"
#include "model/block.h"

namespace mpitron {

std::string MemoryEstimate::to_string() const {
  auto mb = [](int64_t b) { return static_cast<double>(b) / 1e6; };
  char buf[384];
  std::snprintf(buf, sizeof buf,
                "weights %.1f MB | gradients %.1f MB | master weights %.1f MB | moments %.1f MB | "
                "activations %.1f MB%s%s | total %.1f MB",
                mb(weights), mb(gradients), mb(master_weights), mb(moments), mb(activations),
                comm_staging ? str(" | MPI reduce-scatter staging ", static_cast<double>(comm_staging) / 1e6, " MB").c_str()
                             : "",
                device_workspace ? str(" | cuBLASLt workspace ", mb(device_workspace), " MB").c_str() : "",
                mb(total()));
  return buf;
}

void check_fits_memory(const GPTConfig& c, int64_t micro_batch, int tp, int pp, int dp, int zero_stage,
                       int64_t capacity, const std::string& device_name) {
  // The largest rank holds at least the average share.
  const double params = static_cast<double>(c.num_parameters()) / (static_cast<double>(tp) * pp);
  const double e = static_cast<double>(dtype_size(c.compute_dtype));
  const double shard = zero_stage > 0 ? params / dp : params;
  const double state = params * (e + 4) + shard * ((c.compute_dtype == DType::F32 ? 0 : 4) + 8);
  TensorParallel tpl;
  tpl.size = tp;
  const double block =
      static_cast<double>(block_memory(block_shape(c, micro_batch, c.seq_length, tpl, true, 0)).saved_act) * e;
  const double need = state + block;
  const double cap = static_cast<double>(capacity);
  MPT_CHECK(need <= cap,
            str("the model cannot fit: one rank needs at least ", need / 1e9, " GB (", params,
                " parameters x ", (state / std::max(params, 1.0)), " bytes of weights, gradients and optimizer state, + ",
                block / 1e9, " GB of one block's activations) but ", device_name, " has ", cap / 1e9, " GB"),
            "lower --num-layers / --hidden-size / --ffn-hidden-size / --micro-batch-size / --seq-length, or use more "
            "ranks (tensor / pipeline parallelism, --use-distributed-optimizer)");
}

void check_estimate_fits(const MemoryEstimate& e, int64_t capacity, const std::string& device_name) {
  MPT_CHECK(e.total() <= capacity,
            str("the memory estimate per rank (", e.to_string(), ") exceeds the ",
                static_cast<double>(capacity) / 1e6, " MB of ", device_name),
            "lower the model or micro-batch size, use --recompute-activations, or use more ranks");
}

MemoryEstimate estimate_memory(const GPTConfig& c, int64_t micro_batch, int dp, int zero_stage, bool recompute,
                               const RankShard& r) {
  const int64_t P = r.params, C = c.hidden_size, t = r.tp;
  const int64_t N = micro_batch * c.seq_length, Nl = r.sequence_parallel ? N / t : N, V = c.padded_vocab_size;
  const int64_t e = static_cast<int64_t>(dtype_size(c.compute_dtype));
  const int64_t shard = zero_stage > 0 ? (P + dp - 1) / dp : P;
  MemoryEstimate m;
  m.weights = P * e;
  m.gradients = 4 * P;
  m.master_weights = c.compute_dtype == DType::F32 ? 0 : 4 * shard;
  m.moments = 8 * shard;
  TensorParallel tpl;
  tpl.size = static_cast<int>(t);
  tpl.sequence_parallel = r.sequence_parallel;
  const BlockMemory bm = block_memory(block_shape(c, micro_batch, c.seq_length, tpl, true, 0));
  const int64_t per_block = bm.saved_act * e + 4 * bm.saved_f32;
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
  // What a split backward's B leaves for W (the weight-gradient work holds it).
  const int64_t keep = L * bm.deferred_act * e;
  bool split = false;
  for (const auto& a : r.compute_order) split |= a.second == 'W';
  int64_t peak = 0;
  if (r.compute_order.empty()) {
    for (int c = 0; c < r.num_chunks; ++c) peak += chunk_bytes(c);
  } else {
    int64_t live = 0;
    for (const auto& [c, op] : r.compute_order) {
      if (op == 'F') live += chunk_bytes(c);
      else if (op == 'B') live += (split ? keep : 0) - chunk_bytes(c);
      else live -= keep;
      peak = std::max(peak, live);
    }
  }
  // Backward of one block at a time: its gradient temporaries (model/block.h).
  const int64_t block_bwd = bm.backward_act * e;
  m.activations = peak + (recompute ? per_block : 0) + (L > 0 ? block_bwd : 0);
  if (r.mpi_zero_staging && zero_stage > 0) m.comm_staging = 4 * shard;
  return m;
}

}  // namespace mpitron
