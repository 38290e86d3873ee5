// model/inference/t5_eval.h — scoring a T5 (model/t5.h) on (input, target) pairs by teacher forcing,
// as pretrain_t5's validation scores its span-corruption samples: the encoder reads the input, the
// decoder reads [start] + target and is scored on target + [eos] (apps/evaluate.cpp --task SEQ2SEQ).
//
//   logits (T, V) = T5::logits(enc = input, dec = [start, y_1 … y_{T−1}])   T = |target| + 1
//   loss_t = logsumexp(logits_t[:V]) − logits_t[label_t],  labels = [y_1 … y_{T−1}, eos]
//   pred_t = argmax logits_t[:V] (first of equals); exact: pred == labels at every position
// Sums in double; the vocabulary's padding rows are never scored. One rank (T5's inference).
#pragma once
#include <cstdint>
#include <vector>

#include "model/inference/t5_engine.h"

namespace mpitron {

struct Seq2SeqScore {
  double loss = 0;             // Σ_t loss_t (nats)
  int64_t tokens = 0;          // T: the target's tokens + the end token
  int64_t correct = 0;         // positions with pred_t == label_t
  bool exact = false;          // every position correct
  std::vector<int32_t> pred;   // (T) the argmaxes
};

// input: the encoder's ids (>= 1); target: the answer's ids without start or end token (may be empty).
Seq2SeqScore score_seq2seq(T5& model, const std::vector<int32_t>& input, const std::vector<int32_t>& target,
                           const T5Tokens& tokens);

}  // namespace mpitron
