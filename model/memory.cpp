#include "model/memory.h"

#include <algorithm>
#include <cstdio>

#include "core/error.h"
#include "model/block.h"
#include "model/param_table.h"

namespace mpitron {

std::string MemoryEstimate::to_string() const {
  auto mb = [](int64_t b) { return static_cast<double>(b) / 1e6; };
  char buf[512];
  std::snprintf(buf, sizeof buf,
                "weights %.1f MB | gradients %.1f MB | master weights %.1f MB | moments %.1f MB | "
                "activations %.1f MB%s%s | total %.1f MB%s",
                mb(weights), mb(gradients), mb(master_weights), mb(moments), mb(activations),
                comm_staging ? str(" | MPI reduce-scatter staging ", static_cast<double>(comm_staging) / 1e6, " MB").c_str()
                             : "",
                device_workspace ? str(" | cuBLASLt workspace ", mb(device_workspace), " MB").c_str() : "",
                mb(total()),
                host_optimizer ? str(" (+ optimizer state in host memory ", mb(host_optimizer), " MB)").c_str() : "");
  return buf;
}

void check_fits_memory(const GPTConfig& c, int64_t micro_batch, int tp, int pp, int dp, int zero_stage,
                       int64_t capacity, const std::string& device_name, int cp, int ep) {
  // The largest rank holds at least the average share (of the experts, E/ep of them).
  double experts = 0;
  if (ep > 1)
    for (const ParamSpec& s : param_table(c))
      if (s.expert >= 0) experts += static_cast<double>(shape_numel(s.global_shape));
  const double params =
      (static_cast<double>(c.num_parameters()) - experts * (1.0 - 1.0 / ep)) / (static_cast<double>(tp) * pp);
  const double e = static_cast<double>(dtype_size(c.compute_dtype));
  const double shard = zero_stage > 0 ? params / dp : params;
  const double whole = zero_stage == 3 ? shard : params;  // ZeRO-3 holds its shard of the values and gradients
  const double state = whole * (e + 4) + shard * ((c.compute_dtype == DType::F32 ? 0 : 4) + 8);
  TensorParallel tpl;
  tpl.size = tp;
  const double block =
      static_cast<double>(block_memory(block_shape(c, micro_batch, c.seq_length / cp, tpl, true, 0), *layer_spec(c, 0)).saved_act) * e;
  const double need = state + block;
  const double cap = static_cast<double>(capacity);
  MPT_CHECK(need <= cap,
            str("the model cannot fit: one rank needs at least ", need / 1e9, " GB (", params,
                " parameters x ", (state / std::max(params, 1.0)), " bytes of weights, gradients and optimizer state, + ",
                block / 1e9, " GB of one block's activations) but ", device_name, " has ", cap / 1e9, " GB"),
            "lower --num-layers / --hidden-size / --ffn-hidden-size / --micro-batch-size / --seq-length, or use more "
            "ranks (tensor / pipeline parallelism, --use-distributed-optimizer, --zero-stage 3)");
}

void check_estimate_fits(const MemoryEstimate& e, int64_t capacity, const std::string& device_name) {
  MPT_CHECK(e.total() <= capacity,
            str("the memory estimate per rank (", e.to_string(), ") exceeds the ",
                static_cast<double>(capacity) / 1e6, " MB of ", device_name),
            "lower the model or micro-batch size, use --recompute-activations, or use more ranks");
}

int64_t cp_attention_bytes(const GPTConfig& c, int64_t micro_batch, const RankShard& r) {
  if (r.cp <= 1) return 0;
  const int64_t e = static_cast<int64_t>(dtype_size(c.compute_dtype)), HD = c.hidden_size / c.num_attention_heads;
  const int64_t N = micro_batch * (c.seq_length / r.cp), Nt = N * r.cp;  // this rank's tokens, the sequence's
  const int64_t q = c.num_attention_heads / r.tp * HD, kv = c.query_groups() / r.tp * HD;  // per token
  switch (r.cp_comm) {
    case CpCommType::P2P:  // K/V at hand and arriving, dK/dV share + accumulator sent + received (f32),
                           // dQ (f32), one block's dq/dk/dv
      return 2 * 2 * N * kv * e + 3 * 2 * N * kv * 4 + N * q * 4 + (N / 2) * (q + 2 * kv) * e;
    case CpCommType::AllGather:  // every rank's K/V and them in order, f32 dK/dV by chunk and by owner,
                                 // one query chunk's dk/dv over its keys
      return 2 * 2 * Nt * kv * e + 2 * 2 * Nt * kv * 4 + 2 * Nt * kv * e;
    case CpCommType::AllToAll:  // send/receive buffers and the head-sharded qkv, out, dout, dqkv
      return 2 * N * (q + 2 * kv) * e + 2 * N * (q + 2 * kv) * e + 2 * N * q * e;
  }
  return 0;
}

MemoryEstimate estimate_memory(const GPTConfig& c, int64_t micro_batch, int dp, int zero_stage, bool recompute,
                               const RankShard& r) {
  const int64_t P = r.params, C = c.hidden_size, t = r.tp;
  // N: this rank's tokens of the micro-batch (T/cp per sample with context parallelism).
  const int64_t N = micro_batch * (c.seq_length / r.cp), Nl = r.sequence_parallel ? N / t : N, V = c.padded_vocab_size;
  const int64_t e = static_cast<int64_t>(dtype_size(c.compute_dtype));
  const int64_t shard = r.optimizer_shard >= 0 ? r.optimizer_shard : zero_stage > 0 ? (P + dp - 1) / dp : P;
  MemoryEstimate m;
  m.weights = P * e;
  m.gradients = 4 * P;
  m.master_weights = c.compute_dtype == DType::F32 ? 0 : 4 * shard;
  m.moments = 4 * r.optimizer_states * shard;
  if (zero_stage == 3) {
    // Blocks whose gradients are being computed: one, or under a split backward every
    // block of this rank (each may await its W); plus the block being reduced and
    // this rank's piece of its sum.
    bool split_bw = false;
    for (const auto& a : r.compute_order) split_bw |= a.second == 'W';
    const int64_t computing = split_bw ? std::max<int64_t>(1, r.layers_per_chunk * r.num_chunks) : 1;
    const int64_t live = std::max<int64_t>(r.zero3_live, split_bw ? computing : 0);
    const int64_t blocks_w = e * live * r.zero3_block,
                  blocks_g = 4 * ((computing + 1) * r.zero3_block + (r.zero3_block + dp - 1) / dp);
    // A table's gathered values (forward, the output layer's input gradient) or its f32
    // gradient (reduced while the activations are mostly freed): the larger, 4 bytes.
    const int64_t table = 4 * r.zero3_outside;
    m.weights = e * (shard + r.zero3_persistent) + (blocks_w + blocks_g >= table ? blocks_w : 0);
    m.gradients = 4 * (shard + r.zero3_persistent) + (blocks_w + blocks_g >= table ? blocks_g : table);
    // A table's later reductions in a step (the tied embedding's lookup after its head) receive
    // this rank's piece beside the gradient, when the activations are mostly freed.
    if (table > blocks_w + blocks_g) m.comm_staging = 4 * ((r.zero3_outside + dp - 1) / dp);
  }
  if (r.optimizer_offload) {  // master + moments, the gradients' and (16-bit) the values' host copies
    m.host_optimizer = 4 * shard + m.moments + 4 * shard + (e < 4 ? e * shard : 0);
    m.master_weights = m.moments = 0;
  }
  TensorParallel tpl;
  tpl.size = static_cast<int>(t);
  tpl.sequence_parallel = r.sequence_parallel;
  ContextParallel cpl;
  cpl.size = r.cp;
  cpl.type = r.cp_comm;
  BlockMemory bm = block_memory(block_shape(c, micro_batch, c.seq_length / r.cp, tpl, true, 0, cpl), *layer_spec(c, 0));
  if (c.t5) {  // T5: the mean of the encoder's and the decoder's blocks (Td tokens and cross-attention), the larger backward
    const BlockMemory d = block_memory(block_shape(c, micro_batch, c.decoder_seq_length, tpl, true, c.encoder_num_layers),
                                       *layer_spec(c, c.encoder_num_layers));
    const int64_t le = c.encoder_num_layers, ld = c.decoder_num_layers(), L = c.num_layers;
    const auto mean = [&](int64_t a, int64_t b) { return (le * a + ld * b + L - 1) / L; };
    bm = {mean(bm.saved_act, d.saved_act), mean(bm.saved_f32, d.saved_f32), std::max(bm.backward_act, d.backward_act),
          mean(bm.deferred_act, d.deferred_act)};
  }
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
  const int64_t block_bwd = bm.backward_act * e + cp_attention_bytes(c, micro_batch, r);
  m.activations = peak + (recompute ? per_block : 0) + (L > 0 ? block_bwd : 0);
  // ZeRO-1/2 reduce in place into the gradient buffer's own slice, which MPI cannot do
  // (MPI_IN_PLACE puts the result at the buffer's start): a shard-sized receive buffer.
  // ZeRO-3 reduces each block into a buffer of its own: nothing staged.
  if (r.mpi_zero_staging && (zero_stage == 1 || zero_stage == 2)) m.comm_staging = 4 * shard;
  return m;
}

}  // namespace mpitron
