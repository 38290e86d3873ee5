#include "model/inference/kv_block_allocator.h"

#include <algorithm>

#include "core/error.h"

namespace mpitron {

KVBlockAllocator::KVBlockAllocator(int64_t num_blocks, PrefixEviction eviction) : total_(num_blocks), eviction_(eviction) {
  MPT_CHECK(num_blocks >= 1 && num_blocks < (int64_t{1} << 31),
            str("the KV cache needs between 1 and 2^31 - 1 blocks, got ", num_blocks),
            "raise --inference-dynamic-batching-buffer-size-gb or lower --inference-dynamic-batching-block-size");
  const size_t n = static_cast<size_t>(num_blocks);
  free_.resize(n);
  for (int64_t i = 0; i < num_blocks; ++i) free_[static_cast<size_t>(i)] = static_cast<int32_t>(num_blocks - 1 - i);
  ref_.assign(n, 0);
  key_.assign(n, 0);
  keyed_.assign(n, false);
  tick_of_.assign(n, 0);
}

bool KVBlockAllocator::allocate(int64_t n, std::vector<int32_t>& table) {
  MPT_CHECK(n >= 0, str("KVBlockAllocator::allocate: negative count ", n), "");
  if (n > free_blocks()) return false;
  for (int64_t i = 0; i < n; ++i) {
    int32_t b;
    if (!free_.empty()) {
      b = free_.back();
      free_.pop_back();
    } else {  // the least recently released cached block leaves the cache
      b = evictable_.begin()->second;
      evictable_.erase(evictable_.begin());
      forget(b);
      ++evicted_;
    }
    ref_[static_cast<size_t>(b)] = 1;
    table.push_back(b);
  }
  peak_ = std::max(peak_, used());
  return true;
}

void KVBlockAllocator::release(std::vector<int32_t>& table) {
  for (int32_t b : table) {
    MPT_CHECK(b >= 0 && b < total_ && ref_[static_cast<size_t>(b)] > 0,
              str("KVBlockAllocator::release: block ", b, " is not allocated"), "a block table was released twice");
    const size_t i = static_cast<size_t>(b);
    if (--ref_[i] > 0) {
      --shared_refs_;
      continue;
    }
    if (keyed_[i] && row_of(eviction_).keeps_unreferenced) {
      tick_of_[i] = ++tick_;
      evictable_.emplace(tick_of_[i], b);
      continue;
    }
    if (keyed_[i]) forget(b);
    free_.push_back(b);
  }
  table.clear();
}

int64_t KVBlockAllocator::match(const std::vector<uint64_t>& keys, int64_t n) const {
  MPT_CHECK(n >= 0 && n <= static_cast<int64_t>(keys.size()), str("KVBlockAllocator::match: ", n, " of ", keys.size()), "");
  int64_t m = 0;
  while (m < n && by_key_.count(keys[static_cast<size_t>(m)])) ++m;
  return m;
}

void KVBlockAllocator::share(const std::vector<uint64_t>& keys, int64_t n, std::vector<int32_t>& table) {
  MPT_CHECK(match(keys, n) >= n, str("KVBlockAllocator::share: ", n, " blocks asked, ", match(keys, n), " cached"), "");
  for (int64_t j = 0; j < n; ++j) {
    const int32_t b = by_key_.at(keys[static_cast<size_t>(j)]);
    const size_t i = static_cast<size_t>(b);
    if (ref_[i] == 0) evictable_.erase(tick_of_[i]);  // revived: no longer evictable
    else peak_shared_ = std::max(peak_shared_, ++shared_refs_);
    ++ref_[i];
    table.push_back(b);
  }
  peak_ = std::max(peak_, used());
}

bool KVBlockAllocator::register_block(int32_t block, uint64_t key) {
  MPT_CHECK(block >= 0 && block < total_ && ref_[static_cast<size_t>(block)] > 0,
            str("KVBlockAllocator::register_block: block ", block, " is not allocated"), "");
  const size_t i = static_cast<size_t>(block);
  if (keyed_[i]) {
    MPT_CHECK(key_[i] == key, str("KVBlockAllocator::register_block: block ", block, " is cached under another prefix"),
              "");
    return false;
  }
  if (by_key_.count(key)) return false;
  by_key_.emplace(key, block);
  key_[i] = key;
  keyed_[i] = true;
  return true;
}

void KVBlockAllocator::forget(int32_t block) {
  const size_t i = static_cast<size_t>(block);
  by_key_.erase(key_[i]);
  keyed_[i] = false;
}

}  // namespace mpitron
