// data/bert_dataset.h — BERT training samples from a sentence-level dataset
// (`preprocess_data --split-sentences`), built as megatron-core's
// BERTMaskedWordPieceDataset with pretrain_bert.py's settings.
//
// Sample index (megatron-core helpers.cpp build_mapping, same generators, so the same
// rows): walk the documents of the range once per epoch; skip documents with fewer than
// 2 sentences (1 without the binary head) and documents of several sentences one of which
// is longer than 512 tokens; cut each document into runs of consecutive sentences, a run
// ending once it holds ≥ target tokens and ≥ 2 sentences (1) and more than one sentence is
// left, or at the end of the document. The target is seq_length - 3, or with probability
// short_seq_prob a random length in [2, seq_length - 3] (std::mt19937(seed)). Epochs repeat
// until num_samples rows exist (whole epochs: there may be more); the rows are then
// shuffled (std::mt19937_64(seed + 1)). Row = (first sentence, end sentence, target).
//
// Sample i (numpy.random.RandomState(seed + i) drives every choice, as in Megatron, so
// the samples equal megatron-core's):
//   binary head: A = the first `pivot` sentences of the row, B = the rest (pivot 1, or
//     randint(1, n) for n ≥ 3 sentences); is_random = random() < 0.5 swaps A and B
//     (sentence-order prediction: is_random = 1 means "B comes first in the text");
//     without it: A = all sentences, no B, is_random = 0;
//   truncation: while |A| + |B| > target, drop a token from the longer (B on ties), at its
//     front or back with probability 1/2;
//   tokens = [CLS] A [SEP] (B [SEP]), types 0 for [CLS] A [SEP] and 1 for B [SEP];
//   masking: candidates are whole words (a token and its "##" continuations; never [CLS]
//     or [SEP]); n-grams of 1-3 consecutive words, drawn with p ∝ 1/n over a shuffled
//     candidate order, are masked until min(mask_prob · target, max(1, round(mask_prob ·
//     len(tokens)))) tokens are; each masked token becomes [MASK] (80%), a random id in
//     [0, vocab_size) (10%) or stays (10%); labels = original id there, -1 elsewhere;
//   padding to seq_length with [PAD]; padding_mask 0 where the token is [PAD] (Megatron's
//     rule: also where a random replacement drew [PAD]).
// Megatron then writes 0 over [PAD] ids in tokens and labels (so the embedding can take
// them); done here too (a no-op for the usual vocab, where [PAD] is 0).
#pragma once
#include <array>
#include <cstdint>
#include <memory>
#include <vector>

#include "data/gpt_dataset.h"  // DocRange, NumpyRandomState
#include "data/indexed_dataset.h"

namespace mpitron::data {

class TextTokenizer;

struct BertDatasetConfig {
  int64_t seq_length = 512;     // --seq-length: tokens of a sample, [CLS] and [SEP]s included
  bool binary_head = true;      // false: --bert-no-binary-head (one segment, is_random = 0)
  double mask_prob = 0.15;      // --mask-prob
  double short_seq_prob = 0.1;  // --short-seq-prob
  int32_t seed = 1234;          // --seed (> 0)
  int64_t num_samples = -1;     // rows wanted (whole epochs until reached); -1: one epoch
  int max_ngram = 3;            // pretrain_bert.py: masking_max_ngram = 3
  bool whole_word = true;       // pretrain_bert.py: masking_do_full_word = True
};

// The BERT ids a dataset needs from a WordPiece tokenizer.
struct BertVocab {
  int32_t cls = -1, sep = -1, mask = -1, pad = -1;
  int64_t vocab_size = 0;
  std::vector<uint8_t> continuation;  // [vocab_size] 1 for "##" pieces
  // From BertWordPieceLowerCase / BertWordPieceCase; other types are refused by name.
  static BertVocab from(const TextTokenizer& tok);
};

struct BertSample {
  std::vector<int32_t> tokens;        // [seq_length] ids: [CLS] A [SEP] B [SEP], masked, then padding
  std::vector<int32_t> types;         // [seq_length] 0: [CLS] A [SEP] and padding, 1: B [SEP]
  std::vector<int32_t> labels;        // [seq_length] original id where masked, -1 elsewhere
  std::vector<uint8_t> loss_mask;     // [seq_length] 1 where masked
  std::vector<uint8_t> padding_mask;  // [seq_length] 1 on the sequence, 0 on [PAD]
  int32_t is_random = 0;              // binary-head label: 1 when A and B were swapped
  bool truncated = false;             // tokens were dropped to fit the target length
  int64_t length = 0;                 // tokens before the padding
};

class BertDataset {
 public:
  // `data`: a sentence-level dataset (one sequence per sentence, documents in the index);
  // `docs`: the documents of this split.
  BertDataset(std::shared_ptr<const IndexedDataset> data, DocRange docs, BertVocab vocab, const BertDatasetConfig& cfg);

  int64_t size() const { return static_cast<int64_t>(rows_.size()); }
  BertSample sample(int64_t index) const;
  // Row i: (first sentence, end sentence, target length).
  const std::vector<std::array<int64_t, 3>>& sample_index() const { return rows_; }
  const BertDatasetConfig& config() const { return cfg_; }

 private:
  void build_sample_index();

  std::shared_ptr<const IndexedDataset> data_;
  DocRange docs_;
  BertVocab vocab_;
  BertDatasetConfig cfg_;
  std::vector<std::array<int64_t, 3>> rows_;
};

}  // namespace mpitron::data
