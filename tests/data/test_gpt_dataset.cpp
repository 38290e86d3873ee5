// tests/data/test_gpt_dataset.cpp — GPT sample indices against numpy/Megatron
// (tests/data/ref/gpt_dataset_ref.json from tests/reference/gpt_dataset_ref.py),
// samples across document boundaries, the on-disk cache, blending, sampler resume.
#include <doctest/doctest.h>

#include <filesystem>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "data/blended_dataset.h"
#include "data/gpt_dataset.h"
#include "data/sampler.h"
#include "tests/data/data_test_util.h"

using namespace mpitron;
using namespace mpitron::data;
using namespace mpitron::testing;

namespace {

const nlohmann::json& ref() {
  static nlohmann::json r = nlohmann::json::parse(read_all(source_path("tests/data/ref/gpt_dataset_ref.json")));
  return r;
}

// Dataset whose document d has doc_lengths[d] tokens; token value = 1000·d + position
// (mod 65535), so every sample can be checked against the indices.
std::shared_ptr<IndexedDataset> write_dataset(const std::string& prefix, const std::vector<int64_t>& lengths) {
  IndexedDatasetWriter w(prefix, DType::I32);
  for (size_t d = 0; d < lengths.size(); ++d) {
    std::vector<int32_t> ids(lengths[d]);
    for (int64_t k = 0; k < lengths[d]; ++k) ids[k] = static_cast<int32_t>(1000 * d + k);
    w.add_document(ids.data(), {static_cast<int32_t>(lengths[d])});
  }
  w.finalize();
  return std::make_shared<IndexedDataset>(prefix);
}

std::vector<int64_t> ref_lengths() { return ref().at("doc_lengths").get<std::vector<int64_t>>(); }

}  // namespace

TEST_CASE("gpt dataset: NumpyRandomState equals numpy.random.RandomState bit for bit") {
  for (const auto& r : ref().at("rng")) {
    const uint32_t seed = r.at("seed").get<uint32_t>();
    CAPTURE(seed);
    NumpyRandomState rs(seed);
    auto raw = r.at("raw").get<std::vector<uint64_t>>();
    for (size_t i = 0; i < raw.size(); ++i) REQUIRE_MESSAGE(rs.next_uint32() == raw[i], "draw " << i);
    NumpyRandomState b(seed);
    std::vector<uint64_t> m32{1, 2, 6, 1000, (1ull << 31) + 5}, m64{1ull << 32, (1ull << 40) + 3, (1ull << 63) - 1};
    auto e32 = r.at("bounded32").get<std::vector<uint64_t>>(), e64 = r.at("bounded64").get<std::vector<uint64_t>>();
    for (size_t i = 0; i < m32.size(); ++i) CHECK(b.random_interval(m32[i]) == e32[i]);
    for (size_t i = 0; i < m64.size(); ++i) CHECK(b.random_interval(m64[i]) == e64[i]);
    NumpyRandomState s(seed);
    for (const auto& expect : r.at("shuffles")) {
      auto e = expect.get<std::vector<int64_t>>();
      std::vector<int64_t> a(e.size());
      for (size_t i = 0; i < a.size(); ++i) a[i] = static_cast<int64_t>(i);
      s.shuffle(a.data(), static_cast<int64_t>(a.size()));
      CHECK(a == e);
    }
  }
}

TEST_CASE("gpt dataset: split string → document ranges as megatron-core (and the legacy rule)") {
  for (const auto& s : ref().at("splits")) {
    CAPTURE(s.dump());
    for (auto [rule, field] : {std::pair{SplitRule::MegatronCore, "bounds"}, std::pair{SplitRule::Legacy, "bounds_legacy"}}) {
      auto r = split_document_ranges(s.at("split").get<std::string>(), s.at("num_documents").get<int64_t>(), rule);
      auto b = s.at(field).get<std::vector<std::vector<int64_t>>>();
      for (int k = 0; k < 3; ++k) {
        CHECK(r[k].begin == b[k][0]);
        CHECK(r[k].end == b[k][1]);
      }
    }
  }
  CHECK_THROWS_AS(split_document_ranges("0,0,0", 10), Error);
  CHECK_THROWS_AS(split_document_ranges("1,2,3,4", 10), Error);
  CHECK_THROWS_AS(split_document_ranges("abc", 10), Error);
  CHECK_THROWS_AS(split_document_ranges("1..2,3", 10), Error);
}

