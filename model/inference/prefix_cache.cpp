#include "model/inference/prefix_cache.h"

#include "core/error.h"

namespace mpitron {

namespace {
// splitmix64's finaliser: every input bit moves every output bit.
uint64_t mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}
}  // namespace

uint64_t block_key(uint64_t parent, const int32_t* tokens, int64_t n) {
  uint64_t h = mix(parent ^ mix(static_cast<uint64_t>(n)));
  for (int64_t i = 0; i < n; ++i) h = mix(h ^ static_cast<uint64_t>(static_cast<uint32_t>(tokens[i])));
  return h;
}

void extend_block_keys(std::vector<uint64_t>& keys, const std::vector<int32_t>& tokens, int64_t n, int64_t block_size) {
  MPT_CHECK(n >= 0 && n <= static_cast<int64_t>(tokens.size()) && block_size >= 1,
            str("extend_block_keys: ", n, " of ", tokens.size(), " tokens in blocks of ", block_size), "");
  for (int64_t i = static_cast<int64_t>(keys.size()); (i + 1) * block_size <= n; ++i)
    keys.push_back(block_key(i == 0 ? kNoParent : keys.back(), tokens.data() + i * block_size, block_size));
}

}  // namespace mpitron
