// core/allocator.h — caching device allocator.
//
// Blocks are rounded up to a size class (512 B granules below 1 MiB, 2 MiB
// granules above) and, when freed, kept in a free list keyed by (stream, size
// class). A request is served from that list first, so a training step that
// asks for the same sizes every iteration stops calling cudaMalloc after the
// first one. A block freed on stream S is only reused for work on stream S:
// work queued on S before the free finishes before any later work on S, so no
// event is needed. Current (live) and peak bytes are tracked per allocator.
//
// The caching logic is independent of the raw allocator (a RawAllocator), so
// it is tested on the CPU with a counting backend.
#pragma once
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "core/device.h"

namespace mpitron {

class RawAllocator {
 public:
  virtual ~RawAllocator() = default;
  virtual void* raw_alloc(size_t bytes) = 0;  // returns nullptr when out of memory
  virtual void raw_free(void* p) = 0;
};

struct AllocatorStats {
  size_t current_bytes = 0;   // bytes in live blocks (rounded sizes)
  size_t peak_bytes = 0;      // max current_bytes since the last reset_peak()
  size_t cached_bytes = 0;    // bytes held in free lists
  size_t reserved_bytes = 0;  // current + cached: what the raw allocator handed out
  uint64_t raw_allocs = 0;    // calls that reached the raw allocator
  uint64_t cache_hits = 0;    // requests served from a free list
};

class CachingAllocator {
 public:
  explicit CachingAllocator(std::unique_ptr<RawAllocator> raw);
  ~CachingAllocator();
  CachingAllocator(const CachingAllocator&) = delete;
  CachingAllocator& operator=(const CachingAllocator&) = delete;

  // A block of at least `bytes` for use on `stream`. On out-of-memory the cache
  // is emptied and the request retried once before throwing.
  void* allocate(size_t bytes, Stream stream = Stream());
  // Return a block from allocate(); it goes back to its stream's free list.
  void release(void* p);
  // Give every cached block back to the raw allocator.
  void empty_cache();

  AllocatorStats stats() const;
  void reset_peak();

  static size_t size_class(size_t bytes);

 private:
  struct Block {
    size_t size;
    void* stream;
  };
  std::unique_ptr<RawAllocator> raw_;
  mutable std::mutex mu_;
  std::unordered_map<void*, Block> live_;
  std::map<std::pair<void*, size_t>, std::vector<void*>> free_;  // (stream, size) -> blocks
  AllocatorStats st_;
};

// The caching allocator of CUDA device `index` (created on first use).
CachingAllocator& cuda_caching_allocator(int index);

}  // namespace mpitron
