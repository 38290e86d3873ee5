// tests/data/test_indexed_dataset.cpp — MMIDIDX v1 reader/writer: round trip per
// dtype, every validation error on corrupt files, and interop with
// megatron-core (files written by tests/reference/megatron_interop.py).
#include <doctest/doctest.h>

#include <cstring>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "data/indexed_dataset.h"
#include "tests/data/data_test_util.h"

using namespace mpitron;
using namespace mpitron::data;
using namespace mpitron::testing;

namespace {

// Expects `fn` to throw an mpitron::Error whose text contains every needle.
template <typename Fn> void expect_error(Fn&& fn, std::initializer_list<std::string> needles) {
  try {
    fn();
    FAIL("expected an error containing '" << *needles.begin() << "'");
  } catch (const Error& e) {
    std::string what = e.what();
    for (const auto& n : needles) CHECK_MESSAGE(what.find(n) != std::string::npos, "'" << n << "' not in: " << what);
  }
}

// A small u16 dataset: 3 documents, the second made of two sequences, plus an empty one.
std::string write_small(const std::string& prefix) {
  IndexedDatasetWriter w(prefix, DType::U16);
  std::vector<int32_t> a{1, 2, 3}, b{10, 11, 12, 13, 14}, c{50256};
  w.add_tokens(a.data(), 3);
  w.end_document();
  w.add_document(b.data(), {2, 3});
  w.add_document(nullptr, {});
  w.add_document(c.data(), {1});
  w.finalize();
  return prefix;
}

void patch(const std::string& path, size_t offset, const void* bytes, size_t n) {
  std::string s = read_all(path);
  std::memcpy(&s[offset], bytes, n);
  write_all(path, s);
}

// Writes documents (lists of sequences of numbers) with our writer, typed.
template <typename T> void write_docs(IndexedDatasetWriter& w, const nlohmann::json& docs) {
  for (const auto& doc : docs) {
    for (const auto& seq : doc) {
      std::vector<T> v;
      for (const auto& x : seq) v.push_back(x.is_number_float() ? static_cast<T>(x.get<double>()) : x.get<T>());
      w.add_sequence<T>(v.data(), static_cast<int64_t>(v.size()));
    }
    w.end_document();
  }
}

void write_docs_any(IndexedDatasetWriter& w, const nlohmann::json& docs) {
  switch (w.dtype()) {
    case DType::U8: write_docs<uint8_t>(w, docs); break;
    case DType::I8: write_docs<int8_t>(w, docs); break;
    case DType::I16: write_docs<int16_t>(w, docs); break;
    case DType::I32: write_docs<int32_t>(w, docs); break;
    case DType::I64: write_docs<int64_t>(w, docs); break;
    case DType::F64: write_docs<double>(w, docs); break;
    case DType::F32: write_docs<float>(w, docs); break;
    case DType::U16: write_docs<uint16_t>(w, docs); break;
  }
}

// Reads element k of view v as the JSON value the manifest holds.
bool equal_element(const TokenView& v, int64_t k, const nlohmann::json& x) {
  switch (v.dtype) {
    case DType::F64: return v.as<double>()[k] == x.get<double>();
    case DType::F32: return v.as<float>()[k] == static_cast<float>(x.get<double>());
    default: return v[k] == x.get<int64_t>();
  }
}

void check_docs(const IndexedDataset& ds, const nlohmann::json& docs) {
  int64_t seq = 0;
  REQUIRE(ds.document_count() == static_cast<int64_t>(docs.size()));
  for (size_t d = 0; d < docs.size(); ++d) {
    CHECK(ds.document_indices()[d] == seq);
    for (const auto& s : docs[d]) {
      TokenView v = ds.get(seq);
      REQUIRE(v.size == static_cast<int64_t>(s.size()));
      for (int64_t k = 0; k < v.size; ++k) CHECK_MESSAGE(equal_element(v, k, s[k]), ds.prefix() << " seq " << seq << "[" << k << "]");
      ++seq;
    }
  }
  CHECK(ds.document_indices()[docs.size()] == seq);
  CHECK(ds.sequence_count() == seq);
}

}  // namespace

