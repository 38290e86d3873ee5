// model/inference/kv_block_allocator.h — the KV cache's block allocator, as the scheduler sees it.
//
// The paged KV cache (paged_kv_cache.h) is a pool of `total` blocks of
// block_size positions each. A sequence owns a block table: the ids of the
// blocks that hold its positions, position p in block table[p / block_size] at
// offset p % block_size. This class only hands out and takes back ids (no
// tensors): the dynamic engine's scheduler runs it on the driver rank and
// sends the tables with each step, so every rank's cache uses the same blocks.
//
// Prefix caching (prefix_cache.h): a FULL block may be registered under its prefix key;
// later tables may then share it (share()), each holding one reference. A shared block is
// never written (its positions are all computed); a block is in at most one table unless
// it is registered. When a block's last reference goes:
//   not registered             -> free;
//   registered, ref_zero       -> leaves the cache, free;
//   registered, lru            -> stays cached and unreferenced ("evictable"); allocate()
//                                 takes free blocks first, then evicts the least recently
//                                 released evictable block (it leaves the cache).
// A referenced block is never evicted. free_blocks() counts what allocate() can hand out
// (free and evictable). Without registrations the allocator is the plain one: LIFO reuse.
//
// Invariants (checked, an Error otherwise): release() takes back exactly references held;
// a key names at most one block and a block has at most one key.
#pragma once
#include <cstdint>
#include <map>
#include <unordered_map>
#include <vector>

#include "model/inference/prefix_cache.h"

namespace mpitron {

class KVBlockAllocator {
 public:
  explicit KVBlockAllocator(int64_t num_blocks, PrefixEviction eviction = PrefixEviction::RefZero);

  int64_t total() const { return total_; }
  // Blocks allocate() can hand out: free ones and unreferenced cached ones (lru).
  int64_t free_blocks() const { return static_cast<int64_t>(free_.size() + evictable_.size()); }
  int64_t used() const { return total_ - free_blocks(); }  // blocks referenced by some table
  int64_t peak_used() const { return peak_; }  // most blocks in use at once since construction

  // Appends n free block ids to `table`; returns false and takes nothing when fewer than n are free.
  bool allocate(int64_t n, std::vector<int32_t>& table);
  // Drops `table`'s reference to each of its blocks (see above) and clears it.
  void release(std::vector<int32_t>& table);

  // ---- prefix caching ----
  // How many of keys[0, n) are cached, from the first on (the length of the cached prefix, in blocks).
  int64_t match(const std::vector<uint64_t>& keys, int64_t n) const;
  // Appends the cached blocks of keys[0, n) to `table`, one more reference each (n <= match(keys, n)).
  void share(const std::vector<uint64_t>& keys, int64_t n, std::vector<int32_t>& table);
  // Caches `block` (referenced, full, its positions computed) under `key`. False when the key
  // already names a block (the same prefix computed twice at once: this copy stays private).
  bool register_block(int32_t block, uint64_t key);
  bool cached(uint64_t key) const { return by_key_.count(key) > 0; }
  int64_t cached_blocks() const { return static_cast<int64_t>(by_key_.size()); }  // resident, held or not
  int64_t evicted_blocks() const { return evicted_; }  // cached blocks taken back for other use (lru)
  // References beyond the first, over every block: the blocks sharing saves now.
  int64_t shared_references() const { return shared_refs_; }
  int64_t peak_shared_references() const { return peak_shared_; }  // the most at once since construction
  int32_t refs(int32_t block) const { return ref_[static_cast<size_t>(block)]; }

 private:
  void forget(int32_t block);  // drops block's key

  int64_t total_;
  PrefixEviction eviction_;
  std::vector<int32_t> free_;   // LIFO: the most recently freed block is reused first
  std::vector<int32_t> ref_;    // [block] tables holding it
  std::vector<uint64_t> key_;   // [block] its key when registered
  std::vector<bool> keyed_;     // [block] registered
  std::unordered_map<uint64_t, int32_t> by_key_;  // key -> block
  std::map<uint64_t, int32_t> evictable_;         // release tick -> unreferenced cached block (oldest first)
  std::vector<uint64_t> tick_of_;                 // [block] its tick in evictable_
  uint64_t tick_ = 0;
  int64_t peak_ = 0, evicted_ = 0, shared_refs_ = 0, peak_shared_ = 0;
};

// Blocks needed to hold positions [0, tokens).
inline int64_t blocks_for(int64_t tokens, int64_t block_size) { return (tokens + block_size - 1) / block_size; }

}  // namespace mpitron