TEST_CASE("gpt dataset: doc_idx, sample_idx, shuffle_idx equal the numpy reference") {
  const auto lengths = ref_lengths();
  for (const auto& c : ref().at("cases")) {
    CAPTURE(c.at("begin").get<int>());
    CAPTURE(c.at("seq_length").get<int>());
    CAPTURE(c.at("num_samples").get<int>());
    GPTIndices g = build_gpt_indices(lengths, DocRange{c.at("begin").get<int64_t>(), c.at("end").get<int64_t>()},
                                     c.at("seq_length").get<int64_t>(), c.at("num_samples").get<int64_t>(),
                                     c.at("seed").get<uint32_t>());
    CHECK(g.num_epochs == c.at("num_epochs").get<int64_t>());
    CHECK(g.separate_final_epoch == c.at("separate_final_epoch").get<bool>());
    CHECK(g.doc_idx == c.at("doc_idx").get<std::vector<int32_t>>());
    CHECK(g.sample_idx == c.at("sample_idx").get<std::vector<int64_t>>());
    CHECK(g.shuffle_idx == c.at("shuffle_idx").get<std::vector<int64_t>>());
  }
}

TEST_CASE("gpt dataset: samples span documents, seq_len + 1 tokens, cached indices") {
  TempDir dir("gpt");
  const auto lengths = ref_lengths();
  auto data = write_dataset(dir / "corpus_text_document", lengths);
  const auto& c = ref().at("cases")[3];  // docs [5, 31), seq 32, 200 samples, seed 42
  GPTDatasetConfig cfg;
  cfg.sequence_length = c.at("seq_length").get<int64_t>();
  cfg.num_samples = c.at("num_samples").get<int64_t>();
  cfg.seed = c.at("seed").get<uint32_t>();
  DocRange docs{c.at("begin").get<int64_t>(), c.at("end").get<int64_t>()};
  GPTDataset ds(data, docs, cfg, "train");
  CHECK_FALSE(ds.loaded_from_cache());
  REQUIRE(std::filesystem::exists(ds.cache_path()));
  CHECK(ds.size() == static_cast<int64_t>(c.at("shuffle_idx").size()));
  CHECK(ds.indices().shuffle_idx == c.at("shuffle_idx").get<std::vector<int64_t>>());

  // Expected sample: walk the numpy rows token by token.
  auto doc_idx = c.at("doc_idx").get<std::vector<int64_t>>();
  auto rows = c.at("sample_idx").get<std::vector<int64_t>>();
  auto shuf = c.at("shuffle_idx").get<std::vector<int64_t>>();
  for (int64_t i = 0; i < ds.size(); ++i) {
    int64_t r = shuf[i], d = rows[2 * r], off = rows[2 * r + 1];
    std::vector<int32_t> expect;
    while (static_cast<int64_t>(expect.size()) < cfg.sequence_length + 1) {
      int64_t doc = doc_idx[d];
      if (off < lengths[doc]) {
        expect.push_back(static_cast<int32_t>(1000 * doc + off++));
      } else {
        ++d;
        off = 0;
      }
    }
    REQUIRE_MESSAGE(ds.sample(i) == expect, "sample " << i);
  }

  // A second construction loads the cache; a different seed is another file.
  GPTDataset again(data, docs, cfg, "train");
  CHECK(again.loaded_from_cache());
  CHECK(again.cache_path() == ds.cache_path());
  CHECK(again.indices().sample_idx == ds.indices().sample_idx);
  GPTDatasetConfig other = cfg;
  other.seed = 43;
  GPTDataset reseeded(data, docs, other, "train");
  CHECK_FALSE(reseeded.loaded_from_cache());
  CHECK(reseeded.cache_path() != ds.cache_path());
  CHECK(reseeded.indices().shuffle_idx != ds.indices().shuffle_idx);

  // A corrupt cache (truncated, or one flipped byte) is rebuilt, not trusted.
  std::string bytes = read_all(ds.cache_path());
  write_all(ds.cache_path(), bytes.substr(0, bytes.size() / 2));
  GPTDataset rebuilt(data, docs, cfg, "train");
  CHECK_FALSE(rebuilt.loaded_from_cache());
  CHECK(rebuilt.indices().shuffle_idx == ds.indices().shuffle_idx);
  bytes[bytes.size() / 2] ^= 0x40;
  write_all(ds.cache_path(), bytes);
  GPTDataset rebuilt2(data, docs, cfg, "train");
  CHECK_FALSE(rebuilt2.loaded_from_cache());
  CHECK(GPTDataset(data, docs, cfg, "train").loaded_from_cache());

  // An explicit cache dir.
  GPTDatasetConfig elsewhere = cfg;
  elsewhere.cache_dir = dir / "cache";
  GPTDataset ds2(data, docs, elsewhere, "train");
  CHECK(ds2.cache_path().rfind(dir / "cache", 0) == 0);
}

