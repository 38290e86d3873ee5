#include "model/flags/prefix_eviction.h"

#include "core/error.h"

namespace mpitron {

const PrefixEvictionRow& row_of(PrefixEviction p) {
  for (const PrefixEvictionRow& r : kPrefixEvictions)
    if (r.policy == p) return r;
  MPT_THROW(str("prefix caching: eviction policy ", static_cast<int>(p), " has no row"), "");
}

std::string prefix_eviction_choices() {
  std::string s;
  for (const PrefixEvictionRow& r : kPrefixEvictions) s += (s.empty() ? "" : " | ") + std::string(r.name);
  return s;
}

PrefixEviction parse_prefix_eviction(const std::string& name) {
  std::string rows;
  for (const PrefixEvictionRow& r : kPrefixEvictions) {
    if (name == r.name) return r.policy;
    rows += str(rows.empty() ? "" : "; ", r.name, ": ", r.what);
  }
  MPT_THROW(str("--inference-dynamic-batching-prefix-caching-eviction-policy '", name, "' is not one of ",
                prefix_eviction_choices()),
            rows);
}

}  // namespace mpitron
