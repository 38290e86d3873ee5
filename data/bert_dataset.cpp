// data/bert_dataset.cpp — BERT sample index and samples (rules in the header).
#include "data/bert_dataset.h"

#include <algorithm>

#include "core/error.h"
#include "data/masked_dataset.h"
#include "data/wordpiece_tokenizer.h"

namespace mpitron::data {


BertVocab BertVocab::from(const TextTokenizer& tok) {
  const WordPieceTokenizer& wp = wordpiece_of(tok, "BERT");
  BertVocab v;
  v.cls = wp.cls(), v.sep = wp.sep(), v.mask = wp.mask(), v.pad = wp.pad();
  v.vocab_size = wp.vocab_size();
  v.continuation = continuation_table(wp);
  return v;
}

BertDataset::BertDataset(std::shared_ptr<const IndexedDataset> data, DocRange docs, BertVocab vocab,
                         const BertDatasetConfig& cfg)
    : data_(std::move(data)), docs_(docs), vocab_(std::move(vocab)), cfg_(cfg) {
  MPT_CHECK(cfg_.seq_length >= 5, str("BERT --seq-length ", cfg_.seq_length, " is too short"),
            "a sample holds [CLS] A [SEP] B [SEP]: use --seq-length 5 or more (512 is usual)");
  check_masked_dataset("BERT", cfg_.mask_prob, cfg_.short_seq_prob, cfg_.seed, cfg_.max_ngram, *data_, docs_,
                       vocab_.vocab_size);
  MPT_CHECK(vocab_.cls >= 0 && vocab_.sep >= 0 && vocab_.mask >= 0 && vocab_.pad >= 0 &&
                static_cast<int64_t>(vocab_.continuation.size()) == vocab_.vocab_size,
            "BertVocab lacks [CLS] / [SEP] / [MASK] / [PAD] or its continuation table", "build it with BertVocab::from");
  build_sample_index();
}

void BertDataset::build_sample_index() {
  rows_ = build_sentence_rows(*data_, docs_, static_cast<int32_t>(cfg_.seq_length - 3), cfg_.binary_head ? 2 : 1,
                              cfg_.short_seq_prob, cfg_.seed, cfg_.num_samples, "BERT",
                              cfg_.binary_head ? "preprocess with --split-sentences (one sequence per sentence), or pass "
                                                 "--bert-no-binary-head"
                                               : "check the data path");
}

BertSample BertDataset::sample(int64_t index) const {
  MPT_CHECK(index >= 0 && index < size(), str("BERT sample ", index, " out of range [0, ", size(), ")"), "");
  const auto [beg, end, target] = rows_[static_cast<size_t>(index)];
  NumpyRandomState rs(static_cast<uint32_t>((static_cast<uint64_t>(cfg_.seed) + static_cast<uint64_t>(index)) & 0xFFFFFFFFull));

  // Segments A and B: contiguous runs of the row's sentences.
  const int64_t n = end - beg;
  int64_t pivot = n;
  BertSample out;
  if (cfg_.binary_head) {
    MPT_CHECK(n > 1, str("BERT sample ", index, " has one sentence"), "");
    pivot = n >= 3 ? np_randint(rs, 1, n) : 1;
    out.is_random = np_random(rs) < 0.5;
  }
  std::vector<int32_t> a, b;
  for (int64_t s = beg; s < end; ++s) data_->get(s).append_to(s < beg + pivot ? a : b);
  if (out.is_random) std::swap(a, b);

  // Truncate to the target: [a0, a1) and [b0, b1) stay.
  size_t a0 = 0, a1 = a.size(), b0 = 0, b1 = b.size();
  while ((a1 - a0) + (b1 - b0) > static_cast<size_t>(target)) {
    const bool from_a = (a1 - a0) > (b1 - b0);
    const bool front = np_random(rs) < 0.5;
    if (from_a) {
      front ? ++a0 : --a1;
    } else {
      front ? ++b0 : --b1;
    }
    out.truncated = true;
  }
  std::vector<int32_t> tokens{vocab_.cls};
  tokens.insert(tokens.end(), a.begin() + a0, a.begin() + a1);
  tokens.push_back(vocab_.sep);
  std::vector<int32_t> types(tokens.size(), 0);
  if (b1 > b0) {
    tokens.insert(tokens.end(), b.begin() + b0, b.begin() + b1);
    tokens.push_back(vocab_.sep);
    types.resize(tokens.size(), 1);
  }

  // Masking: n-grams of whole words; each masked token becomes [MASK] (80%), a random id (10%) or stays.
  SpanMasking sm;
  sm.mask_prob = cfg_.mask_prob;
  sm.max_ngram = cfg_.max_ngram;
  sm.whole_word = cfg_.whole_word;
  MaskedSpans ms = mask_spans(tokens, target, vocab_.continuation, vocab_.cls, vocab_.sep, sm, rs, [&](int32_t orig) {
    if (np_random(rs) < 0.8) return vocab_.mask;
    if (np_random(rs) >= 0.5) return static_cast<int32_t>(np_randint(rs, 0, vocab_.vocab_size));
    return orig;
  });
  std::vector<int32_t>& masked = ms.tokens;
  const std::vector<std::pair<int32_t, int32_t>>& picked = ms.picked;

  // Pad to seq_length and fill the masks.
  const size_t S = static_cast<size_t>(cfg_.seq_length);
  MPT_CHECK(masked.size() <= S, str("BERT sample ", index, " has ", masked.size(), " tokens > --seq-length ", S), "");
  out.length = static_cast<int64_t>(masked.size());
  out.tokens = std::move(masked);
  out.tokens.resize(S, vocab_.pad);
  out.types = std::move(types);
  out.types.resize(S, 0);
  out.padding_mask.assign(S, 1);
  out.labels.assign(S, -1);
  out.loss_mask.assign(S, 0);
  for (size_t i = 0; i < S; ++i)
    if (out.tokens[i] == vocab_.pad) out.padding_mask[i] = 0;
  for (auto [p, id] : picked) {
    out.labels[p] = id;
    out.loss_mask[p] = 1;
  }
  for (size_t i = 0; i < S; ++i) {  // Megatron: [PAD] ids become 0 for the embedding
    if (out.tokens[i] == vocab_.pad) out.tokens[i] = 0;
    if (out.labels[i] == vocab_.pad) out.labels[i] = 0;
  }
  return out;
}

}  // namespace mpitron::data
