// tests/data/test_bert_dataset.cpp — BERT samples: equal to megatron-core's
// BERTMaskedWordPieceDataset (sample index from its compiled build_mapping, samples from
// its __getitem__, tests/reference/bert_dataset_ref.py) on a sentence-level WikiText
// dataset; and the construction rules checked directly: shapes, [CLS] A [SEP] B [SEP],
// types, consecutive sentences of one document, length ≤ seq_length, the masking rate
// and its 80/10/10 split within statistical bounds, [CLS]/[SEP]/[PAD] never masked,
// determinism per (seed, index), --bert-no-binary-head, errors.
#include <doctest/doctest.h>

#include <cmath>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "data/bert_dataset.h"
#include "data/text_tokenizer.h"
#include "data/wordpiece_tokenizer.h"
#include "tests/data/data_test_util.h"
#include "tests/data/wiki_sentences.h"
#include "tests/error_of.h"  // error_of

using namespace mpitron;
using mpitron::testing_util::error_of;
using namespace mpitron::data;
using namespace mpitron::testing;

namespace {

const nlohmann::json& ref() { return ref_json("bert_dataset_ref.json"); }
const WordPieceTokenizer& tok() { return bert_uncased(); }
std::shared_ptr<const IndexedDataset> wiki() { return wiki_sentences(); }
DocRange all_docs() { return all_wiki_docs(); }

}  // namespace

TEST_CASE("BertDataset: sample index and samples equal megatron-core's") {
  CHECK(wiki()->document_count() == ref()["documents"].get<int64_t>());
  CHECK(tok().vocab_size() == ref()["vocab_size"].get<int64_t>());
  for (const auto& c : ref()["configs"]) {
    CAPTURE(c["name"].get<std::string>());
    BertDatasetConfig cfg;
    cfg.seq_length = c["seq_length"].get<int64_t>();
    cfg.binary_head = c["binary_head"].get<bool>();
    cfg.seed = c["seed"].get<int32_t>();
    cfg.num_samples = c["num_samples"].get<int64_t>();
    cfg.short_seq_prob = c["short_seq_prob"].get<double>();
    cfg.mask_prob = c["mask_prob"].get<double>();
    BertDataset ds(wiki(), all_docs(), BertVocab::from(tok()), cfg);
    const auto rows = c["sample_index"].get<std::vector<std::array<int64_t, 3>>>();
    REQUIRE(ds.size() == static_cast<int64_t>(rows.size()));
    CHECK(ds.sample_index() == rows);
    int compared = 0;
    for (const auto& want : c["samples"]) {
      CAPTURE(compared);
      const BertSample s = ds.sample(compared++);
      CHECK(as64(s.tokens) == want["text"].get<std::vector<int64_t>>());
      CHECK(as64(s.types) == want["types"].get<std::vector<int64_t>>());
      CHECK(as64(s.labels) == want["labels"].get<std::vector<int64_t>>());
      CHECK(as64(s.loss_mask) == want["loss_mask"].get<std::vector<int64_t>>());
      CHECK(as64(s.padding_mask) == want["padding_mask"].get<std::vector<int64_t>>());
      CHECK(s.is_random == want["is_random"].get<int>());
      CHECK(static_cast<int>(s.truncated) == want["truncated"].get<int>());
    }
    CHECK(compared >= 30);
  }
}

