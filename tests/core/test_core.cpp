// tests/core/test_core.cpp — errors, Philox, the caching allocator, device probing.
//
// Philox4x32-10 is checked against the known-answer vectors shipped with the
// Random123 distribution (kat_vectors), the caching allocator's logic against
// a counting RawAllocator, and device probing on a machine with no usable GPU.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdlib>
#include <set>
#include <string>
#include <vector>

#include "core/allocator.h"
#include "core/device.h"
#include "core/error.h"
#include "core/philox.h"
#include "tensor/tensor.h"

using namespace mpitron;

// ---- errors -------------------------------------------------------------------
TEST_CASE("Error carries the message, file:line, rank and hint in what()") {
  const int saved = process_rank();
  set_process_rank(3);
  int line = 0;
  try {
    line = __LINE__ + 1;
    MPT_THROW("widget count 7 exceeds 5", "lower --widgets");
  } catch (const Error& e) {
    const std::string w = e.what();
    CHECK(e.message() == "widget count 7 exceeds 5");
    CHECK(e.hint() == "lower --widgets");
    CHECK(e.rank() == 3);
    CHECK(e.line() == line);
    CHECK(std::string(e.file()).find("test_core.cpp") != std::string::npos);
    CHECK(w.find("widget count 7 exceeds 5") != std::string::npos);
    CHECK(w.find(str("test_core.cpp:", line)) != std::string::npos);
    CHECK(w.find("rank 3") != std::string::npos);
    CHECK(w.find("lower --widgets") != std::string::npos);
  }
  set_process_rank(-1);
  try {
    MPT_CHECK(1 + 1 == 3, "arithmetic broke");
    FAIL("MPT_CHECK did not throw");
  } catch (const Error& e) {
    CHECK(e.rank() == -1);
    CHECK(std::string(e.what()).find("rank") == std::string::npos);  // no rank prefix before MPI says one
    CHECK(e.hint().empty());
    CHECK(e.message() == "arithmetic broke");
  }
  try {
    MPT_CHECK(2 < 1, "");
    FAIL("MPT_CHECK did not throw");
  } catch (const Error& e) {
    CHECK(std::string(e.what()).find("2 < 1") != std::string::npos);  // empty message: the condition text
  }
  CHECK_THROWS_AS(MPT_CHECK(false, "x"), std::runtime_error);  // catchable as a standard exception
  CHECK_NOTHROW(MPT_CHECK(true, "never"));
  set_process_rank(saved);
}

// ---- Philox ---------------------------------------------------------------------
namespace {
struct Kat {
  uint32_t ctr[4], key[2], out[4];
};
}  // namespace

TEST_CASE("Philox4x32-10 matches the Random123 known-answer vectors") {
  // Random123-1.14.0/tests/kat_vectors, lines "philox4x32 10 ...".
  const Kat kats[] = {
      {{0, 0, 0, 0}, {0, 0}, {0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8}},
      {{0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff}, {0xffffffff, 0xffffffff},
       {0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd}},
      {{0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344}, {0xa4093822, 0x299f31d0},
       {0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1}},
  };
  for (const Kat& k : kats) {
    const uint64_t lo = k.ctr[0] | (uint64_t(k.ctr[1]) << 32), hi = k.ctr[2] | (uint64_t(k.ctr[3]) << 32);
    const uint64_t key = k.key[0] | (uint64_t(k.key[1]) << 32);
    const Philox4 r = philox4x32_10(lo, hi, key);
    for (int i = 0; i < 4; ++i)
      CHECK_MESSAGE(r.x[i] == k.out[i], "ctr " << std::hex << k.ctr[0] << " lane " << i << ": got " << r.x[i]
                                               << " want " << k.out[i]);
  }
}

