// tensor/cuda/moe_topk.cu — the router's top-k (tensor/moe_topk.h): one thread per row (grid-stride)
// makes k passes over its E scores (E is the expert count: tens to hundreds), each taking
// the largest not taken yet, ties to the lower index, as the CPU does; the taken set is
// the chosen indices so far (no scratch). Backward: one thread per row zeroes its E
// gradients and writes its k.
#include "tensor/cuda/common.cuh"
#include "tensor/cuda/ops.h"

namespace mpitron::cuda {

namespace {
__global__ void topk_kernel(const float* s, float* v, int32_t* ix, int64_t N, int E, int k) {
  for (int64_t n = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; n < N;
       n += static_cast<int64_t>(gridDim.x) * blockDim.x) {
  const float* row = s + n * E;
  for (int j = 0; j < k; ++j) {
    int best = -1;
    for (int e = 0; e < E; ++e) {
      bool taken = false;
      for (int q = 0; q < j; ++q) taken |= ix[n * k + q] == e;
      if (!taken && (best < 0 || row[e] > row[best])) best = e;
    }
    v[n * k + j] = row[best];
    ix[n * k + j] = best;
  }
  }
}

__global__ void topk_backward_kernel(const float* dv, const int32_t* ix, float* ds, int64_t N, int E, int k) {
  for (int64_t n = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; n < N;
       n += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    for (int e = 0; e < E; ++e) ds[n * E + e] = 0.0f;
    for (int j = 0; j < k; ++j) {
      const int e = ix[n * k + j];
      if (e >= 0 && e < E) ds[n * E + e] = dv[n * k + j];
    }
  }
}
}  // namespace

void moe_topk(const Tensor& scores, int64_t k, const Tensor& values, const Tensor& indices, Stream s) {
  DeviceGuard g(scores);
  const int64_t N = scores.dim(0);
  if (N == 0) return;
  MPT_LAUNCH(grid_for(N, 128), 128, 0, stream_of(s), topk_kernel)(scores.data<float>(), values.data<float>(),
                                                                   indices.data<int32_t>(), N,
                                                                   static_cast<int>(scores.dim(1)), static_cast<int>(k));
  MPT_KERNEL_CHECK("moe_topk");
}

void moe_topk_backward(const Tensor& dvalues, const Tensor& indices, const Tensor& dscores, Stream s) {
  DeviceGuard g(dscores);
  const int64_t N = dscores.dim(0);
  if (N == 0) return;
  MPT_LAUNCH(grid_for(N, 128), 128, 0, stream_of(s), topk_backward_kernel)(
      dvalues.data<float>(), indices.data<int32_t>(), dscores.data<float>(), N, static_cast<int>(dscores.dim(1)),
      static_cast<int>(dvalues.dim(1)));
  MPT_KERNEL_CHECK("moe_topk_backward");
}

}  // namespace mpitron::cuda