TEST_CASE("BertDataset: construction rules, masking rate and 80/10/10 split, determinism") {
  for (bool binary : {true, false}) {
    CAPTURE(binary);
    BertDatasetConfig cfg;
    cfg.seq_length = 96;
    cfg.binary_head = binary;
    cfg.seed = 4321;
    cfg.num_samples = 1200;
    BertDataset ds(wiki(), all_docs(), BertVocab::from(tok()), cfg);
    REQUIRE(ds.size() >= 1200);
    const int64_t* doc_idx = wiki()->document_indices();
    int64_t masked = 0, as_mask = 0, unchanged = 0, randomised = 0, eligible = 0, is_random = 0, want_masked = 0,
            total = 0;
    for (int64_t i = 0; i < ds.size(); ++i) {
      const auto [beg, end, target] = ds.sample_index()[i];
      // Consecutive sentences of one document.
      const int64_t* d = std::upper_bound(doc_idx, doc_idx + wiki()->document_count() + 1, beg) - 1;
      REQUIRE(end <= d[1]);
      REQUIRE(end - beg >= (binary ? 2 : 1));
      REQUIRE(target <= cfg.seq_length - 3);
      const BertSample s = ds.sample(i);
      REQUIRE(static_cast<int64_t>(s.tokens.size()) == cfg.seq_length);
      REQUIRE(s.types.size() == s.tokens.size());
      REQUIRE(s.labels.size() == s.tokens.size());
      REQUIRE(s.loss_mask.size() == s.tokens.size());
      REQUIRE(s.padding_mask.size() == s.tokens.size());
      REQUIRE(s.length <= cfg.seq_length);
      REQUIRE(s.length <= target + 3);
      // Originals: the row's tokens, in order (A then B, or B then A when is_random).
      std::vector<int32_t> text;
      for (int64_t k = beg; k < end; ++k) wiki()->get(k).append_to(text);
      std::vector<int32_t> orig(s.tokens.begin(), s.tokens.begin() + s.length);
      for (size_t p = 0; p < orig.size(); ++p)
        if (s.loss_mask[p]) orig[p] = s.labels[p];
      CHECK(orig[0] == tok().cls());
      CHECK(orig.back() == tok().sep());
      const int64_t nsep = std::count(orig.begin(), orig.end(), tok().sep());
      CHECK(nsep == (binary ? 2 : 1));
      const size_t sep1 = std::find(orig.begin(), orig.end(), tok().sep()) - orig.begin();
      std::vector<int32_t> a(orig.begin() + 1, orig.begin() + sep1), b;
      if (binary) b.assign(orig.begin() + sep1 + 1, orig.end() - 1);
      if (!s.truncated) {  // the untruncated segments are the row's text, split at one sentence boundary
        std::vector<int32_t> joined = s.is_random ? b : a;
        const auto& second = s.is_random ? a : b;
        joined.insert(joined.end(), second.begin(), second.end());
        CHECK(joined == text);
      } else {
        CHECK(static_cast<int64_t>(a.size() + b.size()) == target);
      }
      for (int64_t p = 0; p < cfg.seq_length; ++p) {
        const bool pad = p >= s.length;
        // 0 on padding, and (Megatron's rule) wherever the token is [PAD], e.g. a random replacement.
        CHECK(s.padding_mask[p] == (pad || s.tokens[p] == tok().pad() ? 0 : 1));
        CHECK(s.types[p] == (!pad && binary && p > static_cast<int64_t>(sep1) ? 1 : 0));
        CHECK((s.labels[p] >= 0) == (s.loss_mask[p] == 1));
        if (pad || orig[p] == tok().cls() || orig[p] == tok().sep()) {
          CHECK(s.loss_mask[p] == 0);  // never [CLS], [SEP] or padding
          continue;
        }
        ++eligible;
        if (!s.loss_mask[p]) {
          CHECK(s.tokens[p] == orig[p]);
          continue;
        }
        ++masked;
        if (s.tokens[p] == tok().mask()) ++as_mask;
        else if (s.tokens[p] == s.labels[p]) ++unchanged;
        else ++randomised;
      }
      // Megatron's count: min(p · target, max(1, round(p · len))) tokens at most.
      const int64_t nmask = std::count(s.loss_mask.begin(), s.loss_mask.end(), 1);
      const double cap = std::min(0.15 * target, std::max(1.0, std::nearbyint(0.15 * s.length)));
      CHECK(nmask <= cap);
      want_masked += static_cast<int64_t>(std::floor(cap));
      is_random += s.is_random;
      total += s.length;
    }
    const double n = static_cast<double>(masked);
    MESSAGE("binary=", binary, ": ", ds.size(), " samples, masked ", masked, " of ", total, " tokens (",
            100.0 * masked / total, "%; ", 100.0 * masked / eligible, "% of those not [CLS]/[SEP]), [MASK] ", as_mask / n, ", random ", randomised / n, ", unchanged ",
            unchanged / n, ", is_random ", static_cast<double>(is_random) / ds.size());
    // Rate: ~15% of the sequence (a little more of the eligible tokens), nearly always the cap.
    CHECK(masked >= 0.97 * want_masked);
    // The cap is min(0.15 · target, round(0.15 · length)) with target ≥ length - 3 and whole
    // tokens under it, so the rate lands a little under 15% (13.7% here), as in Megatron.
    CHECK(static_cast<double>(masked) / total > 0.13);
    CHECK(static_cast<double>(masked) / total < 0.16);
    // 80/10/10 within 5 standard deviations (random ids equal to the original count as unchanged).
    auto within = [&](double got, double p) { return std::fabs(got / n - p) < 5 * std::sqrt(p * (1 - p) / n); };
    CHECK(within(as_mask, 0.8));
    CHECK(within(randomised, 0.1 * (1 - 1.0 / tok().vocab_size())));
    CHECK(within(unchanged, 0.1 + 0.1 / tok().vocab_size()));
    if (binary) {
      CHECK(std::fabs(static_cast<double>(is_random) / ds.size() - 0.5) < 5 * std::sqrt(0.25 / ds.size()));
    } else {
      CHECK(is_random == 0);
    }
    // Deterministic per (seed, index), whatever the order of calls or the object.
    BertDataset again(wiki(), all_docs(), BertVocab::from(tok()), cfg);
    for (int64_t i : {int64_t{17}, int64_t{3}, ds.size() - 1, int64_t{17}}) {
      const BertSample x = ds.sample(i), y = again.sample(i);
      CHECK(x.tokens == y.tokens);
      CHECK(x.labels == y.labels);
      CHECK(x.is_random == y.is_random);
    }
    cfg.seed += 1;
    BertDataset other(wiki(), all_docs(), BertVocab::from(tok()), cfg);
    CHECK(other.sample_index() != ds.sample_index());
  }
}

