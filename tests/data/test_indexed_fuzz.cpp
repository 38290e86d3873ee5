// Fuzzing the Megatron .idx reader and the .bin bounds (issue #18): a damaged
// index or a short .bin is a clear mpitron::Error naming the file, or it opens
// and every sequence read stays inside the mapped .bin. Never a crash or a hang.
#include <doctest/doctest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "core/error.h"
#include "data/indexed_dataset.h"
#include "tests/model/model_test_util.h"

using namespace mpitron;
using namespace mpitron::data;
namespace fs = std::filesystem;

namespace {

std::string read_all(const std::string& p) {
  std::ifstream f(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
}
void write_all(const std::string& p, const std::string& bytes) {
  std::ofstream f(p, std::ios::binary | std::ios::trunc);
  f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

// Opens prefix and reads every sequence whole and in pieces. Returns "ok", or
// the error's message (which must name the file).
std::string open_and_read(const std::string& prefix) {
  try {
    IndexedDataset ds(prefix);
    const uint8_t* lo = ds.bin_file().data();
    const uint8_t* hi = lo + ds.bin_file().size();
    int64_t sum = 0;
    for (int64_t i = 0; i < ds.sequence_count(); ++i) {
      const TokenView v = ds.get(i);
      const size_t bytes = static_cast<size_t>(v.size) * dtype_size(v.dtype);
      if (v.size > 0) {
        const auto* p = static_cast<const uint8_t*>(v.data);
        REQUIRE(p >= lo);
        REQUIRE(p + bytes <= hi);
        sum += v[0] + v[v.size - 1];
      }
      // Reads past a sequence's end are refused, not served from the next one.
      CHECK_THROWS_AS(ds.get(i, 0, v.size + 1), Error);
      CHECK_THROWS_AS(ds.get(i, v.size + 1, 0), Error);
    }
    for (int64_t d = 0; d <= ds.document_count(); ++d) {
      const int64_t s = ds.document_indices()[d];
      REQUIRE(s >= 0);
      REQUIRE(s <= ds.sequence_count());
    }
    (void)sum;
    return "ok";
  } catch (const Error& e) {
    const std::string m = e.what();
    CHECK_MESSAGE(m.find(prefix) != std::string::npos, "the error does not name the file: ", m);
    return m;
  }
}

}  // namespace

TEST_CASE("fuzz: damaged .idx files are refused or read within bounds (2000 mutations)") {
  const fs::path dir = testing::fresh_temp_dir("idx_fuzz");
  const std::string good = testing::write_toy_dataset(dir, 3, 40);
  const std::string idx = read_all(idx_path(good)), bin = read_all(bin_path(good));
  REQUIRE(open_and_read(good) == "ok");
  const std::string prefix = (dir / "fuzz").string();
  write_all(bin_path(prefix), bin);
  std::mt19937_64 rng(20260118);
  int refused = 0, opened = 0;
  for (int round = 0; round < 2000; ++round) {
    std::string m = idx;
    switch (round % 5) {
      case 0:  // flip bits
        for (int k = 0, n = 1 + static_cast<int>(rng() % 4); k < n; ++k)
          m[rng() % m.size()] ^= static_cast<char>(1u << (rng() % 8));
        break;
      case 1:  // a random byte in the header or the counts
        m[rng() % std::min<size_t>(m.size(), 34)] = static_cast<char>(rng());
        break;
      case 2:  // truncate
        m.resize(rng() % m.size());
        break;
      case 3: {  // an extreme 64-bit value at an 8-aligned offset (counts, pointers, indices)
        const uint64_t vals[] = {0, 1, ~0ull, 1ull << 62, 1ull << 31, static_cast<uint64_t>(-8), 0x7fffffffffffffffull};
        const size_t off = (rng() % (m.size() / 8)) * 8 + (rng() % 2 ? 1 : 0);  // header fields start at 9, 17, 18, 26
        uint64_t v = vals[rng() % 7];
        if (off + 8 <= m.size()) std::memcpy(&m[off], &v, 8);
        break;
      }
      default:  // append garbage
        for (int k = 0, n = 1 + static_cast<int>(rng() % 64); k < n; ++k) m.push_back(static_cast<char>(rng()));
        break;
    }
    write_all(idx_path(prefix), m);
    (open_and_read(prefix) == "ok" ? opened : refused) += 1;
  }
  MESSAGE("mutated .idx: ", refused, " refused, ", opened, " opened and read within bounds");
  CHECK(refused > 1000);
  fs::remove_all(dir);
}

TEST_CASE("fuzz: a .bin shorter than its .idx says is refused; no .bin is read out of bounds") {
  const fs::path dir = testing::fresh_temp_dir("bin_fuzz");
  const std::string good = testing::write_toy_dataset(dir, 5, 30);
  const std::string idx = read_all(idx_path(good)), bin = read_all(bin_path(good));
  const std::string prefix = (dir / "fuzz").string();
  write_all(idx_path(prefix), idx);
  std::mt19937_64 rng(7);
  for (int round = 0; round < 200; ++round) {
    std::string b = bin;
    if (round == 0) b.clear();
    else if (round % 2) b.resize(rng() % bin.size());
    else b.append(rng() % 100, 'x');
    write_all(bin_path(prefix), b);
    const std::string r = open_and_read(prefix);
    if (b.size() < bin.size()) CHECK_MESSAGE(r != "ok", "a .bin of ", b.size(), " < ", bin.size(), " bytes opened");
  }
  // A missing .bin or .idx: an error naming it.
  fs::remove(bin_path(prefix));
  CHECK(open_and_read(prefix).find(".bin") != std::string::npos);
  fs::remove_all(dir);
}
