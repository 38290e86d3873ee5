#include "core/philox.h"

#include <cmath>

namespace mpitron {

float philox_normal(uint64_t seed, uint64_t offset, uint64_t i) {
  const uint64_t pair = i >> 1;
  // u1 in (0, 1] so the log is finite.
  const float u1 = 1.0f - philox_uniform(seed, offset, 2 * pair);
  const float u2 = philox_uniform(seed, offset, 2 * pair + 1);
  const double r = std::sqrt(-2.0 * std::log(static_cast<double>(u1)));
  const double t = 2.0 * M_PI * static_cast<double>(u2);
  return static_cast<float>((i & 1) ? r * std::sin(t) : r * std::cos(t));
}

}  // namespace mpitron
