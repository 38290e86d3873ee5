// tensor/cuda/softcap.cu — logit soft-capping forward and backward (softcap.h), element-wise
// on the map.cuh skeleton (16-byte loads, f32 math):
//   out (n) = cap·tanh(x/cap);   dx (n) = dout·(1 − (out/cap)²)
// out may alias x, dx may alias dout.
#include "tensor/cuda/common.cuh"
#include "tensor/cuda/map.cuh"
#include "tensor/cuda/ops.h"

namespace mpitron::cuda {

namespace {
template <typename T> struct SoftcapForwardOp {
  const T* x;
  T* out;
  float cap, inv;
  template <int V> __device__ void apply(int64_t i) const {
    float u[V];
    load_f<V>(x + i, u);
#pragma unroll
    for (int k = 0; k < V; ++k) u[k] = cap * tanhf(u[k] * inv);
    store_f<V>(out + i, u);
  }
};

template <typename T> struct SoftcapBackwardOp {
  const T* dout;
  const T* out;
  T* dx;
  float inv;
  template <int V> __device__ void apply(int64_t i) const {
    float o[V], d[V];
    load_f<V>(out + i, o);
    load_f<V>(dout + i, d);
#pragma unroll
    for (int k = 0; k < V; ++k) {
      const float t = o[k] * inv;
      d[k] = d[k] * (1.0f - t * t);
    }
    store_f<V>(dx + i, d);
  }
};
}  // namespace

void softcap_forward(const Tensor& x, const Tensor& out, float cap, Stream s) {
  DeviceGuard g(x);
  MPT_DISPATCH_DEV_FLOAT(x.dtype(), "softcap_forward", [&](auto tag) {
    using T = decltype(tag);
    const SoftcapForwardOp<T> op{static_cast<const T*>(x.data_ptr()), static_cast<T*>(out.data_ptr()), cap,
                                 1.0f / cap};
    launch_map(x.numel(), op, vec_aligned(op.x, sizeof(T)) && vec_aligned(op.out, sizeof(T)), s, "softcap_forward");
  });
}

void softcap_backward(const Tensor& dout, const Tensor& out, const Tensor& dx, float cap, Stream s) {
  DeviceGuard g(out);
  MPT_DISPATCH_DEV_FLOAT(out.dtype(), "softcap_backward", [&](auto tag) {
    using T = decltype(tag);
    const SoftcapBackwardOp<T> op{static_cast<const T*>(dout.data_ptr()), static_cast<const T*>(out.data_ptr()),
                                  static_cast<T*>(dx.data_ptr()), 1.0f / cap};
    launch_map(out.numel(), op,
               vec_aligned(op.dout, sizeof(T)) && vec_aligned(op.out, sizeof(T)) && vec_aligned(op.dx, sizeof(T)), s,
               "softcap_backward");
  });
}

}  // namespace mpitron::cuda
