// model/flags/prefix_eviction.h — prefix caching's eviction policies (Megatron-Core's
// PrefixCachingEvictionPolicy, same names): the values of
// --inference-dynamic-batching-prefix-caching-eviction-policy. One row per policy; the flags
// check a value against the rows, the KV block allocator (model/inference/kv_block_allocator.h)
// reads what the row says.
#pragma once
#include <cstdint>
#include <string>

namespace mpitron {

// What happens to a cached block when the last request holding it ends.
enum class PrefixEviction : int32_t { RefZero, Lru };

struct PrefixEvictionRow {
  PrefixEviction policy;
  const char* name;         // the flag's value
  bool keeps_unreferenced;  // an unreferenced cached block stays resident (evicted oldest first when needed)
  const char* what;         // one line for errors
};
inline constexpr PrefixEvictionRow kPrefixEvictions[] = {
    {PrefixEviction::RefZero, "ref_zero", false, "a cached block leaves the cache when no request holds it"},
    {PrefixEviction::Lru, "lru", true,
     "unreferenced cached blocks stay, the least recently used evicted when blocks are needed"},
};

const PrefixEvictionRow& row_of(PrefixEviction p);
// Throws naming --inference-dynamic-batching-prefix-caching-eviction-policy and the choices.
PrefixEviction parse_prefix_eviction(const std::string& name);
std::string prefix_eviction_choices();  // "ref_zero | lru"

}  // namespace mpitron
