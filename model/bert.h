// model/bert.h — BERT pre-training (Megatron's pretrain_bert): the encoder is the
// block skeleton of model/block.h with bidirectional attention and, with
// --bert-post-ln, the original post-LN order; the parameters are the family's
// rows of model/param_table.h (cfg.bert). docs/model-families.md "BERT".
//
//   x0 = dropout(emb_ln(wte[tokens] + wpe[positions] + tokentype[types]))   (N, C), N = B·T
//                                             (emb_ln with post-LN only)
//   x_l+1 = block_l(x_l)                      bidirectional, keys j >= length[b] masked
//   h = lnf(x_L)                              pre-LN only (post-LN blocks end in a norm)
//   MLM:   logits = LN(gelu(h·Wdᵀ + bd)) · wteᵀ + b_lm          (N, V) vocab-parallel, tied decoder
//          lm loss = mean over masked positions (labels >= 0) of cross-entropy
//   binary head (sentence order):
//          pooled = tanh(h[CLS]·Wpᵀ + bp)   (B, C), [CLS] = row b·T
//          sop loss = mean cross-entropy(pooled·Wbᵀ + bb (B, 2), is_random)
//   loss = lm loss + sop loss               (Megatron's sum; without the binary head: lm loss)
// Sequence classification (cfg.num_classes = K > 0: Megatron's Classification model,
// model/training/finetune.h), instead of both heads:
//          pooled = tanh(h[CLS]·Wpᵀ + bp)   (B, C)
//          logits = dropout(pooled)·Wcᵀ + bc   (B, K), dropout p = hidden_dropout
//          loss = mean cross-entropy(logits, class_labels)
// The GPT class holds the parameters, chunks and blocks (one code path for the
// layout, init, TP/PP placement); the embedding, final norm and output layer are the
// ones every model uses (model/layers/model_ends.h); Bert adds its heads.
#pragma once
#include <cstdint>
#include <vector>

#include "model/gpt.h"

namespace mpitron {

namespace data {
struct BertSample;
}

// One micro-batch of BERT samples (data/bert_dataset.h), host i32 tensors.
struct BertBatch {
  Tensor tokens, types, labels;  // (B, T): ids, token types, original id where masked else -1
  Tensor lengths;                // (B): tokens before the padding
  Tensor is_random;              // (B): the sentence-order label
  Tensor class_labels;           // (B): the class of each sample (num_classes > 0 only)
  static BertBatch from(const std::vector<data::BertSample>& samples);
  bool padded() const;           // some length < T
};

struct BertLosses {
  double lm = 0, sop = 0;  // the last stage's last micro-batch (sop 0 without the binary head)
  double cls = 0;          // classification loss (num_classes > 0; lm and sop are then 0)
  Tensor class_logits;     // (B, K) f32 host: the classifier's logits (num_classes > 0)
};

// The heads' outputs before any loss (Bert::logits).
struct BertLogits {
  Tensor mlm;     // (B·T, V) f32, every position (V = padded vocab; padding columns are b_lm's zeros)
  Tensor binary;  // (B, 2) f32 sentence-order logits; undefined without the binary head
};

class Bert {
 public:
  Bert(const GPTConfig& cfg, Device device, const ModelParallel& mp = {});
  GPT& core() { return core_; }
  const GPTConfig& config() const { return core_.config(); }
  ParamSet& params() { return core_.params(); }
  void init_weights(uint64_t seed) { core_.init_weights(seed); }

  // Local chunk c: the first stage embeds the batch, others take `input`; the last
  // stage returns the loss (1) f32 (lm + sop), others their output activation.
  Var chunk_forward(Tape& tape, int c, const BertBatch& batch, const Var& input, const ForwardOptions& opt);
  Var forward(Tape& tape, const BertBatch& batch, const ForwardOptions& opt);
  // The two losses of the last chunk_forward on the last stage.
  const BertLosses& last_losses() const { return losses_; }
  // Both heads' logits for a batch, no dropout and no loss (labels and is_random are not
  // read). The whole model on one rank (tests and HF comparison, model/inference/hf_convert.h).
  BertLogits logits(const BertBatch& batch);

 private:
  Var embed(Tape& tape, const BertBatch& batch, const ForwardOptions& opt);
  Var heads(Tape& tape, const Var& x, const BertBatch& batch);
  Var mlm_logits(Tape& tape, const Var& h);                    // h (Nl, C) → (N, V/t)
  Var pooled(Tape& tape, const Var& h, int64_t B, int64_t T);  // tanh(h[CLS]·Wpᵀ + bp) (B, C)
  // num_classes > 0, instead of heads(): final norm (pre-LN), pooler, dropout, classifier, loss.
  Var classification_head(Tape& tape, const Var& x, const BertBatch& batch, const ForwardOptions& opt);

  GPT core_;
  BertLosses losses_;
};

}  // namespace mpitron
