// model/t5.h — T5 (Megatron's pretrain_t5, Hugging Face's T5ForConditionalGeneration): an
// encoder-decoder built from the ONE block skeleton (model/block.h) and the ONE parameter table
// (model/param_table.h, cfg.t5): layers 0 … Le−1 are the encoder's blocks, layers Le … L−1 the
// decoder's, each of which adds the cross-attention sublayer (model/layers/cross_attention_layer.h).
// docs/model-families.md "T5".
//
//   Encoder, N = B·Te:
//     x0 = dropout(wte[enc] (+ wpe[t]))                    (N, C) learned positions only
//     x_l+1 = block_l(x_l)                                  bidirectional; keys j >= enc_length[b] masked;
//                                                           + the encoder's relative bias (relative positions)
//     mem = enc_lnf(x_Le)                                   (N, C)
//   Decoder, Nd = B·Td:
//     y0 = dropout(wte[dec] (+ wpe[t]))                     (Nd, C) the same tables as the encoder's
//     y_j+1 = block_Le+j(y_j, mem)                          causal self-attention (+ the decoder's relative
//                                                           bias), cross-attention over mem (its padding masked)
//     logits = lnf(y_Ld) · Woutᵀ                            (Nd, V) vocab-parallel; Wout = wte (tied) or head
//     loss = mean cross-entropy over labels >= 0            (Megatron's loss_mask: labels of masked positions −1)
//   Relative position bias (T5's): bias[i, j, h] = table[bucket(j − i), h] (tables (buckets, NH), one per
//     stack, this rank's heads), computed once per forward and added to every layer's self-attention
//     scores; bidirectional buckets in the encoder, causal ones in the decoder (relative_bucket below).
// The encoder's output gradient is the sum of every decoder layer's cross-attention share: the decoder
// blocks add it to one buffer (BlockShape::cross.memory_grad), moved into the encoder's tape after them.
// Dropout: the encoder's masks are GPT's (key dropout_seed; embedding at 0, layer l at N·C·(1 + 2l));
// the decoder's have their own key (decoder_seed) with the embedding at 0 and decoder layer j's three
// masks at Nd·C·(1 + 3j) + {0, Nd·C (MLP), 2·Nd·C (cross-attention)}; attention probabilities layer by
// layer in streams of ⌈S²/4⌉ blocks, S = max(Te, Td) in the decoder (its self-attention j, its
// cross-attention Ld + j).
// Parallelism: TP (+SP), DP, ZeRO and recompute as every model (the trainer sees the GPT core's flat
// parameters); pipeline and context parallelism are refused by name (Megatron-Core refuses PP for T5 too).
#pragma once
#include <cstdint>
#include <map>
#include <utility>
#include <vector>

#include "model/gpt.h"

namespace mpitron {

namespace data {
struct T5Sample;
}

// One micro-batch of T5 samples (data/t5_dataset.h), host i32 tensors.
struct T5Batch {
  Tensor enc;          // (B, Te) encoder input ids (padding after enc_lengths[b])
  Tensor dec;          // (B, Td) decoder input ids
  Tensor labels;       // (B, Td) targets; < 0 is not counted (padding, Megatron's loss_mask 0)
  Tensor enc_lengths;  // (B) encoder tokens before the padding
  static T5Batch from(const std::vector<data::T5Sample>& samples);
  bool padded() const;  // some enc_lengths[b] < Te
};

// T5's relative position bucket of key j seen from query i (HF's T5Attention._relative_position_bucket,
// Megatron-Core's RelativePositionEmbedding), with `buckets` buckets and the maximum distance given.
// bidirectional (encoder): half the buckets for keys after the query; causal (decoder): only keys before.
int64_t relative_bucket(int64_t i, int64_t j, bool bidirectional, int64_t buckets, int64_t max_distance);

class T5 {
 public:
  T5(const GPTConfig& cfg, Device device, const ModelParallel& mp = {});
  GPT& core() { return core_; }
  const GPT& core() const { return core_; }
  const GPTConfig& config() const { return core_.config(); }
  ParamSet& params() { return core_.params(); }
  void init_weights(uint64_t seed) { core_.init_weights(seed); }

  // The mean loss (1) f32 of a micro-batch; when the tape records, backward() fills the grads.
  Var forward(Tape& tape, const T5Batch& batch, const ForwardOptions& opt);
  // Logits (B·Td, V) f32 of every decoder position (padded vocabulary; no dropout, no loss). One rank.
  Tensor logits(const T5Batch& batch);
  // The encoder's output mem (B·Te, C) in the compute dtype, no dropout. One rank, or every rank of a
  // tensor-parallel group without sequence parallelism (each then holds all of it).
  Tensor encode(const Tensor& enc, const Tensor& enc_lengths);
  // Greedy decoding of one sample (enc (1, Te) with its length): start from `start` and append the
  // argmax of the last position (over the unpadded vocabulary) until `eos` or max_new tokens. The
  // encoder runs once, the decoder on the new token only over its caches (model/t5_decode.h). One rank,
  // or every rank of a tensor-parallel group without sequence parallelism (the same tokens on each).
  std::vector<int64_t> greedy(const Tensor& enc, int64_t enc_length, int64_t start, int64_t eos, int64_t max_new);
  // The same decoding by full recomputation: the decoder reruns over every token so far each step
  // (the reference the cached decoder is tested and benchmarked against).
  std::vector<int64_t> greedy_recompute(const Tensor& enc, int64_t enc_length, int64_t start, int64_t eos,
                                        int64_t max_new);
  // The decoder seed of a micro-batch's dropout_seed.
  static uint64_t decoder_seed(uint64_t seed) { return seed ^ 0x9E3779B97F4A7C15ull; }

 private:
  Var embed(Tape& tape, const Tensor& tokens, float dropout, uint64_t seed);
  // The relative position bias (T, T, NHl) f32 of a stack; its gradient buffer is filled by the blocks.
  void relative_bias(Tape& tape, StackInputs& st, int64_t T, bool encoder);
  // The decoder's logits (Nd, V/t) over mem (this rank's rows of the encoder's (B·Te, C) output).
  Var decoder_logits(Tape& tape, const Var& mem, int64_t Te, const Tensor& enc_lengths, const Tensor& dec,
                     const ForwardOptions& opt);
  Var encoder(Tape& tape, const Tensor& enc, const Tensor& enc_lengths, const ForwardOptions& opt);

  // The options of a forward without dropout or a tape, after checking the model is whole on this rank
  // (or, tensor_parallel_ok, split by tensor parallelism without sequence parallelism).
  ForwardOptions inference(const char* what, bool tensor_parallel_ok = false) const;

  GPT core_;
  std::map<std::pair<int64_t, bool>, Tensor> bucket_ids_;  // (T, encoder) → the (T·T) relative buckets (device)
};

}  // namespace mpitron