TEST_CASE("philox_u32 / philox_uniform stream layout and distribution") {
  // Element i is lane i % 4 of block offset + i / 4.
  for (uint64_t i = 0; i < 64; ++i) {
    const Philox4 r = philox4x32_10(1000 + i / 4, 0, 42);
    CHECK(philox_u32(42, 1000, i) == r.x[i % 4]);
    CHECK(philox_uniform(42, 1000, i) == static_cast<float>(r.x[i % 4] >> 8) / 16777216.0f);
  }
  // Uniform: in [0, 1), multiples of 2^-24; mean within 6 sigma; 16-bin chi-square.
  const int64_t n = 1 << 20;
  double sum = 0;
  std::vector<int64_t> bins(16, 0);
  int64_t out_of_range = 0;
  for (int64_t i = 0; i < n; ++i) {
    const float u = philox_uniform(7, 3, static_cast<uint64_t>(i));
    const bool ok = u >= 0.0f && u < 1.0f && std::ldexp(double(u), 24) == std::floor(std::ldexp(double(u), 24));
    out_of_range += !ok;
    if (!ok) continue;
    sum += u;
    bins[static_cast<size_t>(u * 16)]++;
  }
  CHECK(out_of_range == 0);
  const double mean = sum / n, sd = 1.0 / std::sqrt(12.0 * n);
  CHECK_MESSAGE(std::fabs(mean - 0.5) <= 6 * sd, "mean " << mean);
  double chi2 = 0;
  for (int64_t b : bins) chi2 += (b - n / 16.0) * (b - n / 16.0) / (n / 16.0);
  CHECK_MESSAGE(chi2 < 60.0, "chi-square (15 dof) " << chi2 << "; P(chi2 > 60) < 1e-6 for a uniform source");
  // Different seeds and offsets give different streams.
  CHECK(philox_u32(1, 0, 0) != philox_u32(2, 0, 0));
  CHECK(philox_u32(1, 0, 0) != philox_u32(1, 1, 0));
  // Normal: mean 0, variance 1 within 6 sigma (var of the sample variance ≈ 2/n).
  double s1 = 0, s2 = 0;
  for (int64_t i = 0; i < n; ++i) {
    const double z = philox_normal(11, 0, static_cast<uint64_t>(i));
    s1 += z;
    s2 += z * z;
  }
  REQUIRE(std::isfinite(s2));
  CHECK(std::fabs(s1 / n) <= 6 / std::sqrt(double(n)));
  CHECK(std::fabs(s2 / n - 1) <= 6 * std::sqrt(2.0 / n));
}

// ---- caching allocator ----------------------------------------------------------
namespace {
// Hands out malloc'd blocks up to a capacity and counts every call.
struct CountingRaw final : RawAllocator {
  size_t capacity, in_use = 0;
  int allocs = 0, frees = 0, failures = 0;
  std::vector<std::pair<void*, size_t>> live;
  explicit CountingRaw(size_t cap) : capacity(cap) {}
  void* raw_alloc(size_t bytes) override {
    if (in_use + bytes > capacity) {
      ++failures;
      return nullptr;
    }
    void* p = std::malloc(bytes);
    in_use += bytes;
    ++allocs;
    live.emplace_back(p, bytes);
    return p;
  }
  void raw_free(void* p) override {
    for (size_t i = 0; i < live.size(); ++i)
      if (live[i].first == p) {
        in_use -= live[i].second;
        live.erase(live.begin() + static_cast<long>(i));
        std::free(p);
        ++frees;
        return;
      }
    FAIL("raw_free of a pointer the raw allocator did not hand out");
  }
  ~CountingRaw() override {
    for (auto& [p, b] : live) std::free(p);
  }
};
}  // namespace

TEST_CASE("CachingAllocator::size_class rounds to 512 B below 1 MiB and 2 MiB above") {
  CHECK(CachingAllocator::size_class(0) == 512);
  CHECK(CachingAllocator::size_class(1) == 512);
  CHECK(CachingAllocator::size_class(512) == 512);
  CHECK(CachingAllocator::size_class(513) == 1024);
  CHECK(CachingAllocator::size_class((1 << 20) - 1) == (1 << 20));
  CHECK(CachingAllocator::size_class(1 << 20) == (2 << 20));
  CHECK(CachingAllocator::size_class((2 << 20) + 1) == (4 << 20));
  CHECK(CachingAllocator::size_class(3 << 20) == (4 << 20));
}

