// tensor/cuda/swiglu.cu — SwiGLU, forward and backward.
//   x (N, 2F) = [a | b],  out (N, F) = silu(a)·b
//   dx (N, 2F) = [dout·b·silu'(a) | dout·silu(a)]   (overwritten; dx may alias x)
// Element-wise on the map.cuh skeleton over the N·F outputs: element i is row i / F,
// column i % F. 16-byte chunks when F is a multiple of 8 (a chunk never crosses a
// row) and the pointers allow it. f32 math; 1 − σ(a) = e·σ(a), e = exp(−a), for a ≥ 0.
#include "tensor/cuda/common.cuh"
#include "tensor/cuda/map.cuh"
#include "tensor/cuda/ops.h"

namespace mpitron::cuda {

namespace {
// σ(a) and 1 − σ(a) without cancellation; exp(−a) = inf for very negative a gives σ = 0, 1 − σ = 1.
__device__ __forceinline__ void sigmoid_pair(float a, float& sg, float& one_minus) {
  const float e = expf(-a);
  sg = 1.0f / (1.0f + e);
  one_minus = a >= 0.0f ? e * sg : 1.0f - sg;
}

template <typename T> struct SwigluForwardOp {
  const T* x;
  T* out;
  int64_t f;
  template <int V> __device__ void apply(int64_t i) const {
    const int64_t r = i / f, j = i - r * f;
    const T* a = x + r * 2 * f + j;
    float u[V], v[V];
    load_f<V>(a, u);
    load_f<V>(a + f, v);
#pragma unroll
    for (int k = 0; k < V; ++k) {
      float sg, om;
      sigmoid_pair(u[k], sg, om);
      u[k] = u[k] * sg * v[k];
    }
    store_f<V>(out + i, u);
  }
};

template <typename T> struct SwigluBackwardOp {
  const T* dout;
  const T* x;
  T* dx;
  int64_t f;
  template <int V> __device__ void apply(int64_t i) const {
    const int64_t r = i / f, j = i - r * f, off = r * 2 * f + j;
    float u[V], v[V], d[V];
    load_f<V>(x + off, u);
    load_f<V>(x + off + f, v);
    load_f<V>(dout + i, d);
#pragma unroll
    for (int k = 0; k < V; ++k) {
      float sg, om;
      sigmoid_pair(u[k], sg, om);
      const float a = u[k];
      u[k] = d[k] * v[k] * sg * (1.0f + a * om);  // d/da
      v[k] = d[k] * a * sg;                       // d/db
    }
    store_f<V>(dx + off, u);
    store_f<V>(dx + off + f, v);
  }
};
}  // namespace

void swiglu_forward(const Tensor& x, const Tensor& out, Stream s) {
  DeviceGuard g(x);
  const int64_t f = out.dim(-1);
  MPT_DISPATCH_DEV_FLOAT(x.dtype(), "swiglu_forward", [&](auto tag) {
    using T = decltype(tag);
    const SwigluForwardOp<T> op{static_cast<const T*>(x.data_ptr()), static_cast<T*>(out.data_ptr()), f};
    launch_map(out.numel(), op, f % kMapVec == 0 && vec_aligned(op.x, sizeof(T)) && vec_aligned(op.out, sizeof(T)),
               s, "swiglu_forward");
  });
}

void swiglu_backward(const Tensor& dout, const Tensor& x, const Tensor& dx, Stream s) {
  DeviceGuard g(x);
  const int64_t f = dout.dim(-1);
  MPT_DISPATCH_DEV_FLOAT(x.dtype(), "swiglu_backward", [&](auto tag) {
    using T = decltype(tag);
    const SwigluBackwardOp<T> op{static_cast<const T*>(dout.data_ptr()), static_cast<const T*>(x.data_ptr()),
                                 static_cast<T*>(dx.data_ptr()), f};
    launch_map(dout.numel(), op,
               f % kMapVec == 0 && vec_aligned(op.dout, sizeof(T)) && vec_aligned(op.x, sizeof(T)) &&
                   vec_aligned(op.dx, sizeof(T)),
               s, "swiglu_backward");
  });
}

}  // namespace mpitron::cuda
