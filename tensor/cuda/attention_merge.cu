// tensor/cuda/attention_merge.cu — attention_merge (attention_block.h): a block's
// partial output and log-sum-exp folded into a running f32 one.
//
//   acc (B, T, NH, HD) f32 contiguous, acc_lse (B, NH, T) f32 contiguous;
//   part (B, T, NH, HD) io dtype, element (b, t, h, e) at b·sb + t·st + h·HD + e;
//   part_lse (B, NH, T) f32, element (b, h, t) at b·lsb + h·lsh + t.
// One warp per (b, t, h) row: lane 0 reads the running statistic and the warp shares
// it (a shuffle), every lane computes the same two weights and strides over HD, and
// lane 0 writes the new statistic (a row is read and written by its own warp only).
#include "tensor/cuda/common.cuh"
#include "tensor/cuda/ops.h"

namespace mpitron::cuda {

namespace {
constexpr int kWarps = 8;

template <typename T>
__global__ void attention_merge_kernel(float* acc, float* acc_lse, const T* part, const float* part_lse, int64_t rows,
                                       int t_len, int nh, int hd, int64_t sb, int64_t st, int64_t lsb, int64_t lsh) {
  const int lane = threadIdx.x & 31;
  const int64_t r = static_cast<int64_t>(blockIdx.x) * kWarps + (threadIdx.x >> 5);  // (b, t, h) row-major
  if (r >= rows) return;
  const int h = static_cast<int>(r % nh);
  const int64_t bt = r / nh;
  const int t = static_cast<int>(bt % t_len);
  const int64_t b = bt / t_len;
  const float lp = part_lse[b * lsb + h * lsh + t];
  if (lp == -INFINITY) return;  // the block gave this row nothing
  float* la = acc_lse + (b * nh + h) * t_len + t;
  const float old = warp_max(lane == 0 ? *la : -INFINITY);
  const float hi = fmaxf(old, lp);
  const float L = hi + log1pf(expf(-fabsf(old - lp)));  // old = −∞: L = lp
  const float wa = expf(old - L), wp = expf(lp - L);
  float* ar = acc + r * hd;
  const T* pr = part + b * sb + static_cast<int64_t>(t) * st + static_cast<int64_t>(h) * hd;
  for (int e = lane; e < hd; e += 32) ar[e] = ar[e] * wa + to_float(pr[e]) * wp;
  if (lane == 0) *la = L;
}
}  // namespace

void attention_merge(const Tensor& acc, const Tensor& acc_lse, const Tensor& part, const Tensor& part_lse, Stream s) {
  DeviceGuard g(acc);
  const int64_t B = acc.dim(0), T = acc.dim(1), NH = acc.dim(2), HD = acc.dim(3);
  const int64_t rows = B * T * NH;
  if (rows == 0) return;
  const int grid = static_cast<int>((rows + kWarps - 1) / kWarps);
  MPT_DISPATCH_DEV_FLOAT(part.dtype(), "attention_merge", [&](auto tag) {
    using T_ = decltype(tag);
    MPT_LAUNCH(grid, 32 * kWarps, 0, stream_of(s), attention_merge_kernel<T_>)(
        static_cast<float*>(acc.data_ptr()), static_cast<float*>(acc_lse.data_ptr()),
        static_cast<const T_*>(part.data_ptr()), static_cast<const float*>(part_lse.data_ptr()), rows,
        static_cast<int>(T), static_cast<int>(NH), static_cast<int>(HD), part.strides()[0], part.strides()[1],
        part_lse.strides()[0], part_lse.strides()[1]);
  });
  MPT_KERNEL_CHECK("attention_merge");
}

}  // namespace mpitron::cuda