TEST_CASE("BertDataset: short sequences fit, one epoch without num_samples, document ranges") {
  BertDatasetConfig cfg;
  cfg.seq_length = 8;
  cfg.num_samples = -1;
  BertDataset ds(wiki(), {10, 40}, BertVocab::from(tok()), cfg);
  const int64_t* doc_idx = wiki()->document_indices();
  for (int64_t i = 0; i < ds.size(); ++i) {
    const auto& r = ds.sample_index()[i];
    CHECK(r[0] >= doc_idx[10]);
    CHECK(r[1] <= doc_idx[40]);
    const BertSample s = ds.sample(i);
    CHECK(s.length <= 8);
    // target ≤ 5: Megatron's cap 0.15 · target < 1 token, so nothing is masked.
    CHECK(std::count(s.loss_mask.begin(), s.loss_mask.end(), 1) <= std::max<int64_t>(0, static_cast<int64_t>(0.15 * r[2])));
  }
  CHECK_THROWS(ds.sample(ds.size()));
}

TEST_CASE("BertDataset: clear errors for a non-WordPiece tokenizer, document-level data, bad settings") {
  auto gpt2 = make_tokenizer({"GPT2BPETokenizer", "", "", ""});
  CHECK(error_of([&] { BertVocab::from(*gpt2); }).find("BertWordPieceLowerCase") != std::string::npos);
  // Every document one sentence (a _text_document file): no sample with the binary head.
  TempDir dir("bertdoc");
  IndexedDatasetWriter w((dir.path / "doc").string(), DType::U16);
  for (int d = 0; d < 5; ++d) {
    std::vector<int32_t> ids{10, 11, 12};
    w.add_tokens(ids.data(), 3);
    w.end_document();
  }
  w.finalize();
  auto docs = std::make_shared<const IndexedDataset>((dir.path / "doc").string());
  BertDatasetConfig cfg;
  cfg.num_samples = 10;
  std::string e = error_of([&] { BertDataset ds(docs, {0, 5}, BertVocab::from(tok()), cfg); });
  CHECK(e.find("--split-sentences") != std::string::npos);
  cfg.binary_head = false;  // one segment per document works
  BertDataset one(docs, {0, 5}, BertVocab::from(tok()), cfg);
  CHECK(one.size() == 10);
  cfg.seq_length = 4;
  CHECK(error_of([&] { BertDataset ds(docs, {0, 5}, BertVocab::from(tok()), cfg); }).find("--seq-length") != std::string::npos);
  cfg.seq_length = 64;
  CHECK(error_of([&] { BertDataset ds(docs, {0, 6}, BertVocab::from(tok()), cfg); }).find("outside") != std::string::npos);
}
