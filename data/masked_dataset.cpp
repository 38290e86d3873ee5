// data/masked_dataset.cpp — the sample index and n-gram masking of BERT and T5 (rules in the header).
#include "data/masked_dataset.h"

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

// helpers.cpp get_target_sample_len.
int32_t target_length(int32_t short_ratio, int32_t max_length, std::mt19937& gen) {
  if (short_ratio == 0) return max_length;
  const auto r = gen();
  if (r % short_ratio == 0) return static_cast<int32_t>(2 + r % (max_length - 1));
  return max_length;
}

}  // namespace

double np_random(NumpyRandomState& rs) {
  const uint32_t a = rs.next_uint32() >> 5, b = rs.next_uint32() >> 6;
  return (a * 67108864.0 + b) / 9007199254740992.0;
}

int64_t np_randint(NumpyRandomState& rs, int64_t low, int64_t high) {
  return low + static_cast<int64_t>(rs.random_interval(static_cast<uint64_t>(high - 1 - low)));
}

int64_t np_geometric(NumpyRandomState& rs, double p) {
  if (p >= 1.0 / 3.0) {  // random_geometric_search
    int64_t x = 1;
    double sum = p, prod = p;
    const double u = np_random(rs), q = 1.0 - p;
    while (u > sum) {
      prod *= q;
      sum += prod;
      ++x;
    }
    return x;
  }
  return static_cast<int64_t>(std::ceil(std::log1p(-np_random(rs)) / std::log(1.0 - p)));
}

const WordPieceTokenizer& wordpiece_of(const TextTokenizer& tok, const std::string& model) {
  const auto* wp = dynamic_cast<const WordPieceTokenizer*>(&tok);
  MPT_CHECK(wp, str("the ", model, " dataset needs a WordPiece tokenizer, not --tokenizer-type ", tok.type()),
            "use --tokenizer-type BertWordPieceLowerCase or BertWordPieceCase with --vocab-file vocab.txt");
  return *wp;
}

std::vector<uint8_t> continuation_table(const WordPieceTokenizer& wp) {
  std::vector<uint8_t> c(static_cast<size_t>(wp.vocab_size()));
  for (int64_t i = 0; i < wp.vocab_size(); ++i) c[static_cast<size_t>(i)] = wp.is_continuation(static_cast<int32_t>(i));
  return c;
}

void check_masked_dataset(const std::string& model, double mask_prob, double short_seq_prob, int32_t seed,
                          int max_ngram, const IndexedDataset& data, DocRange docs, int64_t vocab_size) {
  MPT_CHECK(mask_prob > 0 && mask_prob < 1, str("--mask-prob ", mask_prob, " must be in (0, 1)"), "");
  MPT_CHECK(short_seq_prob >= 0 && short_seq_prob <= 1, str("--short-seq-prob ", short_seq_prob, " must be in [0, 1]"),
            "");
  MPT_CHECK(seed > 0, str(model, " --seed ", seed, " must be > 0"), "Megatron's build_mapping needs a positive seed");
  MPT_CHECK(max_ngram >= 1, "masking n-gram length must be >= 1", "");
  MPT_CHECK(docs.begin >= 0 && docs.end <= data.document_count() && docs.begin <= docs.end,
            str("document range [", docs.begin, ", ", docs.end, ") is outside ", data.prefix(), " (",
                data.document_count(), " documents)"), "");
  validate_token_ids(data, vocab_size);
}

