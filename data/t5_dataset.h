// data/t5_dataset.h — T5 span-corruption samples from a sentence-level dataset
// (`preprocess_data --split-sentences`), built as megatron-core's T5MaskedWordPieceDataset
// with pretrain_t5.py's settings (data/masked_dataset.h has what it shares with BERT).
//
// Sample index: build_mapping with targets of encoder_seq_length − 2 and runs of ≥ 1
// sentence. Sample i (numpy.random.RandomState(seed + i), as megatron-core):
//   tokens = the row's sentences concatenated, cut to the target (truncated: some were cut);
//   masking: spans of whole words, n from geometric(0.2) clipped to 10 (SpanBERT; mean
//     span ≈ 3 words at 15%), every masked token replaced by [MASK];
//   each span, in order, becomes sentinel s_j (<extra_id_j>, --vocab-extra-ids):
//     text_enc = the tokens with each span replaced by its sentinel, padded to the encoder length;
//     text_dec = [BOS] s_0 span_0 s_1 span_1 …, padded to the decoder length;
//     labels   = s_0 span_0 s_1 span_1 … [EOS] (text_dec shifted by one), −1 on the padding;
//     loss_mask = 1 on the len(text_dec) unpadded positions;
//     enc_mask, dec_mask = 1 where the token is not [PAD];
//   [PAD] ids are written as 0 (Megatron's), in text_enc, text_dec and labels.
// A sample whose decoder side does not fit --decoder-seq-length is refused naming the flag
// (megatron-core asserts).
#pragma once
#include <array>
#include <cstdint>
#include <memory>
#include <vector>

#include "data/gpt_dataset.h"  // DocRange
#include "data/indexed_dataset.h"

namespace mpitron::data {

class TextTokenizer;

struct T5DatasetConfig {
  int64_t encoder_seq_length = 512;  // --encoder-seq-length (Megatron: --seq-length)
  int64_t decoder_seq_length = 128;  // --decoder-seq-length
  double mask_prob = 0.15;           // --mask-prob
  double short_seq_prob = 0.1;       // --short-seq-prob
  int32_t seed = 1234;               // --seed (> 0)
  int64_t num_samples = -1;          // rows wanted (whole epochs until reached); -1: one epoch
  int max_ngram = 10;                // pretrain_t5.py: masking_max_ngram = 10
  bool whole_word = true;            // masking_do_full_word = True
  bool geometric = true;             // masking_use_geometric_distribution = True
};

// The ids a T5 dataset needs: Megatron's BertWordPieceLowerCase/Case with --vocab-extra-ids N:
// vocab.txt, [BOS] and [EOS] appended when absent, then <extra_id_0> … <extra_id_{N−1}>.
struct T5Vocab {
  int32_t cls = -1, sep = -1, mask = -1, pad = -1, bos = -1, eos = -1;
  std::vector<int32_t> sentinels;     // <extra_id_j>
  int64_t vocab_size = 0;             // with the sentinels
  std::vector<uint8_t> continuation;  // [vocab_size] 1 for "##" pieces
  static T5Vocab from(const TextTokenizer& tok, int64_t extra_ids);
};

struct T5Sample {
  std::vector<int32_t> text_enc;   // [encoder_seq_length]
  std::vector<int32_t> text_dec;   // [decoder_seq_length]
  std::vector<int32_t> labels;     // [decoder_seq_length], -1 on the padding
  std::vector<uint8_t> loss_mask;  // [decoder_seq_length]
  std::vector<uint8_t> enc_mask;   // [encoder_seq_length] 1 on tokens, 0 on [PAD]
  std::vector<uint8_t> dec_mask;   // [decoder_seq_length]
  bool truncated = false;
};

class T5Dataset {
 public:
  T5Dataset(std::shared_ptr<const IndexedDataset> data, DocRange docs, T5Vocab vocab, const T5DatasetConfig& cfg);
  int64_t size() const { return static_cast<int64_t>(rows_.size()); }
  T5Sample sample(int64_t index) const;
  const std::vector<std::array<int64_t, 3>>& sample_index() const { return rows_; }
  const T5DatasetConfig& config() const { return cfg_; }

 private:
  std::shared_ptr<const IndexedDataset> data_;
  DocRange docs_;
  T5Vocab vocab_;
  T5DatasetConfig cfg_;
  std::vector<std::array<int64_t, 3>> rows_;
};

}  // namespace mpitron::data
