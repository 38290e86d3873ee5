// model/layers/block_shape.h — the sizes and choices every sublayer of a block reads.
#pragma once
#include <cstdint>
#include <vector>

#include "model/config.h"
#include "model/layers/moe_shape.h"
#include "model/tensor_parallel.h"
#include "parallel/context_parallel.h"
#include "tensor/rope.h"
#include "tensor/tensor.h"

namespace mpitron {

// A T5 decoder block's second input (model/layers/cross_attention_layer.h): the encoder's output.
struct CrossInput {
  Tensor memory;       // (Ml, C) this rank's rows of the encoder's output (M = B·Te; M/t with SP)
  Tensor memory_grad;  // (Ml, C): the backward ADDS d loss / d memory here (summed over decoder layers)
  Tensor lengths;      // (B) i32 on the device: encoder keys j >= lengths[b] masked; undefined: none
  int64_t seq = 0;     // Te, the encoder's tokens per sample
  uint64_t attention_offset = 0;  // the cross-attention dropout's Philox stream
  bool active() const { return memory.defined(); }
};

struct BlockShape {
  int64_t batch, seq, hidden, heads, ffn;  // global sizes (heads, ffn before the TP split); seq: this
                                           // rank's tokens of each sequence (T/cp with context parallelism)
  float dropout;                           // hidden dropout (after each sublayer)
  float eps;                               // norm epsilon
  TensorParallel tp{};
  float attention_dropout = 0.0f;  // on the attention probabilities
  uint64_t attention_offset = 0;   // its Philox stream (attention.h): layer l uses l·⌈T²/4⌉
  int64_t groups = 0;              // query groups G (0: = heads)
  int64_t kv_channels = 0;         // HD (0: hidden / heads)
  Normalization norm = Normalization::LayerNorm;
  MlpKind mlp = MlpKind::GeluTanh;
  bool rope = false;
  RopeArgs rope_args{};
  AttentionMaskKind mask = AttentionMaskKind::Causal;
  int64_t window = 0;    // SlidingWindow: query i sees keys i − window … i (tensor/attention.h)
  Tensor kv_lengths;     // (B) i32 on the device: keys j >= len[b] masked (BERT padding); undefined: none
  bool post_ln = false;  // post-LN block order (model/block.h)
  ContextParallel cp{};     // context parallelism: this rank holds seq = T/cp of each sequence's tokens
                            // (parallel/context_parallel.h); attention runs across the cp group
  MoeShape moe{};           // a Mixture-of-Experts MLP (moe.experts > 0; model/layers/moe_layer.h)
  // T5 (model/t5.h): the stack's relative position bias (T, T, NHl) f32 added to the self-attention
  // scores, and its gradient (T, T, NHl) f32, to which the backward adds; undefined: none.
  Tensor attn_bias, attn_bias_grad;
  CrossInput cross{};       // a decoder block's cross-attention input (T5); inactive: none

  int64_t tokens() const { return batch * seq; }                   // N
  int64_t global_seq() const { return seq * cp.size; }             // T: the whole sequence
  int64_t global_tokens() const { return batch * global_seq(); }   // B·T of the single-process run
  int64_t local_rows() const { return tp.local_rows(tokens()); }   // rows of x and y
  int64_t head_dim() const { return kv_channels > 0 ? kv_channels : hidden / heads; }
  int64_t kv_groups() const { return groups > 0 ? groups : heads; }
  int64_t local_heads() const { return heads / tp.size; }          // NHl
  int64_t local_groups() const { return kv_groups() / tp.size; }   // Gl
  int64_t local_qkv() const { return (local_heads() + 2 * local_groups()) * head_dim(); }
  int64_t local_ffn() const { return ffn / tp.size; }              // Fl
  int64_t local_fc() const { return (mlp_gated(mlp) ? 2 : 1) * local_ffn(); }
  int64_t local_expert_ffn() const { return moe.ffn / tp.size; }                      // Fel
  int64_t local_expert_fc() const { return (mlp_gated(mlp) ? 2 : 1) * local_expert_ffn(); }
  int64_t local_att() const { return local_heads() * head_dim(); }  // Cl: this rank's attention output width
  // The first key a causal query at position p sees (0, or p − window with a sliding window):
  // the KV-cache decoders attend over keys first_key(p) … p.
  int64_t first_key(int64_t p) const {
    return mask == AttentionMaskKind::SlidingWindow && p > window ? p - window : 0;
  }
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

// The shape of layer l of `cfg` for a micro-batch (batch, seq) under `tp` (and `cp`:
// seq is then this rank's T/cp tokens); train false: no dropout.
BlockShape block_shape(const GPTConfig& cfg, int64_t batch, int64_t seq, const TensorParallel& tp, bool train,
                       int64_t layer, const ContextParallel& cp = {});

}  // namespace mpitron
