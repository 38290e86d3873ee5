// model/t5_decode.h — T5's incremental decoder (model/t5.h): one request's encoder output and
// caches, so each decoding step runs the decoder over the NEW tokens only.
//
//   construction (once per request), Te encoder tokens of which the first enc_length are real:
//     mem = T5::encode(enc)                                  (Te, C) the encoder runs once
//     xkv[j] = cross_attention_kv(mem) of decoder layer j    (Te, 2·G·HD) projected once, read every step
//     k[j], v[j]                                             (1, max_len, G, HD) the self-attention cache
//   step(tokens), n new decoder inputs at positions p0 … p0+n−1 (p0 = length()):
//     y = wte[tokens] (+ wpe[p])                             (n, C)
//     decoder block j, its self-attention over the cache: the rows' keys and values are written at
//       p0 … p0+n−1, then each row attends to positions [0, its own] with T5's causal relative bias
//       bias[i, k, h] = table[relative_bucket(i, k, bidirectional=false), h]   (n, p0+n, NH)
//     its cross-attention reads xkv[j] (the encoder's padding masked), its MLP as in training
//     logits of the last row = lnf(y) · Woutᵀ                (V) f32 on the host (padded vocabulary)
// A step costs the same matmuls whatever p0; only the attention over the cache and the bias row grow
// with it (bench/t5_decode_bench.cpp measures both against T5::greedy_recompute). The blocks are the
// training blocks (model/block.h) with their own attention core, so the numbers are those of T5's
// forward up to summation order; T5::greedy and the server (model/inference/t5_engine.h) run on it.
// Tensor ops only: the same code on the CPU and the CUDA device. One rank, or every rank of a
// tensor-parallel group without sequence parallelism, each with its heads' caches (G/t groups) and
// its vocabulary slice of the logits, all-gathered: every rank returns the whole row.
#pragma once
#include <cstdint>
#include <vector>

#include "model/t5.h"

namespace mpitron {

class T5DecodeState {
 public:
  // enc (1, Te) i32 (any device), 1 <= enc_length <= Te; at most max_len decoder positions.
  T5DecodeState(T5& model, const Tensor& enc, int64_t enc_length, int64_t max_len);
  // Feeds the decoder's next inputs (>= 1 token; length() + n <= max_len) and returns the logits
  // (padded vocabulary) of the last one, f32 on the host.
  std::vector<float> step(const std::vector<int64_t>& tokens);
  int64_t length() const { return len_; }  // decoder positions fed so far
  int64_t max_len() const { return max_len_; }

 private:
  // The (n, p0 + n, NH) f32 causal relative bias of rows p0 … p0+n−1 (undefined: learned positions).
  Tensor bias_rows(int64_t p0, int64_t n) const;

  T5& model_;
  int64_t max_len_, len_ = 0;
  Tensor mem_;                   // (Te, C) the encoder's output
  Tensor lengths_;               // (1) i32 on the device: the encoder's real tokens; undefined: all Te
  int64_t enc_seq_ = 0;          // Te
  std::vector<Tensor> xkv_;      // [decoder layer] (Te, 2·G/t·HD) cross-attention keys | values (this rank's)
  std::vector<Tensor> k_, v_;    // [decoder layer] (1, max_len, G/t, HD) self-attention cache (this rank's groups)
};

}  // namespace mpitron
