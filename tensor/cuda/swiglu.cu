// tensor/cuda/swiglu.cu — the gated activations SwiGLU and GeGLU, forward and backward.
//   x (N, 2F) = [a | b],  out (N, F) = act(a)·b        act = silu (SwiGLU) or the tanh GELU (GeGLU)
//   dx (N, 2F) = [dout·b·act'(a) | dout·act(a)]   (overwritten; dx may alias x)
// Element-wise on the map.cuh skeleton over the N·F outputs: element i is row i / F,
// column i % F. 16-byte chunks when F is a multiple of 8 (a chunk never crosses a
// row) and the pointers allow it. f32 math; SwiGLU's 1 − σ(a) = e·σ(a), e = exp(−a), for
// a ≥ 0; GeGLU's GELU is tensor/cuda/gelu_math.h (the CPU backend's arithmetic).
#include "tensor/cuda/common.cuh"
#include "tensor/cuda/gelu_math.h"
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

struct Silu {
  __device__ static float act(float a) {
    float sg, om;
    sigmoid_pair(a, sg, om);
    return a * sg;
  }
  // d/da and d/db of act(a)·b times d.
  __device__ static void grads(float d, float a, float b, float& da, float& db) {
    float sg, om;
    sigmoid_pair(a, sg, om);
    da = d * b * sg * (1.0f + a * om);
    db = d * a * sg;
  }
};

struct GeluTanh {
  __device__ static float act(float a) { return gelu_math::gelu(a); }
  __device__ static void grads(float d, float a, float b, float& da, float& db) {
    da = d * b * gelu_math::gelu_grad(a);
    db = d * gelu_math::gelu(a);
  }
};

template <typename T, class Act> struct GluForwardOp {
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
    for (int k = 0; k < V; ++k) u[k] = Act::act(u[k]) * v[k];
    store_f<V>(out + i, u);
  }
};

template <typename T, class Act> struct GluBackwardOp {
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
      float da, db;
      Act::grads(d[k], u[k], v[k], da, db);
      u[k] = da;
      v[k] = db;
    }
    store_f<V>(dx + off, u);
    store_f<V>(dx + off + f, v);
  }
};

template <class Act> void glu_forward(const Tensor& x, const Tensor& out, Stream s, const char* name) {
  DeviceGuard g(x);
  const int64_t f = out.dim(-1);
  MPT_DISPATCH_DEV_FLOAT(x.dtype(), name, [&](auto tag) {
    using T = decltype(tag);
    const GluForwardOp<T, Act> op{static_cast<const T*>(x.data_ptr()), static_cast<T*>(out.data_ptr()), f};
    launch_map(out.numel(), op, f % kMapVec == 0 && vec_aligned(op.x, sizeof(T)) && vec_aligned(op.out, sizeof(T)),
               s, name);
  });
}

template <class Act> void glu_backward(const Tensor& dout, const Tensor& x, const Tensor& dx, Stream s, const char* name) {
  DeviceGuard g(x);
  const int64_t f = dout.dim(-1);
  MPT_DISPATCH_DEV_FLOAT(x.dtype(), name, [&](auto tag) {
    using T = decltype(tag);
    const GluBackwardOp<T, Act> op{static_cast<const T*>(dout.data_ptr()), static_cast<const T*>(x.data_ptr()),
                                   static_cast<T*>(dx.data_ptr()), f};
    launch_map(dout.numel(), op,
               f % kMapVec == 0 && vec_aligned(op.dout, sizeof(T)) && vec_aligned(op.x, sizeof(T)) &&
                   vec_aligned(op.dx, sizeof(T)),
               s, name);
  });
}
}  // namespace

void swiglu_forward(const Tensor& x, const Tensor& out, Stream s) { glu_forward<Silu>(x, out, s, "swiglu_forward"); }
void swiglu_backward(const Tensor& dout, const Tensor& x, const Tensor& dx, Stream s) {
  glu_backward<Silu>(dout, x, dx, s, "swiglu_backward");
}
void geglu_forward(const Tensor& x, const Tensor& out, Stream s) { glu_forward<GeluTanh>(x, out, s, "geglu_forward"); }
void geglu_backward(const Tensor& dout, const Tensor& x, const Tensor& dx, Stream s) {
  glu_backward<GeluTanh>(dout, x, dx, s, "geglu_backward");
}

}  // namespace mpitron::cuda
