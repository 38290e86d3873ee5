// tensor/cuda/gelu.cu — GELU, forward and backward: the tanh approximation (GPT-2)
// and the exact erf form (HF BERT), one functor pair templated on the form.
//   out (n) = 0.5·x·(1 + tanh(k·(x + 0.044715·x³))),  k = √(2/π)     (tanh)
//           = x·Φ(x) = 0.5·x·erfc(−x/√2)                              (erf)
//   dx  (n) = dout · gelu'(x)            (overwritten; dx may alias dout, out may alias x)
// computed as x·sigmoid(2u) / x·Φ(x) and their derivatives (gelu_math.h), which do not
// cancel for negative x. Element-wise on the map.cuh skeleton: 16-byte loads, f32 math.
#include "tensor/cuda/common.cuh"
#include "tensor/cuda/gelu_math.h"
#include "tensor/cuda/map.cuh"
#include "tensor/cuda/ops.h"

namespace mpitron::cuda {

namespace {
template <bool Exact> __device__ __forceinline__ float gelu_f(float x) {
  return Exact ? gelu_math::gelu_erf(x) : gelu_math::gelu(x);
}
template <bool Exact> __device__ __forceinline__ float gelu_grad_f(float x) {
  return Exact ? gelu_math::gelu_erf_grad(x) : gelu_math::gelu_grad(x);
}

template <typename T, bool Exact> struct GeluForwardOp {
  const T* x;
  T* out;
  template <int V> __device__ void apply(int64_t i) const {
    float u[V];
    load_f<V>(x + i, u);
#pragma unroll
    for (int k = 0; k < V; ++k) u[k] = gelu_f<Exact>(u[k]);
    store_f<V>(out + i, u);
  }
};

template <typename T, bool Exact> struct GeluBackwardOp {
  const T* dout;
  const T* x;
  T* dx;
  template <int V> __device__ void apply(int64_t i) const {
    float u[V], d[V];
    load_f<V>(x + i, u);
    load_f<V>(dout + i, d);
#pragma unroll
    for (int k = 0; k < V; ++k) d[k] *= gelu_grad_f<Exact>(u[k]);
    store_f<V>(dx + i, d);
  }
};

template <bool Exact> void gelu_forward_impl(const Tensor& x, const Tensor& out, Stream s, const char* what) {
  DeviceGuard g(x);
  MPT_DISPATCH_DEV_FLOAT(x.dtype(), what, [&](auto tag) {
    using T = decltype(tag);
    const GeluForwardOp<T, Exact> op{static_cast<const T*>(x.data_ptr()), static_cast<T*>(out.data_ptr())};
    launch_map(x.numel(), op, vec_aligned(op.x, sizeof(T)) && vec_aligned(op.out, sizeof(T)), s, what);
  });
}

template <bool Exact>
void gelu_backward_impl(const Tensor& dout, const Tensor& x, const Tensor& dx, Stream s, const char* what) {
  DeviceGuard g(x);
  MPT_DISPATCH_DEV_FLOAT(x.dtype(), what, [&](auto tag) {
    using T = decltype(tag);
    const GeluBackwardOp<T, Exact> op{static_cast<const T*>(dout.data_ptr()), static_cast<const T*>(x.data_ptr()),
                                      static_cast<T*>(dx.data_ptr())};
    launch_map(x.numel(), op,
               vec_aligned(op.dout, sizeof(T)) && vec_aligned(op.x, sizeof(T)) && vec_aligned(op.dx, sizeof(T)), s,
               what);
  });
}
}  // namespace

void gelu_forward(const Tensor& x, const Tensor& out, Stream s) {
  gelu_forward_impl<false>(x, out, s, "gelu_forward");
}
void gelu_backward(const Tensor& dout, const Tensor& x, const Tensor& dx, Stream s) {
  gelu_backward_impl<false>(dout, x, dx, s, "gelu_backward");
}
void gelu_erf_forward(const Tensor& x, const Tensor& out, Stream s) {
  gelu_forward_impl<true>(x, out, s, "gelu_erf_forward");
}
void gelu_erf_backward(const Tensor& dout, const Tensor& x, const Tensor& dx, Stream s) {
  gelu_backward_impl<true>(dout, x, dx, s, "gelu_erf_backward");
}

}  // namespace mpitron::cuda