TEST_CASE("CachingAllocator reuses blocks by size class and stream, tracks bytes") {
  auto raw_owner = std::make_unique<CountingRaw>(size_t(1) << 30);
  CountingRaw* raw = raw_owner.get();
  CachingAllocator a(std::move(raw_owner));
  const Stream s1(reinterpret_cast<void*>(0x1)), s2(reinterpret_cast<void*>(0x2));

  void* p = a.allocate(1000, s1);  // class 1024
  CHECK(raw->allocs == 1);
  CHECK(a.stats().current_bytes == 1024);
  a.release(p);
  CHECK(a.stats().current_bytes == 0);
  CHECK(a.stats().cached_bytes == 1024);
  void* q = a.allocate(700, s1);  // same class, same stream: reused
  CHECK(q == p);
  CHECK(raw->allocs == 1);
  CHECK(a.stats().cache_hits == 1);
  a.release(q);
  void* r = a.allocate(1000, s2);  // other stream: never reuses s1's block
  CHECK(r != p);
  CHECK(raw->allocs == 2);
  void* t = a.allocate(2000, s1);  // other class: new block
  CHECK(raw->allocs == 3);
  CHECK(a.stats().current_bytes == 1024 + 2048);
  CHECK(a.stats().peak_bytes == 1024 + 2048);
  CHECK(a.stats().reserved_bytes == 1024 + 1024 + 2048);
  a.release(r);
  a.release(t);
  CHECK(a.stats().peak_bytes == 1024 + 2048);  // peak survives releases
  a.reset_peak();
  CHECK(a.stats().peak_bytes == 0);
  CHECK(a.stats().raw_allocs == 3);
  a.empty_cache();
  CHECK(raw->frees == 3);
  CHECK(raw->in_use == 0);
  const AllocatorStats st = a.stats();
  CHECK(st.cached_bytes == 0);
  CHECK(st.reserved_bytes == 0);
  CHECK(st.current_bytes == 0);
  CHECK_THROWS_AS(a.release(reinterpret_cast<void*>(0x1234)), Error);
}

TEST_CASE("CachingAllocator frees the cache and retries once on out-of-memory, then throws") {
  auto raw_owner = std::make_unique<CountingRaw>(size_t(8) << 20);  // 8 MiB device
  CountingRaw* raw = raw_owner.get();
  CachingAllocator a(std::move(raw_owner));
  void* big = a.allocate(6 << 20);  // class 6 MiB
  a.release(big);                    // cached, still held from the raw allocator
  CHECK(raw->in_use == (6u << 20));
  void* other = a.allocate(4 << 20);  // does not fit next to the cached block: flush and retry
  CHECK(other != nullptr);
  CHECK(raw->failures == 1);
  CHECK(raw->frees == 1);
  CHECK(a.stats().cached_bytes == 0);
  CHECK(a.stats().reserved_bytes == (4u << 20));
  CHECK(a.stats().current_bytes == (4u << 20));
  try {
    a.allocate(16 << 20);
    FAIL("allocation beyond capacity did not throw");
  } catch (const Error& e) {
    CHECK(std::string(e.what()).find("out of device memory") != std::string::npos);
    CHECK_FALSE(e.hint().empty());
  }
  CHECK(a.stats().current_bytes == (4u << 20));  // a failed request leaves the books unchanged
  a.release(other);
}

// ---- devices ----------------------------------------------------------------------
TEST_CASE("device probing without a usable GPU reports why and does not crash") {
  CHECK(Device::cpu().name() == "cpu");
  CHECK(Device::cuda(1).name() == "cuda:1");
  CHECK(Device::cuda(0) != Device::cpu());
  CHECK(Device::cuda(1) != Device::cuda(0));
  Stream().synchronize();
  device_synchronize();
  Event e0, e1;
  e0.record();
  e1.record();
  e1.synchronize();
  CHECK(e1.done());
  CHECK(Event::elapsed_ms(e0, e1) >= 0.0f);
  if (cuda_available()) {
    MESSAGE("a CUDA device is present: ", cuda_device_count(), " device(s); the no-GPU checks below are skipped");
    CHECK(cuda_device_count() > 0);
    return;
  }
  CHECK_FALSE(cuda_unavailable_reason().empty());
  CHECK(cuda_device_count() == 0);
  CHECK(cuda_current_device() == -1);
  CHECK_THROWS_AS(cuda_set_device(0), Error);
  // Asking for device memory fails with an Error that says why, never a crash.
  try {
    Tensor::empty({4}, DType::F32, Device::cuda(0));
    FAIL("CUDA tensor created without CUDA");
  } catch (const Error& e) {
    CHECK(e.hint() == cuda_unavailable_reason());
  }
}
