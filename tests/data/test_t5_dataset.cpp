// tests/data/test_t5_dataset.cpp — T5 span-corruption samples: equal to megatron-core's
// T5MaskedWordPieceDataset (sample index from its compiled build_mapping, samples from its
// __getitem__, tests/reference/t5_dataset_ref.py) on the sentence-level WikiText dataset of the
// BERT test, with Megatron's vocabulary for --vocab-extra-ids 100; then the construction rules
// checked directly over many samples (the encoder input with its spans put back is the row's
// text; labels are the decoder input shifted by one, ending in [EOS]; sentinels in order; the
// masking rate and the mean span length of the geometric n-grams); and the refusals by name.
#include <doctest/doctest.h>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "data/t5_dataset.h"
#include "data/wordpiece_tokenizer.h"
#include "tests/data/data_test_util.h"
#include "tests/data/wiki_sentences.h"

using namespace mpitron;
using namespace mpitron::data;
using namespace mpitron::testing;

namespace {

const nlohmann::json& ref() { return ref_json("t5_dataset_ref.json"); }
const WordPieceTokenizer& tok() { return bert_uncased(); }
std::shared_ptr<const IndexedDataset> wiki() { return wiki_sentences(); }
DocRange all_docs() { return all_wiki_docs(); }

}  // namespace

TEST_CASE("T5Dataset: sample index and samples equal megatron-core's") {
  const T5Vocab vocab = T5Vocab::from(tok(), ref()["extra_ids"].get<int64_t>());
  CHECK(vocab.vocab_size == ref()["vocab_size"].get<int64_t>());
  int compared = 0;
  for (const auto& c : ref()["configs"]) {
    CAPTURE(c["name"].get<std::string>());
    T5DatasetConfig cfg;
    cfg.encoder_seq_length = c["encoder_seq_length"].get<int64_t>();
    cfg.decoder_seq_length = c["decoder_seq_length"].get<int64_t>();
    cfg.seed = c["seed"].get<int32_t>();
    cfg.num_samples = c["num_samples"].get<int64_t>();
    cfg.short_seq_prob = c["short_seq_prob"].get<double>();
    cfg.mask_prob = c["mask_prob"].get<double>();
    T5Dataset ds(wiki(), all_docs(), vocab, cfg);
    const auto rows = c["sample_index"].get<std::vector<std::array<int64_t, 3>>>();
    REQUIRE(ds.size() == static_cast<int64_t>(rows.size()));
    CHECK(ds.sample_index() == rows);
    int i = 0;
    for (const auto& want : c["samples"]) {
      CAPTURE(i);
      const T5Sample s = ds.sample(i++);
      CHECK(as64(s.text_enc) == want["text_enc"].get<std::vector<int64_t>>());
      CHECK(as64(s.text_dec) == want["text_dec"].get<std::vector<int64_t>>());
      CHECK(as64(s.labels) == want["labels"].get<std::vector<int64_t>>());
      CHECK(as64(s.loss_mask) == want["loss_mask"].get<std::vector<int64_t>>());
      CHECK(as64(s.enc_mask) == want["enc_mask"].get<std::vector<int64_t>>());
      CHECK(as64(s.dec_mask) == want["dec_mask"].get<std::vector<int64_t>>());
      CHECK(static_cast<int>(s.truncated) == want["truncated"].get<int>());
      ++compared;
    }
  }
  CHECK(compared >= 100);
}