TEST_CASE("gpt dataset: a sequence length the data cannot serve is a clear error") {
  TempDir dir("gptshort");
  auto data = write_dataset(dir / "tiny", {5, 7, 3});  // 15 tokens
  GPTDatasetConfig cfg;
  cfg.sequence_length = 15;  // needs 16 tokens
  try {
    GPTDataset ds(data, DocRange{0, 3}, cfg, "train");
    FAIL("no error");
  } catch (const Error& e) {
    std::string w = e.what();
    CHECK(w.find("15 tokens") != std::string::npos);
    CHECK(w.find("--seq-length 15") != std::string::npos);
  }
  cfg.sequence_length = 14;
  GPTDataset ok(data, DocRange{0, 3}, cfg, "train");
  CHECK(ok.size() == 1);
  CHECK(ok.sample(0).size() == 15);
  // An empty split is an error too (e.g. --split 100,0,0 asked for valid data).
  auto r = split_document_ranges("100,0,0", 3);
  CHECK_THROWS_AS(GPTDataset(data, r[1], cfg, "valid"), Error);
}

TEST_CASE("blended dataset: greedy counts follow the weights") {
  std::vector<int16_t> di;
  std::vector<int64_t> dsi;
  for (const auto& b : ref().at("blending")) {  // megatron-core helpers.build_blending_indices
    build_blending_indices(b.at("weights").get<std::vector<double>>(), b.at("size").get<int64_t>(), di, dsi);
    CHECK(di == b.at("dataset_index").get<std::vector<int16_t>>());
    CHECK(dsi == b.at("dataset_sample_index").get<std::vector<int64_t>>());
  }
  build_blending_indices({0.3, 0.7}, 10, di, dsi);
  // k=0,1: errors 0.3/0.7 → 1; then greedy (Megatron's helpers.cpp).
  CHECK(di == std::vector<int16_t>{1, 0, 1, 1, 0, 1, 1, 0, 1, 1});
  CHECK(dsi == std::vector<int64_t>{0, 0, 1, 2, 1, 3, 4, 2, 5, 6});
  build_blending_indices({0.2, 0.3, 0.5}, 100000, di, dsi);
  std::vector<int64_t> count(3, 0);
  for (auto d : di) ++count[d];
  CHECK(count == std::vector<int64_t>{20000, 30000, 50000});
  for (int64_t k = 1; k < 100000; ++k) {  // never more than one sample off the ideal share
    if (k % 997 != 0) continue;
    std::vector<int64_t> c(3, 0);
    for (int64_t j = 0; j < k; ++j) ++c[di[j]];
    CHECK(std::abs(c[0] - 0.2 * k) <= 1.0);
    CHECK(std::abs(c[2] - 0.5 * k) <= 1.0);
  }
  build_blending_indices({1, 1}, 4, di, dsi);  // ties go to the lowest index
  CHECK(di == std::vector<int16_t>{0, 1, 0, 1});
  CHECK(blended_samples_per_dataset({0.3, 0.7}, 1000) == std::vector<int64_t>{302, 704});

  DataBlend b = parse_data_path({"0.3", "a", "0.7", "b"});
  CHECK(b.prefixes == std::vector<std::string>{"a", "b"});
  CHECK(b.weights[0] == doctest::Approx(0.3));
  CHECK(parse_data_path({"only"}).weights == std::vector<double>{1.0});
  CHECK_THROWS_AS(parse_data_path({"0.3", "a", "b"}), Error);
  CHECK_THROWS_AS(parse_data_path({"x", "a", "0.7", "b"}), Error);

  TempDir dir("blend");
  auto a = write_dataset(dir / "a", {40, 50, 60});
  auto c = write_dataset(dir / "c", {30, 30, 30, 30});
  GPTDatasetConfig cfg;
  cfg.sequence_length = 8;
  const int64_t size = 200;
  auto need = blended_samples_per_dataset({0.3, 0.7}, size);
  cfg.num_samples = need[0];
  auto da = std::make_shared<GPTDataset>(a, DocRange{0, 3}, cfg, "train");
  cfg.num_samples = need[1];
  auto dc = std::make_shared<GPTDataset>(c, DocRange{0, 4}, cfg, "train");
  BlendedDataset blend({da, dc}, {0.3, 0.7}, size);
  int from_a = 0;
  for (int64_t i = 0; i < size; ++i) {
    std::vector<int32_t> s = blend.sample(i);
    const auto& src = blend.dataset_of(i) == 0 ? *da : *dc;
    CHECK(s == src.sample(blend.dataset_sample_of(i)));
    from_a += blend.dataset_of(i) == 0;
  }
  CHECK(from_a == 60);
}

