// tests/core/test_core.cpp — errors, Philox, the caching allocator, device probing.
//
// Philox4x32-10 is checked against the known-answer vectors shipped with the
// Random123 distribution (kat_vectors), the caching allocator's logic against
// a counting RawAllocator, and device probing on a machine with no usable GPU.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdlib>
#include <map>
#include <memory>
#include <random>
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


// Hands out addresses from an imaginary device of `capacity` bytes (never touched,
// so segments of hundreds of MiB cost nothing) and counts every call.
struct FakeRaw final : RawAllocator {
  size_t capacity, in_use = 0;
  uintptr_t next = uintptr_t(1) << 40;
  int allocs = 0, frees = 0, failures = 0;
  std::map<uintptr_t, size_t> live;
  explicit FakeRaw(size_t cap) : capacity(cap) {}
  void* raw_alloc(size_t bytes) override {
    if (in_use + bytes > capacity) {
      ++failures;
      return nullptr;
    }
    const uintptr_t p = next;
    next += bytes + 4096;  // a gap: two segments are never adjacent
    live[p] = bytes;
    in_use += bytes;
    ++allocs;
    return reinterpret_cast<void*>(p);
  }
  void raw_free(void* p) override {
    auto it = live.find(reinterpret_cast<uintptr_t>(p));
    REQUIRE_MESSAGE(it != live.end(), "raw_free of a pointer the raw allocator did not hand out");
    in_use -= it->second;
    live.erase(it);
    ++frees;
  }
};
constexpr size_t kMiB = size_t(1) << 20;
}  // namespace

TEST_CASE("CachingAllocator rounds blocks to 512 B and segments to 2 MiB") {
  CHECK(CachingAllocator::size_class(0) == 512);
  CHECK(CachingAllocator::size_class(1) == 512);
  CHECK(CachingAllocator::size_class(512) == 512);
  CHECK(CachingAllocator::size_class(513) == 1024);
  CHECK(CachingAllocator::size_class(kMiB + 1) == kMiB + 512);
  CHECK(CachingAllocator::segment_size(512) == 2 * kMiB);          // small pool: shared 2 MiB segments
  CHECK(CachingAllocator::segment_size(kMiB - 512) == 2 * kMiB);
  CHECK(CachingAllocator::segment_size(kMiB) == 2 * kMiB);         // large pool: rounded up to 2 MiB
  CHECK(CachingAllocator::segment_size(3 * kMiB) == 4 * kMiB);
  CHECK(CachingAllocator::segment_size(98 * kMiB + 512) == 100 * kMiB);
}

TEST_CASE("CachingAllocator carves small blocks from shared segments, per stream, and merges them back") {
  auto raw_owner = std::make_unique<FakeRaw>(size_t(1) << 30);
  FakeRaw* raw = raw_owner.get();
  CachingAllocator a(std::move(raw_owner));
  const Stream s1(reinterpret_cast<void*>(0x1)), s2(reinterpret_cast<void*>(0x2));

  char* p = static_cast<char*>(a.allocate(1000, s1));  // block 1024 of a 2 MiB segment
  CHECK(raw->allocs == 1);
  CHECK(a.stats().current_bytes == 1024);
  CHECK(a.stats().reserved_bytes == 2 * kMiB);
  char* q = static_cast<char*>(a.allocate(700, s1));  // the rest of the same segment
  CHECK(q == p + 1024);
  CHECK(raw->allocs == 1);
  CHECK(a.stats().cache_hits == 1);
  CHECK(a.stats().current_bytes == 1024 + 1024);
  CHECK(reinterpret_cast<uintptr_t>(q) % 512 == 0);
  a.release(p);
  a.release(q);  // both neighbours free again: one whole free segment
  CHECK(a.stats().current_bytes == 0);
  CHECK(a.stats().cached_bytes == 2 * kMiB);
  void* r = a.allocate(1000, s2);  // other stream: never reuses s1's memory
  CHECK(raw->allocs == 2);
  void* big = a.allocate(kMiB - 512, s1);  // the merged s1 segment serves the largest small request
  CHECK(big == p);
  CHECK(raw->allocs == 2);
  CHECK(a.stats().peak_bytes == 1024 + kMiB - 512);
  a.release(r);
  a.release(big);
  CHECK(a.stats().peak_bytes == 1024 + kMiB - 512);  // peak survives releases
  CHECK(a.stats().peak_reserved_bytes == 4 * kMiB);
  a.reset_peak();
  CHECK(a.stats().peak_bytes == 0);
  a.empty_cache();
  CHECK(raw->frees == 2);
  CHECK(raw->in_use == 0);
  const AllocatorStats st = a.stats();
  CHECK(st.cached_bytes == 0);
  CHECK(st.reserved_bytes == 0);
  CHECK(st.current_bytes == 0);
  CHECK(st.raw_frees == 2);
  CHECK_THROWS_AS(a.release(reinterpret_cast<void*>(0x1234)), Error);
}

