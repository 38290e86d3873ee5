// model/inference/prefix_cache.h — what prefix caching (Megatron-Core's
// --inference-dynamic-batching-prefix-caching) needs beside the block allocator:
// the key of a full KV block, and the engine's options (the eviction policies are
// model/flags/prefix_eviction.h).
//
// A block is shared by prefix, never by content alone: its key hashes the key of the
// block before it with its own tokens,
//   key(0) = H(seed, tokens[0, bs)),  key(i) = H(key(i − 1), tokens[i·bs, (i + 1)·bs)),
// so two sequences have the same key for block i exactly when their first (i + 1)·bs
// tokens agree (up to a 64-bit hash collision), and then the same keys and values in it
// (a position's K/V depend only on the tokens before it: model_runner.h's batch
// invariance). Only full blocks get a key; the partial last block of a sequence is its own.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "model/flags/prefix_eviction.h"

namespace mpitron {

struct PrefixCacheOptions {
  bool enabled = false;                             // --inference-dynamic-batching-prefix-caching
  PrefixEviction eviction = PrefixEviction::RefZero;  // --inference-dynamic-batching-prefix-caching-eviction-policy
};

// The key of a block of n tokens after the block whose key is `parent` (kNoParent for block 0).
inline constexpr uint64_t kNoParent = 0x6d70697472306e21ULL;
uint64_t block_key(uint64_t parent, const int32_t* tokens, int64_t n);
// Appends to `keys` (the keys of the first keys.size() blocks of `tokens`) the keys of the next
// full blocks of tokens[0, n): afterwards keys.size() == max(keys.size(), n / block_size).
void extend_block_keys(std::vector<uint64_t>& keys, const std::vector<int32_t>& tokens, int64_t n, int64_t block_size);

}  // namespace mpitron
