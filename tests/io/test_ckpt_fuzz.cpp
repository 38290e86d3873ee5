// tests/io/test_ckpt_fuzz.cpp — reliability: a damaged checkpoint file never
// crashes the reader. Hundreds of seeded byte flips anywhere in the HDF5 file
// (superblock, object headers, heaps, attributes, data) and in its manifest,
// and truncations: every load must either give the exact saved values or a
// clear mpitron::Error, and with an intact older checkpoint beside it, must
// fall back to that one with its exact values. Without the manifest check
// several of these flips make libhdf5 segfault in H5Fopen / H5Lvisit.
// mpitron-test: label=reliability
#include <doctest/doctest.h>

#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>

#include "io/checkpoint.h"
#include "io/checkpoint_manifest.h"
#include "io/crc32c.h"
#include "tests/io/io_test_util.h"

using namespace mpitron;
using namespace mpitron::io;
using mpitron::test::ScratchDir;
namespace fs = std::filesystem;

namespace {

// A small "model": a few datasets of different types, groups and attributes
// (the flags JSON and model config as the trainer writes them).
struct Model {
  std::vector<float> w, b;
  std::vector<double> sched;
  explicit Model(float seed) : w(24 * 16), b(16), sched(3) {
    for (size_t i = 0; i < w.size(); ++i) w[i] = seed + 0.001f * static_cast<float>(i);
    for (size_t i = 0; i < b.size(); ++i) b[i] = -seed * static_cast<float>(i);
    for (size_t i = 0; i < sched.size(); ++i) sched[i] = seed * 10.0 + static_cast<double>(i);
  }
};

void save(const std::string& dir, int64_t it, float seed) {
  Model m(seed);
  CheckpointWriter w;
  w.begin(dir, it);
  w.add_raw("model/layers.0.w", {24, 16}, ElemType::F32, m.w.data(), {0, 0}, {24, 16});
  w.add_raw("model/layers.0.b", {16}, ElemType::F32, m.b.data(), {0}, {16});
  w.add_raw("optim/sched", {3}, ElemType::F64, m.sched.data(), {0}, {3});
  w.set_attr_json("flags", {{"num_layers", 1}, {"hidden_size", 16}, {"lr", 3e-4}});
  w.set_attr_json("model_config", {{"num_layers", 1}, {"hidden_size", 16}});
  w.set_attr_int("consumed_train_samples", 64 * it);
  w.commit();
}

// Loads the newest intact checkpoint with the one-pass verified reader;
// returns its iteration and checks that the values are exactly the saved ones.
int64_t load_and_check(const std::string& dir, float seed_of_1, float seed_of_2) {
  Model got(0);
  CheckpointReader r = CheckpointReader::load_latest(dir, MPI_COMM_NULL, [&](const CheckpointReader& c) {
    c.read_verified({{"model/layers.0.w", {{{0, 0}, {24, 16}}}, got.w.data(), ElemType::F32, {24, 16}},
                     {"model/layers.0.b", {{{0}, {16}}}, got.b.data(), ElemType::F32, {16}},
                     {"optim/sched", {{{0}, {3}}}, got.sched.data(), ElemType::F64, {3}}});
  });
  REQUIRE(r.found());
  const Model want(r.iteration() == 1 ? seed_of_1 : seed_of_2);
  CHECK(got.w == want.w);
  CHECK(got.b == want.b);
  CHECK(got.sched == want.sched);
  CHECK(r.attr_int("consumed_train_samples") == 64 * r.iteration());
  return r.iteration();
}

std::vector<char> slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::vector<char>((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}
void spit(const std::string& path, const std::vector<char>& bytes, size_t n) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(n));
}

}  // namespace

