// tensor/cuda/dropout.cu — dropout with a counter-based Philox mask (core/philox.h).
//   keep[i] = philox_uniform(seed, offset, i) >= p
//   out[i]  = keep[i] ? x[i] · (1 / (1 − p)) : 0    (forward; out may alias x)
//   dx[i]   = keep[i] ? dout[i] · (1 / (1 − p)) : 0 (backward regenerates the mask)
// (multiplying by the f32 reciprocal, as the CPU backend does, so both agree bit for bit)
// i is the flat element index, exactly as on the CPU, so both backends draw the
// same mask. One Philox call yields 4 numbers (elements 4j..4j+3), so a thread
// working on 8 aligned elements makes 2 calls.
#include "core/philox.h"
#include "tensor/cuda/common.cuh"
#include "tensor/cuda/map.cuh"
#include "tensor/cuda/ops.h"

namespace mpitron::cuda {

namespace {
template <typename T> struct DropoutOp {
  const T* in;
  T* out;
  float p;
  uint64_t seed, offset;
  template <int V> __device__ void apply(int64_t i) const {
    float u[V];
    load_f<V>(in + i, u);
    const float keep_scale = 1.0f / (1.0f - p);
    if constexpr (V % 4 == 0) {
      // i is a multiple of V, hence of 4: element i + k is lane k % 4 of block (i + k) / 4.
#pragma unroll
      for (int b = 0; b < V / 4; ++b) {
        const Philox4 r = philox4x32_10(offset + static_cast<uint64_t>(i) / 4 + b, 0, seed);
#pragma unroll
        for (int l = 0; l < 4; ++l) {
          const float rnd = static_cast<float>(r.x[l] >> 8) * (1.0f / 16777216.0f);
          float& v = u[b * 4 + l];
          v = rnd >= p ? v * keep_scale : 0.0f;
        }
      }
    } else {
#pragma unroll
      for (int k = 0; k < V; ++k) u[k] = philox_uniform(seed, offset, i + k) >= p ? u[k] * keep_scale : 0.0f;
    }
    store_f<V>(out + i, u);
  }
};

void dropout_apply(const Tensor& in, const Tensor& out, float p, uint64_t seed, uint64_t offset, Stream s,
                   const char* what) {
  DeviceGuard g(in);
  MPT_DISPATCH_DEV_FLOAT(in.dtype(), what, [&](auto tag) {
    using T = decltype(tag);
    const DropoutOp<T> op{static_cast<const T*>(in.data_ptr()), static_cast<T*>(out.data_ptr()), p, seed, offset};
    launch_map(in.numel(), op, vec_aligned(op.in, sizeof(T)) && vec_aligned(op.out, sizeof(T)), s, what);
  });
}
}  // namespace

void dropout_forward(const Tensor& x, const Tensor& out, float p, uint64_t seed, uint64_t offset, Stream s) {
  dropout_apply(x, out, p, seed, offset, s, "dropout_forward");
}

void dropout_backward(const Tensor& dout, const Tensor& dx, float p, uint64_t seed, uint64_t offset, Stream s) {
  dropout_apply(dout, dx, p, seed, offset, s, "dropout_backward");
}

}  // namespace mpitron::cuda