TEST_CASE("T5Dataset: span corruption puts the text back, labels follow the decoder input, spans average ~3 words") {
  const T5Vocab vocab = T5Vocab::from(tok(), 100);
  T5DatasetConfig cfg;
  cfg.encoder_seq_length = 128;
  cfg.decoder_seq_length = 64;
  cfg.seed = 4321;
  cfg.num_samples = 600;
  T5Dataset ds(wiki(), all_docs(), vocab, cfg);
  REQUIRE(ds.size() >= 600);
  int64_t masked = 0, kept = 0, spans = 0;
  for (int64_t i = 0; i < ds.size(); ++i) {
    const auto [beg, end, target] = ds.sample_index()[static_cast<size_t>(i)];
    const T5Sample s = ds.sample(i);
    REQUIRE(static_cast<int64_t>(s.text_enc.size()) == cfg.encoder_seq_length);
    REQUIRE(static_cast<int64_t>(s.text_dec.size()) == cfg.decoder_seq_length);
    std::vector<int32_t> text;
    for (int64_t k = beg; k < end; ++k) wiki()->get(k).append_to(text);
    if (static_cast<int64_t>(text.size()) > target) text.resize(static_cast<size_t>(target));
    // The decoder input is [BOS] followed by the labels but their last ([EOS]).
    int64_t n_dec = 0;
    while (n_dec < cfg.decoder_seq_length && s.loss_mask[static_cast<size_t>(n_dec)]) ++n_dec;
    REQUIRE(n_dec >= 1);  // [BOS] alone when nothing fits under the masking budget (a short target)
    CHECK(s.text_dec[0] == vocab.bos);
    CHECK(s.labels[static_cast<size_t>(n_dec - 1)] == vocab.eos);
    for (int64_t p = 1; p < n_dec; ++p) CHECK(s.text_dec[static_cast<size_t>(p)] == s.labels[static_cast<size_t>(p - 1)]);
    // Put each sentinel's span back into the encoder input: the row's text, sentinels in order.
    std::vector<std::vector<int32_t>> span_of;
    for (int64_t p = 0; p < n_dec - 1; ++p) {
      const int32_t t = s.labels[static_cast<size_t>(p)];
      if (span_of.size() < vocab.sentinels.size() && t == vocab.sentinels[span_of.size()]) span_of.emplace_back();
      else span_of.back().push_back(t);
    }
    std::vector<int32_t> back;
    size_t j = 0;
    for (size_t p = 0; p < s.text_enc.size() && s.enc_mask[p]; ++p) {
      if (j < span_of.size() && s.text_enc[p] == vocab.sentinels[j]) {
        back.insert(back.end(), span_of[j].begin(), span_of[j].end());
        ++j;
      } else {
        CHECK(s.text_enc[p] != vocab.mask);  // masked tokens live only on the decoder side
        back.push_back(s.text_enc[p]);
      }
    }
    CHECK(j == span_of.size());
    CHECK(back == text);
    for (const auto& sp : span_of) masked += static_cast<int64_t>(sp.size());
    spans += static_cast<int64_t>(span_of.size());
    kept += static_cast<int64_t>(text.size());
  }
  // 15% of the tokens (capped by the target), spans of geometric(0.2) words clipped to 10 (mean ≈ 3.6
  // words before the fitting), shortened to fit: between 2 and 5 tokens on average.
  const double rate = static_cast<double>(masked) / static_cast<double>(kept), mean = static_cast<double>(masked) / spans;
  CAPTURE(rate);
  CAPTURE(mean);
  CHECK(rate > 0.12);
  CHECK(rate < 0.16);
  CHECK(mean > 2.0);
  CHECK(mean < 5.0);
}

TEST_CASE("T5Dataset: refusals name the flag") {
  CHECK_THROWS_WITH_AS(T5Vocab::from(tok(), 0), doctest::Contains("--vocab-extra-ids"), Error);
  const T5Vocab vocab = T5Vocab::from(tok(), 100);
  T5DatasetConfig cfg;
  cfg.encoder_seq_length = 2;
  CHECK_THROWS_WITH_AS(T5Dataset(wiki(), all_docs(), vocab, cfg), doctest::Contains("--encoder-seq-length"), Error);
  cfg.encoder_seq_length = 256;
  cfg.decoder_seq_length = 4;  // a 15% corruption of ~250 tokens needs far more decoder positions
  // Some sample of the dataset is refused, naming `flag`.
  auto refuses = [](const T5Dataset& ds, const std::string& flag) {
    for (int64_t i = 0; i < ds.size(); ++i) {
      try {
        ds.sample(i);
      } catch (const Error& e) {
        return std::string(e.what()).find(flag) != std::string::npos;
      }
    }
    return false;
  };
  CHECK(refuses(T5Dataset(wiki(), all_docs(), vocab, cfg), "--decoder-seq-length"));
  T5Vocab few = vocab;
  few.sentinels.resize(1);
  cfg.decoder_seq_length = 128;
  CHECK(refuses(T5Dataset(wiki(), all_docs(), few, cfg), "--vocab-extra-ids"));
}
