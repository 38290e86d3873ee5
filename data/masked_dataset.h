// data/masked_dataset.h — what the BERT and T5 datasets share, as megatron-core's
// MaskedWordPieceDataset shares it: the sample index over a sentence-level dataset
// (helpers.cpp build_mapping) and the n-gram masking (_create_masked_lm_predictions),
// with numpy.random.RandomState's draws reproduced so the samples equal megatron-core's.
//
// Masking (for one sample's tokens, target length T):
//   candidates: whole words (a token and its "##" continuations with whole_word), never
//     [CLS] or [SEP]; shuffled (RandomState.shuffle);
//   n_maskings = min(mask_prob · T, max(1, round(mask_prob · len(tokens))));
//   for each candidate in order, until n_maskings tokens are masked: draw n (1 … max_ngram)
//     with P ∝ 1/n (RandomState.choice), or geometric(0.2) clipped to max_ngram (SpanBERT,
//     T5); shorten the n-gram (n words from the candidate on) until it fits under
//     n_maskings, none fits: next candidate; a candidate overlapping masked tokens is
//     skipped; else every token of it is replaced by mask_token(original) (which may draw
//     from the same RandomState: BERT's 80/10/10) and the n-gram is one span.
//   Outputs sorted by position: the (position, original id) pairs and the spans.
#pragma once
#include <array>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "data/gpt_dataset.h"  // DocRange, NumpyRandomState
#include "data/indexed_dataset.h"

namespace mpitron::data {

// numpy RandomState.random(): 53 bits from two 32-bit draws.
double np_random(NumpyRandomState& rs);
// numpy RandomState.randint(low, high).
int64_t np_randint(NumpyRandomState& rs, int64_t low, int64_t high);
// numpy RandomState.geometric(p) (the legacy generator's: inversion below p = 1/3, search above).
int64_t np_geometric(NumpyRandomState& rs, double p);

// Rows (first sentence, end sentence, target length) of helpers.cpp build_mapping over `docs`:
// runs of consecutive sentences of at least `min_sentences`, targets max_length or (with
// short_seq_prob) shorter (std::mt19937(seed)); whole epochs until num_samples rows (-1: one
// epoch), shuffled (std::mt19937_64(seed + 1)). `model` and `hint` name the caller in the
// error for data without any row.
std::vector<std::array<int64_t, 3>> build_sentence_rows(const IndexedDataset& data, DocRange docs, int32_t max_length,
                                                        int32_t min_sentences, double short_seq_prob, int32_t seed,
                                                        int64_t num_samples, const std::string& model,
                                                        const std::string& hint);

class TextTokenizer;
class WordPieceTokenizer;

// The WordPiece tokenizer behind `tok`, or a refusal naming --tokenizer-type (`model`: "BERT", "T5").
const WordPieceTokenizer& wordpiece_of(const TextTokenizer& tok, const std::string& model);
// [vocab] 1 for its "##" pieces (the whole-word masking's continuations).
std::vector<uint8_t> continuation_table(const WordPieceTokenizer& wp);
// The settings and data both datasets refuse by the same rules (`model` names the dataset in the
// messages): mask and short-sequence probabilities, a positive seed, the n-gram bound, the
// document range, and token ids within the vocabulary.
void check_masked_dataset(const std::string& model, double mask_prob, double short_seq_prob, int32_t seed,
                          int max_ngram, const IndexedDataset& data, DocRange docs, int64_t vocab_size);

struct SpanMasking {
  double mask_prob = 0.15;
  int max_ngram = 3;
  bool whole_word = true;
  bool geometric = false;  // n from geometric(0.2) (T5) instead of P ∝ 1/n (BERT)
};

struct MaskedSpans {
  std::vector<int32_t> tokens;                       // the masked sequence
  std::vector<std::pair<int32_t, int32_t>> picked;   // (position, original id), by position
  std::vector<std::vector<int32_t>> spans;           // each n-gram's positions, by first position
};

// continuation: [vocab] 1 for "##" pieces; cls, sep: never masked (-1: none).
MaskedSpans mask_spans(const std::vector<int32_t>& tokens, int64_t target, const std::vector<uint8_t>& continuation,
                       int32_t cls, int32_t sep, const SpanMasking& m, NumpyRandomState& rs,
                       const std::function<int32_t(int32_t)>& mask_token);

}  // namespace mpitron::data
