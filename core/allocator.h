// core/allocator.h — caching device allocator: best fit with block splitting.
//
// The raw allocator (cudaMalloc) hands out SEGMENTS; the cache carves them into
// BLOCKS. Requests are rounded up to 512 bytes (every block is 512-byte
// aligned). Two pools keep small tensors from fragmenting big segments:
//   small pool  requests < 1 MiB, carved from 2 MiB segments;
//   large pool  requests >= 1 MiB, segments of the request rounded up to 2 MiB.
// A request takes the smallest free block of its pool and stream that fits
// (best fit) and splits off the rest as a new free block when the rest is worth
// keeping (>= 512 B in the small pool, > 1 MiB in the large one). A freed block
// merges with free neighbours of its segment, so a freed 100 MiB block serves a
// 98 MiB request and a later 2 MiB one, and reserved memory stops growing with
// every distinct size. Only when the raw allocator is out of memory are wholly
// free segments given back: first the fewest (largest first) that cover the
// request, then all of them; each raw free may synchronise the device.
//
// Streams: a block freed on stream S is only reused for work on stream S (work
// queued on S before the free finishes before any later work on S, so no event
// is needed); segments, and so their blocks, belong to one stream.
//
// Books: live bytes (blocks handed out, rounded sizes) and its peak, reserved
// bytes (segments held from the raw allocator) and its peak, cached = reserved −
// live. The trainer's log line and bench_train print live peak and reserved.
//
// The bookkeeping is independent of the raw allocator (a RawAllocator), so it is
// tested on the CPU with a fake one (tests/core/test_core.cpp).
#pragma once
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <unordered_map>

#include "core/device.h"

namespace mpitron {

class RawAllocator {
 public:
  virtual ~RawAllocator() = default;
  virtual void* raw_alloc(size_t bytes) = 0;  // returns nullptr when out of memory
  virtual void raw_free(void* p) = 0;
};

struct AllocatorStats {
  size_t current_bytes = 0;        // live: bytes in blocks handed out (rounded sizes)
  size_t peak_bytes = 0;           // max current_bytes since the last reset_peak()
  size_t cached_bytes = 0;         // reserved − current: free blocks kept for reuse
  size_t reserved_bytes = 0;       // bytes in segments held from the raw allocator
  size_t peak_reserved_bytes = 0;  // max reserved_bytes since the last reset_peak()
  uint64_t raw_allocs = 0;         // calls that reached the raw allocator (successful)
  uint64_t raw_frees = 0;          // segments given back
  uint64_t cache_hits = 0;         // requests served from cached blocks
  uint64_t splits = 0;             // blocks split to serve a smaller request
};

class CachingAllocator {
 public:
  explicit CachingAllocator(std::unique_ptr<RawAllocator> raw);
  ~CachingAllocator();
  CachingAllocator(const CachingAllocator&) = delete;
  CachingAllocator& operator=(const CachingAllocator&) = delete;

  // A block of at least `bytes` (512-byte aligned) for use on `stream`. When the
  // raw allocator is out of memory, free segments are given back and the request
  // retried before throwing.
  void* allocate(size_t bytes, Stream stream = Stream());
  // Return a block from allocate(); it merges with its free neighbours and stays cached.
  void release(void* p);
  // Give every wholly free segment back to the raw allocator.
  void empty_cache();

  AllocatorStats stats() const;
  void reset_peak();

  static constexpr size_t kRound = 512;                  // block granule
  static constexpr size_t kSmallLimit = size_t(1) << 20;  // requests below go to the small pool
  static constexpr size_t kSegment = size_t(2) << 20;     // segment granule (and the small pool's segment)
  // The block size a request of `bytes` gets (before any leftover a split does not take off).
  static size_t size_class(size_t bytes);
  // The segment the raw allocator is asked for when no cached block fits.
  static size_t segment_size(size_t block_bytes);

 private:
  struct Block {
    char* ptr;
    size_t size;
    void* stream;
    bool small;
    bool allocated = false;
    Block* prev = nullptr;  // address-adjacent blocks of the same segment
    Block* next = nullptr;
  };
  struct BySize {  // free blocks ordered by (stream, size, address): lower_bound is the best fit
    bool operator()(const Block* a, const Block* b) const;
  };
  using FreeSet = std::set<Block*, BySize>;

  FreeSet& pool(bool small) { return small ? free_small_ : free_large_; }
  Block* best_fit(size_t size, void* stream, bool small);
  Block* new_segment(size_t size, void* stream, bool small);  // nullptr when the raw allocator fails
  void split(Block* b, size_t size);
  void free_segment(Block* b);                // b is a whole free segment: back to the raw allocator
  bool release_segments(size_t want);         // frees whole free segments (largest first) until `want` bytes
  void release_all_segments();

  std::unique_ptr<RawAllocator> raw_;
  mutable std::mutex mu_;
  std::unordered_map<void*, Block*> live_;
  FreeSet free_small_, free_large_;
  AllocatorStats st_;
};

// The caching allocator of CUDA device `index` (created on first use).
CachingAllocator& cuda_caching_allocator(int index);

}  // namespace mpitron
