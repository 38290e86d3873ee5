// tensor/cpu/moe_topk.cpp — the router's top-k (tensor/moe_topk.h): k passes over each
// row, each taking the largest score not taken yet (ties: the lower index).
#include <vector>

#include "tensor/cpu/ops.h"

namespace mpitron::cpu {

void moe_topk(const Tensor& scores, int64_t k, const Tensor& values, const Tensor& indices, Stream) {
  const int64_t N = scores.dim(0), E = scores.dim(1);
  const float* s = scores.data<float>();
  float* v = values.data<float>();
  int32_t* ix = indices.data<int32_t>();
#pragma omp parallel for schedule(static) if (N * E > 65536)
  for (int64_t n = 0; n < N; ++n) {
    std::vector<char> taken(static_cast<size_t>(E), 0);
    for (int64_t j = 0; j < k; ++j) {
      int64_t best = -1;
      for (int64_t e = 0; e < E; ++e)
        if (!taken[static_cast<size_t>(e)] && (best < 0 || s[n * E + e] > s[n * E + best])) best = e;
      taken[static_cast<size_t>(best)] = 1;
      v[n * k + j] = s[n * E + best];
      ix[n * k + j] = static_cast<int32_t>(best);
    }
  }
}

void moe_topk_backward(const Tensor& dvalues, const Tensor& indices, const Tensor& dscores, Stream) {
  const int64_t N = dscores.dim(0), E = dscores.dim(1), k = dvalues.dim(1);
  const float* dv = dvalues.data<float>();
  const int32_t* ix = indices.data<int32_t>();
  float* ds = dscores.data<float>();
#pragma omp parallel for schedule(static) if (N * E > 65536)
  for (int64_t n = 0; n < N; ++n) {
    for (int64_t e = 0; e < E; ++e) ds[n * E + e] = 0.0f;
    for (int64_t j = 0; j < k; ++j) {
      const int32_t e = ix[n * k + j];
      if (e >= 0 && e < E) ds[n * E + e] = dv[n * k + j];
    }
  }
}

}  // namespace mpitron::cpu