TEST_CASE("CachingAllocator: a freed 100 MiB block serves 98 MiB (best fit, split) and the rest serves 2 MiB") {
  auto raw_owner = std::make_unique<FakeRaw>(size_t(1) << 30);
  FakeRaw* raw = raw_owner.get();
  CachingAllocator a(std::move(raw_owner));
  char* p = static_cast<char*>(a.allocate(100 * kMiB));
  void* small_one = a.allocate(64 * kMiB);
  a.release(p);
  char* q = static_cast<char*>(a.allocate(98 * kMiB));  // 100 MiB free block, not a new segment
  CHECK(q == p);
  CHECK(raw->allocs == 2);
  CHECK(a.stats().splits == 1);
  void* t = a.allocate(2 * kMiB);  // the split-off rest
  CHECK(t == p + 98 * kMiB);
  CHECK(raw->allocs == 2);
  a.release(small_one);
  void* u = a.allocate(10 * kMiB);  // best fit: the 64 MiB block, not a new segment
  CHECK(raw->allocs == 2);
  CHECK(u == small_one);
  CHECK(a.stats().current_bytes == 98 * kMiB + 2 * kMiB + 10 * kMiB);
  CHECK(a.stats().reserved_bytes == 164 * kMiB);
  a.release(q);
  a.release(t);
  a.release(u);
  CHECK(a.stats().cached_bytes == 164 * kMiB);
}

TEST_CASE("CachingAllocator: a fragmenting pattern keeps reserved within 1.5x peak live, no flushes") {
  // Activations of a varying-length workload: random sizes 1..64 MiB at 512-byte
  // granularity, up to 12 live, freed in random order. The old exact-size-class
  // cache kept one block per distinct size: reserved grew with each new size until
  // the device ran out and the whole cache was flushed (here: > 100 raw frees).
  auto raw_owner = std::make_unique<FakeRaw>(size_t(2) << 30);  // a 2 GiB device
  FakeRaw* raw = raw_owner.get();
  CachingAllocator a(std::move(raw_owner));
  std::mt19937_64 g(7);
  std::vector<void*> live;
  size_t requests = 0;
  for (int it = 0; it < 3000; ++it) {
    if (live.size() < 12 && (live.empty() || g() % 2)) {
      const size_t bytes = (1 + g() % 128) * kMiB / 2 + (g() % 1024) * 512;
      live.push_back(a.allocate(bytes));
      ++requests;
    } else {
      const size_t i = g() % live.size();
      a.release(live[i]);
      live.erase(live.begin() + static_cast<long>(i));
    }
  }
  const AllocatorStats st = a.stats();
  MESSAGE("requests ", requests, ", raw allocs ", st.raw_allocs, ", raw frees ", st.raw_frees, ", peak live ",
          st.peak_bytes / kMiB, " MiB, peak reserved ", st.peak_reserved_bytes / kMiB, " MiB");
  CHECK(st.raw_frees == 0);
  CHECK(raw->failures == 0);
  CHECK(static_cast<double>(st.peak_reserved_bytes) <= 1.5 * static_cast<double>(st.peak_bytes));
  CHECK(st.raw_allocs * 20 < requests);
  CHECK(st.reserved_bytes == raw->in_use);
  for (void* p : live) a.release(p);
  CHECK(a.stats().current_bytes == 0);
  a.empty_cache();
  CHECK(raw->in_use == 0);  // every block merged back into whole segments
}

TEST_CASE("CachingAllocator on out-of-memory gives back only the free segments it needs, retries, then throws") {
  auto raw_owner = std::make_unique<CountingRaw>(10 * kMiB);  // a 10 MiB device
  CountingRaw* raw = raw_owner.get();
  CachingAllocator a(std::move(raw_owner));
  const Stream s1(reinterpret_cast<void*>(0x1)), s2(reinterpret_cast<void*>(0x2));
  a.release(a.allocate(1000, s1));     // a free 2 MiB small-pool segment
  a.release(a.allocate(8 * kMiB, s2));  // a free 8 MiB segment of another stream
  CHECK(raw->in_use == 10 * kMiB);
  void* p = a.allocate(4 * kMiB, s1);  // no free block fits on s1: give back the 8 MiB segment only
  CHECK(p != nullptr);
  CHECK(raw->failures == 1);
  CHECK(raw->frees == 1);
  CHECK(a.stats().reserved_bytes == 6 * kMiB);
  CHECK(a.stats().current_bytes == 4 * kMiB);
  void* q = a.allocate(1000, s1);  // the kept small segment still serves small requests
  CHECK(raw->allocs == 3);
  try {
    a.allocate(16 * kMiB, s1);
    FAIL("allocation beyond capacity did not throw");
  } catch (const Error& e) {
    CHECK(std::string(e.what()).find("out of device memory") != std::string::npos);
    CHECK_FALSE(e.hint().empty());
  }
  CHECK(a.stats().current_bytes == 4 * kMiB + 1024);  // a failed request leaves the books unchanged
  a.release(p);
  a.release(q);
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
