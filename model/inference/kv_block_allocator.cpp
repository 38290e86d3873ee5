#include "model/inference/kv_block_allocator.h"

#include <algorithm>

#include "core/error.h"

namespace mpitron {

KVBlockAllocator::KVBlockAllocator(int64_t num_blocks) : total_(num_blocks) {
  MPT_CHECK(num_blocks >= 1 && num_blocks < (int64_t{1} << 31),
            str("the KV cache needs between 1 and 2^31 - 1 blocks, got ", num_blocks),
            "raise --inference-dynamic-batching-buffer-size-gb or lower --inference-dynamic-batching-block-size");
  free_.resize(static_cast<size_t>(num_blocks));
  for (int64_t i = 0; i < num_blocks; ++i) free_[static_cast<size_t>(i)] = static_cast<int32_t>(num_blocks - 1 - i);
  in_use_.assign(static_cast<size_t>(num_blocks), false);
}

bool KVBlockAllocator::allocate(int64_t n, std::vector<int32_t>& table) {
  MPT_CHECK(n >= 0, str("KVBlockAllocator::allocate: negative count ", n), "");
  if (n > free_blocks()) return false;
  for (int64_t i = 0; i < n; ++i) {
    const int32_t b = free_.back();
    free_.pop_back();
    in_use_[static_cast<size_t>(b)] = true;
    table.push_back(b);
  }
  peak_ = std::max(peak_, used());
  return true;
}

void KVBlockAllocator::release(std::vector<int32_t>& table) {
  for (int32_t b : table) {
    MPT_CHECK(b >= 0 && b < total_ && in_use_[static_cast<size_t>(b)],
              str("KVBlockAllocator::release: block ", b, " is not allocated"), "a block table was released twice");
    in_use_[static_cast<size_t>(b)] = false;
    free_.push_back(b);
  }
  table.clear();
}

}  // namespace mpitron