TEST_CASE("indexed dataset: writer/reader round trip for every dtype") {
  TempDir dir("idx");
  auto manifest = nlohmann::json::parse(read_all(source_path("tests/data/interop/interop_manifest.json")));
  for (int code = 1; code <= 8; ++code) {
    DType dt = static_cast<DType>(code);
    CAPTURE(dtype_name(dt));
    const auto& spec = manifest.at(dtype_name(dt));
    CHECK(spec.at("code").get<int>() == code);
    std::string prefix = dir / dtype_name(dt);
    {
      IndexedDatasetWriter w(prefix, dt);
      write_docs_any(w, spec.at("documents"));
      w.finalize();
    }
    IndexedDataset ds(prefix);
    CHECK(ds.dtype() == dt);
    check_docs(ds, spec.at("documents"));
  }
  // Slices are views into the mapping.
  std::string p = write_small(dir / "small");
  IndexedDataset ds(p);
  CHECK(ds.num_tokens() == 9);
  CHECK(ds.document_count() == 4);
  CHECK(ds.sequence_count() == 4);
  TokenView v = ds.get(2, 1, 2);
  CHECK(v.size == 2);
  CHECK(v[0] == 13);
  CHECK(v[1] == 14);
  CHECK(v.as<uint16_t>() == ds.get(2).as<uint16_t>() + 1);
  CHECK_THROWS_AS(ds.get(2, 2, 2), Error);  // sequence 2 is {12, 13, 14}
  CHECK_THROWS_AS(ds.get(4), Error);
  CHECK_THROWS_AS(v.as<int32_t>(), Error);
  std::vector<int32_t> out;
  ds.get(3).append_to(out);
  CHECK(out == std::vector<int32_t>{50256});
  // u16 writer refuses ids that do not fit.
  IndexedDatasetWriter w(dir / "bad", DType::U16);
  int32_t big = 70000;
  CHECK_THROWS_AS(w.add_tokens(&big, 1), Error);
  CHECK(token_dtype_for_vocab(50257) == DType::U16);
  CHECK(token_dtype_for_vocab(65500) == DType::I32);
}

TEST_CASE("indexed dataset: megatron-core files read token for token, our writer reproduces their bytes") {
  // mcore_* were written by megatron-core 0.16.1 (tests/reference/megatron_interop.py),
  // which also read ours_* and found them identical to what it wrote.
  auto manifest = nlohmann::json::parse(read_all(source_path("tests/data/interop/interop_manifest.json")));
  TempDir dir("interop");
  const char* write_ours = std::getenv("MPITRON_WRITE_INTEROP");
  for (auto it = manifest.begin(); it != manifest.end(); ++it) {
    CAPTURE(it.key());
    std::string mcore = source_path("tests/data/interop/mcore_" + it.key());
    IndexedDataset ds(mcore);
    CHECK(static_cast<int>(ds.dtype()) == it.value().at("code").get<int>());
    check_docs(ds, it.value().at("documents"));

    std::string ours = dir / it.key();
    {
      IndexedDatasetWriter w(ours, ds.dtype());
      write_docs_any(w, it.value().at("documents"));
      w.finalize();
    }
    CHECK(read_all(bin_path(ours)) == read_all(bin_path(mcore)));
    CHECK(read_all(idx_path(ours)) == read_all(idx_path(mcore)));
    std::string committed = source_path("tests/data/interop/ours_" + it.key());
    if (write_ours) {
      write_all(bin_path(committed), read_all(bin_path(ours)));
      write_all(idx_path(committed), read_all(idx_path(ours)));
    }
    CHECK(read_all(bin_path(ours)) == read_all(bin_path(committed)));
    CHECK(read_all(idx_path(ours)) == read_all(idx_path(committed)));
  }
  // Merging (megatron-core add_index of mcore_uint16 twice).
  std::string merged = dir / "merged";
  IndexedDatasetWriter w(merged, DType::U16);
  w.add_index(source_path("tests/data/interop/mcore_uint16"));
  w.add_index(source_path("tests/data/interop/mcore_uint16"));
  w.finalize();
  CHECK(read_all(bin_path(merged)) == read_all(source_path("tests/data/interop/mcore_merged.bin")));
  CHECK(read_all(idx_path(merged)) == read_all(source_path("tests/data/interop/mcore_merged.idx")));
  // Different dtypes cannot be merged.
  IndexedDatasetWriter w2(dir / "merged2", DType::U16);
  expect_error([&] { w2.add_index(source_path("tests/data/interop/mcore_int32")); }, {"mcore_int32", "dtypes differ"});
}

