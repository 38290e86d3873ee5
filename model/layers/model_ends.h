// model/layers/model_ends.h — the two ends every model shares: ONE embedding, ONE final norm
// and ONE output layer with its loss, used by the GPT model (model/gpt.h), the BERT model
// (model/bert.h) and the KV-cache decoder (model/inference/generate.h). The parameters are
// found by role (model/param_table.h), never by name.
//
//   embedding  x (Nl, C) = dropout(norm_e(m·wte[ids] + wpe[pos] + tokentype[types]))
//                m = √C with --scale-embeddings (Gemma), else 1
//                wpe with learned positions, tokentype with token types (BERT), norm_e the
//                post-LN BERT's embedding LayerNorm. wte is vocab-parallel: each TP rank
//                looks up its rows and the partial sums are reduced (reduce-scattered to this
//                rank's Nl = N/t rows with sequence parallelism); dropout's mask starts at
//                Philox block first_row·C/4 (the single-process mask).
//   final norm h = norm(x), the configuration's LayerNorm or RMSNorm (post-LN BERT: none),
//                scaled by (1 + w) with --apply-layernorm-1p
//   output     logits (N, V/t) = h·Wᵀ (+ b): this rank's vocabulary slice, never gathered
//                (h all-gathered with sequence parallelism); W = wte (tied) or head.weight,
//                b = BERT's lm_head.bias
//   loss       mean cross-entropy over targets >= 0, the vocab-parallel one under TP
#pragma once
#include <functional>
#include <vector>

#include "autograd/tape.h"
#include "model/config.h"
#include "model/param_table.h"
#include "model/params.h"
#include "model/tensor_parallel.h"

namespace mpitron {

// What the embedding reads for this rank's rows.
struct EmbedRows {
  Tensor ids;                      // (N) i32 on the device: every token of the micro-batch
  std::vector<int64_t> positions;  // (Nl) each of this rank's rows' position
  Tensor types;                    // (Nl) i32 on the device: token types (BERT); undefined: none
  // Context parallelism: this rank's rows as runs (first local row, rows, first single-process
  // row) whose dropout masks are the single-process rows'; empty: rows tp.first_row(N) … in order.
  struct Run {
    int64_t local, len, global;
  };
  std::vector<Run> dropout_rows;
};

// m above.
float embedding_multiplier(const TransformerConfig& c);
Var embed_tokens(Tape& tape, const TransformerConfig& c, const TensorParallel& tp, const ParamSet& ps,
                 const EmbedRows& rows, float dropout, uint64_t seed);
// x (Nl, C) → the final norm's output (Nl, C); x itself when the model has none (post-LN BERT).
// The roles name which norm: the model's final one, or T5's encoder's (EncoderFinalNorm*).
Var final_norm(Tape& tape, const TransformerConfig& c, const TensorParallel& tp, const ParamSet& ps, const Var& x,
               ParamRole weight = ParamRole::FinalNormWeight, ParamRole bias = ParamRole::FinalNormBias);
// The output layer's matrix (V, C): wte when tied, head.weight when untied.
const Var& output_weight(const TransformerConfig& c, const ParamSet& ps);
// h (Nl, C) → logits (N, V/t) = h·wᵀ + b (b may be undefined). With `between`, the product is
// ag::linear_split's two nodes and `between` runs in backward after the input gradient, before
// w's gradient (ZeRO-3 frees the gathered w there).
Var output_logits(Tape& tape, const TensorParallel& tp, const Var& h, const Var& w, const Var& b,
                  std::function<void()> between = {});
// The decoder's logits (N, V/t) of the final norm's output h: the output layer, then the final
// soft-cap logits ← cap·tanh(logits/cap) with --final-logit-softcapping (Gemma 2).
Var lm_logits(Tape& tape, const TransformerConfig& c, const TensorParallel& tp, const Var& h, const Var& w,
              std::function<void()> between = {});
// The same soft-cap on logits computed outside a tape (the inference tools' tiled head), in place.
void cap_logits(const TransformerConfig& c, const Tensor& logits);
// The mean cross-entropy of logits (N, V/t) against targets (N) (global ids, < 0 ignored).
Var lm_loss(Tape& tape, const TransformerConfig& c, const TensorParallel& tp, const Var& logits, const Tensor& targets);

}  // namespace mpitron
