// tensor/cuda/gelu.cu — GELU, tanh approximation (GPT-2), forward and backward.
//   out (n) = 0.5·x·(1 + tanh(k·(x + 0.044715·x³))),  k = √(2/π)
//   dx  (n) = dout · gelu'(x)            (overwritten; dx may alias dout, out may alias x)
// computed as x·sigmoid(2u) and its derivative (gelu_math.h), which do not cancel
// for negative x. Element-wise on the map.cuh skeleton: 16-byte loads, f32 math.
#include "tensor/cuda/common.cuh"
#include "tensor/cuda/gelu_math.h"
#include "tensor/cuda/map.cuh"
#include "tensor/cuda/ops.h"

namespace mpitron::cuda {

namespace {
template <typename T> struct GeluForwardOp {
  const T* x;
  T* out;
  template <int V> __device__ void apply(int64_t i) const {
    float u[V];
    load_f<V>(x + i, u);
#pragma unroll
    for (int k = 0; k < V; ++k) u[k] = gelu_math::gelu(u[k]);
    store_f<V>(out + i, u);
  }
};

template <typename T> struct GeluBackwardOp {
  const T* dout;
  const T* x;
  T* dx;
  template <int V> __device__ void apply(int64_t i) const {
    float u[V], d[V];
    load_f<V>(x + i, u);
    load_f<V>(dout + i, d);
#pragma unroll
    for (int k = 0; k < V; ++k) d[k] *= gelu_math::gelu_grad(u[k]);
    store_f<V>(dx + i, d);
  }
};
}  // namespace

void gelu_forward(const Tensor& x, const Tensor& out, Stream s) {
  DeviceGuard g(x);
  MPT_DISPATCH_DEV_FLOAT(x.dtype(), "gelu_forward", [&](auto tag) {
    using T = decltype(tag);
    const GeluForwardOp<T> op{static_cast<const T*>(x.data_ptr()), static_cast<T*>(out.data_ptr())};
    launch_map(x.numel(), op, vec_aligned(op.x, sizeof(T)) && vec_aligned(op.out, sizeof(T)), s, "gelu_forward");
  });
}

void gelu_backward(const Tensor& dout, const Tensor& x, const Tensor& dx, Stream s) {
  DeviceGuard g(x);
  MPT_DISPATCH_DEV_FLOAT(x.dtype(), "gelu_backward", [&](auto tag) {
    using T = decltype(tag);
    const GeluBackwardOp<T> op{static_cast<const T*>(dout.data_ptr()), static_cast<const T*>(x.data_ptr()),
                               static_cast<T*>(dx.data_ptr())};
    launch_map(x.numel(), op,
               vec_aligned(op.dout, sizeof(T)) && vec_aligned(op.x, sizeof(T)) && vec_aligned(op.dx, sizeof(T)), s,
               "gelu_backward");
  });
}

}  // namespace mpitron::cuda