TEST_CASE("indexed dataset: corrupt and truncated files are clear errors naming the file") {
  TempDir dir("corrupt");
  auto fresh = [&](const std::string& name) { return write_small(dir / name); };

  std::string p = fresh("trunc_bin");
  std::string bin = read_all(bin_path(p));
  write_all(bin_path(p), bin.substr(0, bin.size() - 2));
  expect_error([&] { IndexedDataset d(p); }, {bin_path(p), "truncated"});

  p = fresh("magic");
  patch(idx_path(p), 0, "XXIDIDX", 7);
  expect_error([&] { IndexedDataset d(p); }, {idx_path(p), "magic"});

  p = fresh("version");
  uint64_t v2 = 2;
  patch(idx_path(p), 9, &v2, 8);
  expect_error([&] { IndexedDataset d(p); }, {idx_path(p), "version 2"});

  for (uint8_t code : {0, 9, 255}) {
    p = fresh("dtype" + std::to_string(code));
    patch(idx_path(p), 17, &code, 1);
    expect_error([&] { IndexedDataset d(p); }, {idx_path(p), "dtype code " + std::to_string(code)});
  }

  p = fresh("short_header");
  write_all(idx_path(p), read_all(idx_path(p)).substr(0, 20));
  expect_error([&] { IndexedDataset d(p); }, {idx_path(p), "header"});

  p = fresh("trunc_idx");
  std::string idx = read_all(idx_path(p));
  write_all(idx_path(p), idx.substr(0, idx.size() - 8));
  expect_error([&] { IndexedDataset d(p); }, {idx_path(p), "truncated"});

  p = fresh("huge_count");
  uint64_t huge = 1ull << 40;
  patch(idx_path(p), 18, &huge, 8);
  expect_error([&] { IndexedDataset d(p); }, {idx_path(p)});

  p = fresh("doc_order");  // document_indices: 0 1 3 3 4 → 0 4 3 3 4
  int64_t four = 4;
  patch(idx_path(p), 34 + 4 * 4 + 8 * 4 + 8, &four, 8);
  expect_error([&] { IndexedDataset d(p); }, {idx_path(p), "document_indices decreases"});

  p = fresh("doc_last");
  int64_t last = 3;
  patch(idx_path(p), 34 + 4 * 4 + 8 * 4 + 8 * 4, &last, 8);
  expect_error([&] { IndexedDataset d(p); }, {idx_path(p), "sequence_count"});

  p = fresh("pointer");
  int64_t ptr = 1000;
  patch(idx_path(p), 34 + 4 * 4 + 8 * 3, &ptr, 8);
  expect_error([&] { IndexedDataset d(p); }, {idx_path(p), "sequence 3 starts at byte 1000"});

  expect_error([&] { IndexedDataset d(dir / "missing"); }, {dir / "missing.idx"});
}

TEST_CASE("indexed dataset: token id >= vocab size is a clear error") {
  TempDir dir("vocab");
  std::string p = write_small(dir / "v");
  IndexedDataset ds(p);
  validate_token_ids(ds, 50257);
  expect_error([&] { validate_token_ids(ds, 50000); }, {"token id 50256", "sequence 3", bin_path(p), "vocabulary"});
  IndexedDatasetWriter w(dir / "neg", DType::I32);
  std::vector<int32_t> ids{5, -1};
  w.add_document(ids.data(), {2});
  w.finalize();
  expect_error([&] { validate_token_ids(IndexedDataset(dir / "neg"), 50257); }, {"token id -1", "position 1"});
  std::vector<int32_t> batch{1, 2, 50304};
  check_token_ids(batch.data(), 3, 50305, "sample 7 of train");
  expect_error([&] { check_token_ids(batch.data(), 3, 50257, "sample 7 of train"); },
               {"token id 50304", "position 2", "sample 7 of train"});
}