TEST_CASE("sampler: data-parallel micro-batches, resume continues with the next sample") {
  const int64_t total = 1000, mbs = 2, gbs = 16;
  const int dp = 4;
  // An uninterrupted run: every rank's micro-batches for 10 steps.
  std::vector<std::vector<int64_t>> full(dp);
  for (int r = 0; r < dp; ++r) {
    PretrainingSampler s(total, 0, mbs, gbs, r, dp);
    CHECK(s.micro_batches_per_step() == 2);
    for (int step = 0; step < 10; ++step)
      for (auto& mb : s.next_step()) full[r].insert(full[r].end(), mb.begin(), mb.end());
    CHECK(s.consumed_samples() == 10 * gbs);
  }
  // Step 0: rank 0 gets 0,1 then 8,9; rank 3 gets 6,7 then 14,15.
  CHECK(std::vector<int64_t>(full[0].begin(), full[0].begin() + 4) == std::vector<int64_t>{0, 1, 8, 9});
  CHECK(std::vector<int64_t>(full[3].begin(), full[3].begin() + 4) == std::vector<int64_t>{6, 7, 14, 15});
  // Every sample of the 10 steps read exactly once across ranks.
  std::vector<int> seen(10 * gbs, 0);
  for (const auto& v : full)
    for (auto i : v) ++seen.at(i);
  for (int x : seen) CHECK(x == 1);
  // Stop after 4 steps, resume from the checkpoint's consumed_samples.
  for (int r = 0; r < dp; ++r) {
    PretrainingSampler first(total, 0, mbs, gbs, r, dp);
    std::vector<int64_t> got;
    for (int step = 0; step < 4; ++step)
      for (auto& mb : first.next_step()) got.insert(got.end(), mb.begin(), mb.end());
    PretrainingSampler resumed(total, first.consumed_samples(), mbs, gbs, r, dp);
    for (int step = 4; step < 10; ++step)
      for (auto& mb : resumed.next_step()) got.insert(got.end(), mb.begin(), mb.end());
    CHECK(got == full[r]);
  }
  // The last incomplete global batch is dropped; bad layouts are errors.
  PretrainingSampler tail(total, 992, mbs, gbs, 0, dp);
  CHECK(tail.next_step().empty());
  CHECK_THROWS_AS(PretrainingSampler(total, 0, 2, 12, 0, 4), Error);
  CHECK_THROWS_AS(PretrainingSampler(total, total, 2, 16, 0, 4), Error);
}