std::vector<std::array<int64_t, 3>> build_sentence_rows(const IndexedDataset& data, DocRange docs, int32_t max_len,
                                                        int32_t min_sent, double short_seq_prob, int32_t seed,
                                                        int64_t num_samples, const std::string& model,
                                                        const std::string& hint) {
  const int64_t* doc_idx = data.document_indices();
  const int32_t* sizes = data.sequence_lengths();
  const int32_t short_ratio = short_seq_prob > 0 ? static_cast<int32_t>(std::round(1.0 / short_seq_prob)) : 0;
  const int64_t epochs = num_samples < 0 ? 1 : std::numeric_limits<int32_t>::max() - 1;
  const uint64_t wanted = num_samples < 0 ? std::numeric_limits<uint64_t>::max() : static_cast<uint64_t>(num_samples);
  std::vector<std::array<int64_t, 3>> rows;
  std::mt19937 gen(static_cast<uint32_t>(seed));
  for (int64_t epoch = 0; epoch < epochs; ++epoch) {
    if (rows.size() >= wanted) break;
    const size_t before = rows.size();
    for (int64_t doc = docs.begin; doc < docs.end; ++doc) {
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
          rows.push_back({prev, s + 1, target});
          prev = s + 1;
          target = target_length(short_ratio, max_len, gen);
          seq_len = 0;
          num_sent = 0;
        }
      }
    }
    MPT_CHECK(rows.size() > before,
              str(data.prefix(), ": no ", model, " sample in documents [", docs.begin, ", ", docs.end,
                  "): every document has ", min_sent > 1 ? "fewer than 2 sentences" : "no sentence",
                  " or a sentence over ", kLongSentence, " tokens"),
              hint);
  }
  std::mt19937_64 gen64(static_cast<uint64_t>(seed + 1));
  for (int64_t i = static_cast<int64_t>(rows.size()) - 1; i > 0; --i) {
    const auto j = static_cast<int64_t>(gen64() % static_cast<uint64_t>(i + 1));
    std::swap(rows[i], rows[j]);
  }
  return rows;
}

MaskedSpans mask_spans(const std::vector<int32_t>& tokens, int64_t target, const std::vector<uint8_t>& continuation,
                       int32_t cls, int32_t sep, const SpanMasking& m, NumpyRandomState& rs,
                       const std::function<int32_t(int32_t)>& mask_token) {
  // Masking candidates: whole words, never [CLS] / [SEP].
  std::vector<std::vector<int32_t>> cands;
  for (size_t i = 0; i < tokens.size(); ++i) {
    const int32_t t = tokens[i];
    if (t == cls || t == sep) continue;
    if (m.whole_word && continuation[static_cast<size_t>(t)] && !cands.empty()) {
      cands.back().push_back(static_cast<int32_t>(i));
    } else {
      cands.push_back({static_cast<int32_t>(i)});
    }
  }
  const double n_maskings =
      std::min(m.mask_prob * static_cast<double>(target),
               std::max(1.0, std::nearbyint(static_cast<double>(tokens.size()) * m.mask_prob)));
  // P(n) ∝ 1/n, normalised, then renormalised and accumulated as numpy.choice does.
  const int k = m.max_ngram;
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
  MaskedSpans out;
  out.tokens = tokens;
  std::unordered_set<int32_t> taken;
  std::vector<int32_t> gram;
  for (int64_t c : order) {
    if (static_cast<double>(out.picked.size()) >= n_maskings) break;
    int n_gram = 1;
    if (m.geometric) {
      n_gram = static_cast<int>(std::min<int64_t>(np_geometric(rs, 0.2), k));
    } else {
      const double u = np_random(rs);
      while (n_gram < k && cdf[n_gram - 1] <= u) ++n_gram;
    }
    // Shorten the n-gram until it fits under n_maskings; none fits: skip the candidate.
    bool skip = true;
    for (; n_gram >= 1; --n_gram) {
      gram.clear();
      for (int64_t w = c; w < c + n_gram && w < static_cast<int64_t>(cands.size()); ++w)
        gram.insert(gram.end(), cands[w].begin(), cands[w].end());
      if (n_maskings >= static_cast<double>(out.picked.size() + gram.size())) {
        skip = false;
        break;
      }
    }
    if (skip) continue;
    if (std::any_of(gram.begin(), gram.end(), [&](int32_t p) { return taken.count(p) > 0; })) continue;
    for (int32_t p : gram) {
      taken.insert(p);
      out.tokens[p] = mask_token(tokens[p]);
      out.picked.emplace_back(p, tokens[p]);
    }
    out.spans.push_back(gram);
  }
  std::sort(out.picked.begin(), out.picked.end());
  std::stable_sort(out.spans.begin(), out.spans.end(),
                   [](const std::vector<int32_t>& a, const std::vector<int32_t>& b) { return a[0] < b[0]; });
  return out;
}

}  // namespace mpitron::data
