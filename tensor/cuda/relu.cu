// tensor/cuda/relu.cu — ReLU forward and backward (relu.h), element-wise on the map.cuh
// skeleton (16-byte loads, f32 math):
//   out (n) = max(x, 0)  (NaN propagates, as torch.relu);   dx (n) = dout · [x > 0]
// out may alias x, dx may alias dout.
#include "tensor/cuda/common.cuh"
#include "tensor/cuda/map.cuh"
#include "tensor/cuda/ops.h"

namespace mpitron::cuda {

namespace {
template <typename T> struct ReluForwardOp {
  const T* x;
  T* out;
  template <int V> __device__ void apply(int64_t i) const {
    float u[V];
    load_f<V>(x + i, u);
#pragma unroll
    for (int k = 0; k < V; ++k) u[k] = u[k] > 0.0f || u[k] != u[k] ? u[k] : 0.0f;
    store_f<V>(out + i, u);
  }
};

template <typename T> struct ReluBackwardOp {
  const T* dout;
  const T* x;
  T* dx;
  template <int V> __device__ void apply(int64_t i) const {
    float u[V], d[V];
    load_f<V>(x + i, u);
    load_f<V>(dout + i, d);
#pragma unroll
    for (int k = 0; k < V; ++k) d[k] = u[k] > 0.0f ? d[k] : 0.0f;
    store_f<V>(dx + i, d);
  }
};
}  // namespace

void relu_forward(const Tensor& x, const Tensor& out, Stream s) {
  DeviceGuard g(x);
  MPT_DISPATCH_DEV_FLOAT(x.dtype(), "relu_forward", [&](auto tag) {
    using T = decltype(tag);
    const ReluForwardOp<T> op{static_cast<const T*>(x.data_ptr()), static_cast<T*>(out.data_ptr())};
    launch_map(x.numel(), op, vec_aligned(op.x, sizeof(T)) && vec_aligned(op.out, sizeof(T)), s, "relu_forward");
  });
}

void relu_backward(const Tensor& dout, const Tensor& x, const Tensor& dx, Stream s) {
  DeviceGuard g(x);
  MPT_DISPATCH_DEV_FLOAT(x.dtype(), "relu_backward", [&](auto tag) {
    using T = decltype(tag);
    const ReluBackwardOp<T> op{static_cast<const T*>(dout.data_ptr()), static_cast<const T*>(x.data_ptr()),
                               static_cast<T*>(dx.data_ptr())};
    launch_map(x.numel(), op,
               vec_aligned(op.dout, sizeof(T)) && vec_aligned(op.x, sizeof(T)) && vec_aligned(op.dx, sizeof(T)), s,
               "relu_backward");
  });
}

}  // namespace mpitron::cuda
