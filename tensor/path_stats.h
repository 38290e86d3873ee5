// tensor/path_stats.h — which implementation an op actually ran.
//
// Backends choose between implementations at run time (cuDNN or the cuBLAS
// attention, 8-wide or scalar row kernels, the cuBLASLt bias epilogue or a
// separate bias kernel). A silent fallback still gives the right numbers, so a
// test that means to exercise one path could pass on the other. Each choice
// point counts the path it took under a name "<op>.<path>", e.g.
//   attention_forward.cudnn   attention_forward.fallback
//   layernorm_forward.vec8    layernorm_forward.scalar
//   gemm.epilogue_bias        gemm.bias_kernel
// and tests read the counters (path_count, or PathProbe for the change over a
// call) to assert the path they meant. Counting costs one locked map update per
// choice (per kernel launch, not per element). Backend-neutral: the CPU backend
// has one path per op and counts nothing.
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <string_view>

namespace mpitron {

// Adds one to counter "<op>.<path>" (thread-safe).
void path_count_add(std::string_view op, std::string_view path);
// The counter's value (0 if never counted).
int64_t path_count(const std::string& name);
// Every counter, by name.
std::map<std::string, int64_t> path_counts();
void path_counts_reset();

// The change of every counter between construction and delta()/taken().
class PathProbe {
 public:
  PathProbe() : start_(path_counts()) {}
  int64_t delta(const std::string& name) const;
  // Counters that changed, as "name+k, name+k" (for test messages).
  std::string taken() const;

 private:
  std::map<std::string, int64_t> start_;
};

}  // namespace mpitron
