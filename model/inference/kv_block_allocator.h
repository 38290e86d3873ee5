// model/inference/kv_block_allocator.h — the KV cache's block allocator, as the scheduler sees it.
//
// The paged KV cache (paged_kv_cache.h) is a pool of `total` blocks of
// block_size positions each. A sequence owns a block table: the ids of the
// blocks that hold its positions, position p in block table[p / block_size] at
// offset p % block_size. This class only hands out and takes back ids (no
// tensors): the dynamic engine's scheduler runs it on the driver rank and
// sends the tables with each step, so every rank's cache uses the same blocks.
//
// Invariants (checked, an Error otherwise): a block is in at most one table;
// release() takes back exactly the blocks a table holds.
#pragma once
#include <cstdint>
#include <vector>

namespace mpitron {

class KVBlockAllocator {
 public:
  explicit KVBlockAllocator(int64_t num_blocks);

  int64_t total() const { return total_; }
  int64_t free_blocks() const { return static_cast<int64_t>(free_.size()); }
  int64_t used() const { return total_ - free_blocks(); }
  int64_t peak_used() const { return peak_; }  // most blocks in use at once since construction

  // Appends n free block ids to `table`; returns false and takes nothing when fewer than n are free.
  bool allocate(int64_t n, std::vector<int32_t>& table);
  // Returns every block of `table` to the pool and clears it.
  void release(std::vector<int32_t>& table);

 private:
  int64_t total_;
  std::vector<int32_t> free_;   // LIFO: the most recently freed block is reused first
  std::vector<bool> in_use_;    // [block]
  int64_t peak_ = 0;
};

// Blocks needed to hold positions [0, tokens).
inline int64_t blocks_for(int64_t tokens, int64_t block_size) { return (tokens + block_size - 1) / block_size; }

}  // namespace mpitron
