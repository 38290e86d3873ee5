#include "model/inference/t5_eval.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"

namespace mpitron {

Seq2SeqScore score_seq2seq(T5& model, const std::vector<int32_t>& input, const std::vector<int32_t>& target,
                           const T5Tokens& tokens) {
  const int64_t V = model.config().vocab_size, Te = static_cast<int64_t>(input.size());
  const int64_t T = static_cast<int64_t>(target.size()) + 1;
  MPT_CHECK(Te >= 1, "score_seq2seq: an empty input (a T5's encoder needs one)", "");
  std::vector<int64_t> dec{tokens.start}, labels;
  for (int32_t y : target) dec.push_back(y), labels.push_back(y);  // dec (T) [start, y_1 … y_{T−1}]
  labels.push_back(tokens.eos);                                     // labels (T) [y_1 … y_{T−1}, eos]
  for (int64_t y : labels) MPT_CHECK(y >= 0 && y < V, str("score_seq2seq: token id ", y, " outside [0, ", V, ")"), "");
  T5Batch b;
  b.enc = Tensor::from_ints(std::vector<int64_t>(input.begin(), input.end()), {1, Te}, DType::I32);
  b.dec = Tensor::from_ints(dec, {1, T}, DType::I32);
  b.labels = Tensor::from_ints(labels, {1, T}, DType::I32);
  b.enc_lengths = Tensor::from_ints({Te}, {1}, DType::I32);
  const std::vector<float> logits = model.logits(b).to_floats();  // (T, Vp)
  const int64_t Vp = static_cast<int64_t>(logits.size()) / T;
  Seq2SeqScore s;
  s.tokens = T;
  for (int64_t t = 0; t < T; ++t) {
    const float* row = logits.data() + t * Vp;
    const int64_t arg = std::max_element(row, row + V) - row;
    double sum = 0;
    for (int64_t v = 0; v < V; ++v) sum += std::exp(static_cast<double>(row[v]) - row[arg]);
    s.loss += static_cast<double>(row[arg]) + std::log(sum) - row[labels[static_cast<size_t>(t)]];
    s.pred.push_back(static_cast<int32_t>(arg));
    s.correct += arg == labels[static_cast<size_t>(t)];
  }
  s.exact = s.correct == T;
  return s;
}

}  // namespace mpitron
