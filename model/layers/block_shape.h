// model/layers/block_shape.h — what one call of a block sees: the micro-batch's sizes, the
// parallel layout, dropout, how attention runs (its core) and the call's extra inputs. The
// per-layer choices (heads, rope, window, MLP kind, norms, …) are not here: they belong to the
// layer's sublayer objects (model/layers/layer_spec.h).
#pragma once
#include <cstdint>
#include <memory>
#include <vector>

#include "model/config.h"
#include "model/layers/moe_shape.h"
#include "model/tensor_parallel.h"
#include "parallel/context_parallel.h"
#include "parallel/expert_parallel.h"
#include "tensor/tensor.h"

namespace mpitron {

class AttentionCore;  // model/layers/attention_core.h

// A T5 decoder block's second input (model/layers/cross_attention_layer.h): the encoder's output.
struct CrossInput {
  Tensor memory;       // (Ml, C) this rank's rows of the encoder's output (M = B·Te; M/t with SP)
  Tensor memory_grad;  // (Ml, C): the backward ADDS d loss / d memory here (summed over decoder layers)
  Tensor lengths;      // (B) i32 on the device: encoder keys j >= lengths[b] masked; undefined: none
  int64_t seq = 0;     // Te, the encoder's tokens per sample
  uint64_t attention_offset = 0;  // the cross-attention dropout's Philox stream
  // (M, 2·Gl·HD) this layer's keys and values of memory, computed once (cross_attention_kv, T5's
  // cached decoder: model/t5_decode.h); undefined: the sublayer projects memory itself (training).
  Tensor kv;
  bool active() const { return memory.defined(); }
};

// What a Mixture-of-Experts sublayer needs from its call (the layer's own settings are its MoeShape).
struct MoeCall {
  ExpertParallel ep{};          // expert parallelism: this rank runs experts [ep.first(E), … + E/ep)
  const MoeRun* run = nullptr;  // null: no auxiliary losses, no capacity, no stats (evaluation, generation)
  bool record = true;           // false in a recomputed forward: adds nothing to run->stats
  int64_t layer = -1;           // the global layer (MoeStats::layer_tokens)
};

struct BlockShape {
  int64_t batch = 1, seq = 1;  // seq: this rank's tokens of each sequence (T/cp with context parallelism)
  int64_t hidden = 0;          // C, the residual stream's width
  float dropout = 0.0f;        // hidden dropout (after each sublayer)
  TensorParallel tp{};
  float attention_dropout = 0.0f;  // on the attention probabilities
  uint64_t attention_offset = 0;   // its Philox stream (attention.h): layer l uses l·⌈T²/4⌉
  ContextParallel cp{};            // context parallelism: this rank holds seq = T/cp of each sequence's tokens
  // How self-attention runs over the call's rows (model/layers/attention_core.h): null is the local
  // core (causal / padded / windowed attention over (B, T)); context parallelism, T5's relative bias
  // and the KV-cache decoders supply their own.
  std::shared_ptr<const AttentionCore> core;
  CrossInput cross{};  // a decoder block's cross-attention input (T5); inactive: none
  MoeCall moe{};

  int64_t tokens() const { return batch * seq; }                   // N
  int64_t global_seq() const { return seq * cp.size; }             // T: the whole sequence
  int64_t global_tokens() const { return batch * global_seq(); }   // B·T of the single-process run
  int64_t local_rows() const { return tp.local_rows(tokens()); }   // rows of x and y
};

// The (N, C) rows a column-parallel matmul reads from this rank's (Nl, C): the
// tensor itself, or its rows all-gathered over the TP group with sequence parallelism.
inline Tensor gather_rows(const BlockShape& s, const Tensor& t) {
  return s.tp.sequence_parallel ? tp_all_gather_rows(s.tp, t) : t;
}
// This rank's rows of a row-parallel partial output (N, C), summed over the TP group:
// all-reduced in place, or reduce-scattered to (Nl, C) with sequence parallelism.
inline Tensor reduce_rows(const BlockShape& s, const Tensor& full) {
  if (s.tp.sequence_parallel) return tp_reduce_scatter_rows(s.tp, full);
  tp_all_reduce(s.tp, full);
  return full;
}

// This rank's activation rows (x, y: (Nl, C)) as runs of consecutive rows of the
// single-process (B·T, C) activation: local row, global row, count. One run
// without context parallelism (rows first_row … of the TP split); with it, each
// sample's two chunks (cut further by sequence parallelism). Dropout masks and
// positions follow the global rows, so every layout draws the one-process masks.
struct RowRun {
  int64_t local, global, len;
};
std::vector<RowRun> activation_row_runs(const BlockShape& s);
std::vector<RowRun> activation_row_runs(int64_t batch, int64_t seq, const TensorParallel& tp, const ContextParallel& cp);

// The call shape of layer l of `cfg` for a micro-batch (batch, seq) under `tp` (and `cp`:
// seq is then this rank's T/cp tokens); train false: no dropout.
BlockShape block_shape(const GPTConfig& cfg, int64_t batch, int64_t seq, const TensorParallel& tp, bool train,
                       int64_t layer, const ContextParallel& cp = {});

}  // namespace mpitron