TEST_CASE("checkpoint fuzz: byte flips and truncations anywhere give a clear error or a fallback, never a crash") {
  ScratchDir dir("ckpt_fuzz");
  save(dir.path(), 1, 1.0f);
  save(dir.path(), 2, 2.0f);
  const std::string h5 = (fs::path(dir.path()) / iteration_dir_name(2) / kCheckpointFileName).string();
  const std::string man = (fs::path(dir.path()) / iteration_dir_name(2) / kManifestFileName).string();
  const std::vector<char> good = slurp(h5), good_man = slurp(man);
  REQUIRE(good.size() > 2048);
  REQUIRE(!good_man.empty());
  CHECK(load_and_check(dir.path(), 1.0f, 2.0f) == 2);

  std::mt19937_64 rng(20261125);
  int fell_back = 0, cases = 0;
  auto restore = [&] {
    spit(h5, good, good.size());
    spit(man, good_man, good_man.size());
  };
  // 1. Single flipped bytes anywhere in the HDF5 file; 2. several at once;
  // 3. flips in the first 4 KiB (superblock, root group header, heaps).
  for (int k = 0; k < 360; ++k) {
    std::vector<char> bad = good;
    const int flips = k < 240 ? 1 : k < 300 ? 1 + static_cast<int>(rng() % 8) : 1;
    for (int f = 0; f < flips; ++f) {
      const size_t span = k >= 300 ? std::min<size_t>(4096, bad.size()) : bad.size();
      const size_t at = static_cast<size_t>(rng() % span);
      bad[at] = static_cast<char>(bad[at] ^ static_cast<char>(1 + rng() % 255));
    }
    spit(h5, bad, bad.size());
    CAPTURE(k);
    const int64_t it = load_and_check(dir.path(), 1.0f, 2.0f);
    CHECK(it == 1);  // every byte of the file is covered by a checksum: always detected
    fell_back += it == 1;
    ++cases;
  }
  // 4. Truncations at random lengths (and to zero bytes).
  for (int k = 0; k < 60; ++k) {
    const size_t n = k == 0 ? 0 : static_cast<size_t>(rng() % good.size());
    spit(h5, good, n);
    CAPTURE(n);
    CHECK(load_and_check(dir.path(), 1.0f, 2.0f) == 1);
    ++cases;
  }
  restore();
  // 5. Flips and truncations of the manifest itself.
  for (int k = 0; k < 60; ++k) {
    std::vector<char> bad = good_man;
    size_t n = bad.size();
    if (k % 3 == 2) n = static_cast<size_t>(rng() % bad.size());
    else {
      const size_t at = static_cast<size_t>(rng() % bad.size());
      bad[at] = static_cast<char>(bad[at] ^ static_cast<char>(1 + rng() % 255));
    }
    spit(man, bad, n);
    CAPTURE(k);
    CHECK(load_and_check(dir.path(), 1.0f, 2.0f) == 1);
    ++cases;
  }
  restore();
  CHECK(load_and_check(dir.path(), 1.0f, 2.0f) == 2);
  MESSAGE(cases, " damaged files, ", fell_back, " single/multi flips of the HDF5 file fell back; no crash");

  // 6. The two-pass path (open_latest with verification, what inference uses)
  // and no fallback at all: a clear mpitron::Error, never a crash.
  fs::remove_all(fs::path(dir.path()) / iteration_dir_name(1));
  for (int k = 0; k < 80; ++k) {
    std::vector<char> bad = good;
    const size_t at = static_cast<size_t>(rng() % bad.size());
    bad[at] = static_cast<char>(bad[at] ^ static_cast<char>(1 + rng() % 255));
    spit(h5, bad, bad.size());
    CAPTURE(at);
    bool threw = false;
    try {
      CheckpointReader r = CheckpointReader::open_latest(dir.path(), MPI_COMM_NULL, /*verify=*/true);
    } catch (const Error& e) {
      threw = true;
      CHECK(std::string(e.what()).find("no intact checkpoint") != std::string::npos);
    }
    CHECK(threw);
  }
}

TEST_CASE("checkpoint fuzz: the manifest names the damage; a checkpoint without one still loads (older mpitron)") {
  ScratchDir dir("ckpt_manifest");
  save(dir.path(), 5, 5.0f);
  const std::string h5 = (fs::path(dir.path()) / iteration_dir_name(5) / kCheckpointFileName).string();
  const std::vector<char> good = slurp(h5);
  CHECK(verify_checkpoint_manifest(h5));
  std::vector<char> bad = good;
  bad[40] = static_cast<char>(bad[40] ^ 0x01);  // inside the superblock
  spit(h5, bad, bad.size());
  try {
    verify_checkpoint_manifest(h5);
    FAIL("a flipped superblock byte passed");
  } catch (const CheckpointDamaged& e) {
    CHECK(std::string(e.what()).find("checksum mismatch in the HDF5 metadata") != std::string::npos);
  }
  spit(h5, good, good.size() - 100);
  try {
    verify_checkpoint_manifest(h5);
    FAIL("a truncated file passed");
  } catch (const CheckpointDamaged& e) {
    CHECK(std::string(e.what()).find("truncated") != std::string::npos);
  }
  spit(h5, good, good.size());
  fs::remove(fs::path(dir.path()) / iteration_dir_name(5) / kManifestFileName);
  CHECK_FALSE(verify_checkpoint_manifest(h5));
  CHECK(load_and_check(dir.path(), 0.0f, 5.0f) == 5);
}
