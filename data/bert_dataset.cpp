// data/bert_dataset.cpp — BERT sample index and samples (rules in the header).
#include "data/bert_dataset.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <unordered_set>

#include "core/error.h"
#include "data/text_tokenizer.h"
#include "data/wordpiece_tokenizer.h"

namespace mpitron::data {

namespace {

constexpr int32_t kLongSentence = 512;  // helpers.cpp LONG_SENTENCE_LEN

// numpy RandomState.random(): 53 bits from two 32-bit draws.
double np_random(NumpyRandomState& rs) {
  const uint32_t a = rs.next_uint32() >> 5, b = rs.next_uint32() >> 6;
  return (a * 67108864.0 + b) / 9007199254740992.0;
}

// numpy RandomState.randint(low, high): masked rejection over [low, high).
int64_t np_randint(NumpyRandomState& rs, int64_t low, int64_t high) {
  return low + static_cast<int64_t>(rs.random_interval(static_cast<uint64_t>(high - 1 - low)));
}

// helpers.cpp get_target_sample_len.
int32_t target_length(int32_t short_ratio, int32_t max_length, std::mt19937& gen) {
  if (short_ratio == 0) return max_length;
  const auto r = gen();
  if (r % short_ratio == 0) return static_cast<int32_t>(2 + r % (max_length - 1));
  return max_length;
}

}  // namespace

BertVocab BertVocab::from(const TextTokenizer& tok) {
  const auto* wp = dynamic_cast<const WordPieceTokenizer*>(&tok);
  MPT_CHECK(wp, str("the BERT dataset needs a WordPiece tokenizer, not --tokenizer-type ", tok.type()),
            "use --tokenizer-type BertWordPieceLowerCase or BertWordPieceCase with --vocab-file vocab.txt");
  BertVocab v;
  v.cls = wp->cls(), v.sep = wp->sep(), v.mask = wp->mask(), v.pad = wp->pad();
  v.vocab_size = wp->vocab_size();
  v.continuation.resize(static_cast<size_t>(v.vocab_size));
  for (int64_t i = 0; i < v.vocab_size; ++i) v.continuation[i] = wp->is_continuation(static_cast<int32_t>(i));
  return v;
}

BertDataset::BertDataset(std::shared_ptr<const IndexedDataset> data, DocRange docs, BertVocab vocab,
                         const BertDatasetConfig& cfg)
    : data_(std::move(data)), docs_(docs), vocab_(std::move(vocab)), cfg_(cfg) {
  MPT_CHECK(cfg_.seq_length >= 5, str("BERT --seq-length ", cfg_.seq_length, " is too short"),
            "a sample holds [CLS] A [SEP] B [SEP]: use --seq-length 5 or more (512 is usual)");
  MPT_CHECK(cfg_.mask_prob > 0 && cfg_.mask_prob < 1, str("--mask-prob ", cfg_.mask_prob, " must be in (0, 1)"), "");
  MPT_CHECK(cfg_.short_seq_prob >= 0 && cfg_.short_seq_prob <= 1,
            str("--short-seq-prob ", cfg_.short_seq_prob, " must be in [0, 1]"), "");
  MPT_CHECK(cfg_.seed > 0, str("BERT --seed ", cfg_.seed, " must be > 0"), "Megatron's build_mapping needs a positive seed");
  MPT_CHECK(cfg_.max_ngram >= 1, "masking n-gram length must be >= 1", "");
  MPT_CHECK(vocab_.cls >= 0 && vocab_.sep >= 0 && vocab_.mask >= 0 && vocab_.pad >= 0 &&
                static_cast<int64_t>(vocab_.continuation.size()) == vocab_.vocab_size,
            "BertVocab lacks [CLS] / [SEP] / [MASK] / [PAD] or its continuation table", "build it with BertVocab::from");
  MPT_CHECK(docs_.begin >= 0 && docs_.end <= data_->document_count() && docs_.begin <= docs_.end,
            str("document range [", docs_.begin, ", ", docs_.end, ") is outside ", data_->prefix(), " (",
                data_->document_count(), " documents)"), "");
  validate_token_ids(*data_, vocab_.vocab_size);
  build_sample_index();
}

void BertDataset::build_sample_index() {
  const int64_t* doc_idx = data_->document_indices();
  const int32_t* sizes = data_->sequence_lengths();
  const int32_t max_len = static_cast<int32_t>(cfg_.seq_length - 3);  // [CLS] and two [SEP]
  const int32_t min_sent = cfg_.binary_head ? 2 : 1;
  const int32_t short_ratio = cfg_.short_seq_prob > 0 ? static_cast<int32_t>(std::round(1.0 / cfg_.short_seq_prob)) : 0;
  const int64_t epochs = cfg_.num_samples < 0 ? 1 : std::numeric_limits<int32_t>::max() - 1;
  const uint64_t wanted = cfg_.num_samples < 0 ? std::numeric_limits<uint64_t>::max() : static_cast<uint64_t>(cfg_.num_samples);
  std::mt19937 gen(static_cast<uint32_t>(cfg_.seed));
  for (int64_t epoch = 0; epoch < epochs; ++epoch) {
    if (rows_.size() >= wanted) break;
    const size_t before = rows_.size();
    for (int64_t doc = docs_.begin; doc < docs_.end; ++doc) {
      const int64_t first = doc_idx[doc], last = doc_idx[doc + 1];
      int64_t remain = last - first, prev = first;
      bool long_sentence = false;
      if (remain > 1)
        for (int64_t s = first; s < last && !long_sentence; ++s) long_sentence = sizes[s] > kLongSentence;
      if (remain < min_sent || long_sentence) continue;
      int32_t seq_len = 0, num_sent = 0;
      int32_t target = target_length(short_ratio, max_len, gen);
      for (int64_t s = first; s < last; ++s) {
        seq_len += sizes[s];
        ++num_sent;
        --remain;
        if ((seq_len >= target && remain > 1 && num_sent >= min_sent) || remain == 0) {
          rows_.push_back({prev, s + 1, target});
          prev = s + 1;
          target = target_length(short_ratio, max_len, gen);
          seq_len = 0;
          num_sent = 0;
        }
      }
    }
    MPT_CHECK(rows_.size() > before,
              str(data_->prefix(), ": no BERT sample in documents [", docs_.begin, ", ", docs_.end, "): every document has ",
                  cfg_.binary_head ? "fewer than 2 sentences" : "no sentence", " or a sentence over ", kLongSentence,
                  " tokens"),
              cfg_.binary_head ? "preprocess with --split-sentences (one sequence per sentence), or pass --bert-no-binary-head"
                               : "check the data path");
  }
  std::mt19937_64 gen64(static_cast<uint64_t>(cfg_.seed + 1));
  for (int64_t i = static_cast<int64_t>(rows_.size()) - 1; i > 0; --i) {
    const auto j = static_cast<int64_t>(gen64() % static_cast<uint64_t>(i + 1));
    std::swap(rows_[i], rows_[j]);
  }
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

  // Masking candidates: whole words, never [CLS] / [SEP].
  std::vector<std::vector<int32_t>> cands;
  for (size_t i = 0; i < tokens.size(); ++i) {
    const int32_t t = tokens[i];
    if (t == vocab_.cls || t == vocab_.sep) continue;
    if (cfg_.whole_word && vocab_.continuation[static_cast<size_t>(t)] && !cands.empty()) {
      cands.back().push_back(static_cast<int32_t>(i));
    } else {
      cands.push_back({static_cast<int32_t>(i)});
    }
  }
  const double n_maskings =
      std::min(cfg_.mask_prob * static_cast<double>(target),
               std::max(1.0, std::nearbyint(static_cast<double>(tokens.size()) * cfg_.mask_prob)));
  // P(n) ∝ 1/n, normalised, then renormalised and accumulated as numpy.choice does.
  const int k = cfg_.max_ngram;
  std::vector<double> nprobs(k), cdf(k);
  double sum = 0;
  for (int i = 0; i < k; ++i) sum += (nprobs[i] = 1.0 / (i + 1));
  for (int i = 0; i < k; ++i) nprobs[i] /= sum;
  double psum = 0;
  for (int i = 0; i < k; ++i) psum += nprobs[i];
  double acc = 0;
  for (int i = 0; i < k; ++i) cdf[i] = (acc += nprobs[i] / psum);
  for (int i = 0; i < k; ++i) cdf[i] /= cdf[k - 1];

  std::vector<int64_t> order(cands.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = static_cast<int64_t>(i);
  rs.shuffle(order.data(), static_cast<int64_t>(order.size()));
  std::vector<int32_t> masked = tokens;
  std::vector<std::pair<int32_t, int32_t>> picked;  // (position, original id)
  std::unordered_set<int32_t> taken;
  std::vector<int32_t> gram;
  for (int64_t c : order) {
    if (static_cast<double>(picked.size()) >= n_maskings) break;
    const double u = np_random(rs);
    int n_gram = 1;
    while (n_gram < k && cdf[n_gram - 1] <= u) ++n_gram;
    // Shorten the n-gram until it fits under n_maskings; none fits: skip the candidate.
    bool skip = true;
    for (; n_gram >= 1; --n_gram) {
      gram.clear();
      for (int64_t w = c; w < c + n_gram && w < static_cast<int64_t>(cands.size()); ++w)
        gram.insert(gram.end(), cands[w].begin(), cands[w].end());
      if (n_maskings >= static_cast<double>(picked.size() + gram.size())) {
        skip = false;
        break;
      }
    }
    if (skip) continue;
    if (std::any_of(gram.begin(), gram.end(), [&](int32_t p) { return taken.count(p) > 0; })) continue;
    for (int32_t p : gram) {
      taken.insert(p);
      if (np_random(rs) < 0.8) {
        masked[p] = vocab_.mask;  // 80%
      } else if (np_random(rs) >= 0.5) {
        masked[p] = static_cast<int32_t>(np_randint(rs, 0, vocab_.vocab_size));  // 10%: random id
      }  // else 10%: unchanged
      picked.emplace_back(p, tokens[p]);
    }
  }
  std::sort(picked.begin(), picked.end());

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
