// tensor/cuda/elementwise.cu — residual add (fwd/bwd), cast, axpby, scale, and
// the tensor.h support ops copy_strided and fill.
// All math in f32; 16-bit results rounded to nearest even. Contiguous tensors
// of n elements unless stated (copy_strided takes any strides, up to 8 dims).
#include "tensor/cuda/common.cuh"
#include "tensor/cuda/map.cuh"
#include "tensor/cuda/ops.h"

namespace mpitron::cuda {

namespace {

// out (n) = a + b
template <typename T> struct AddOp {
  const T* a;
  const T* b;
  T* out;
  template <int V> __device__ void apply(int64_t i) const {
    float x[V], y[V];
    load_f<V>(a + i, x);
    load_f<V>(b + i, y);
#pragma unroll
    for (int k = 0; k < V; ++k) x[k] += y[k];
    store_f<V>(out + i, x);
  }
};

// y (n) = alpha · x + beta · y   (beta == 0: y is not read). x and y may differ in dtype.
template <typename X, typename Y> struct AxpbyOp {
  const X* x;
  Y* y;
  float alpha, beta;
  template <int V> __device__ void apply(int64_t i) const {
    float u[V], w[V];
    load_f<V>(x + i, u);
    if (beta != 0.0f) {
      load_f<V>(y + i, w);
#pragma unroll
      for (int k = 0; k < V; ++k) w[k] = alpha * u[k] + beta * w[k];
    } else {
#pragma unroll
      for (int k = 0; k < V; ++k) w[k] = alpha * u[k];
    }
    store_f<V>(y + i, w);
  }
};

// dst (n) = src converted
template <typename S, typename D> struct CastOp {
  const S* src;
  D* dst;
  template <int V> __device__ void apply(int64_t i) const {
    float u[V];
    load_f<V>(src + i, u);
    store_f<V>(dst + i, u);
  }
};

template <typename X, typename Y> void axpby_impl(float alpha, const X* x, float beta, Y* y, int64_t n, Stream s) {
  launch_map(n, AxpbyOp<X, Y>{x, y, alpha, beta}, vec_aligned(x, sizeof(X)) && vec_aligned(y, sizeof(Y)), s,
             "axpby");
}

}  // namespace

// out = a + b (out may alias a or b: each element is read before it is written, by one thread)
void add_forward(const Tensor& a, const Tensor& b, const Tensor& out, Stream s) {
  DeviceGuard g(a);
  MPT_DISPATCH_DEV_FLOAT(a.dtype(), "add_forward", [&](auto tag) {
    using T = decltype(tag);
    const AddOp<T> op{static_cast<const T*>(a.data_ptr()), static_cast<const T*>(b.data_ptr()),
                      static_cast<T*>(out.data_ptr())};
    launch_map(a.numel(), op,
               vec_aligned(op.a, sizeof(T)) && vec_aligned(op.b, sizeof(T)) && vec_aligned(op.out, sizeof(T)), s,
               "add_forward");
  });
}

// da, db (n) = dout, or += dout when accumulate; undefined ones are skipped.
void add_backward(const Tensor& dout, const Tensor& da, const Tensor& db, bool accumulate, Stream s) {
  DeviceGuard g(dout);
  for (const Tensor* d : {&da, &db}) {
    if (!d->defined() || d->data_ptr() == dout.data_ptr()) {
      // Aliasing dout itself: "= dout" is a no-op, "+= dout" doubles it.
      if (d->defined() && accumulate) cuda::scale(*d, 2.0f, s);
      continue;
    }
    if (!accumulate) {
      MPT_CUDA_CHECK(cudaMemcpyAsync(d->data_ptr(), dout.data_ptr(), dout.nbytes(), cudaMemcpyDeviceToDevice,
                                     stream_of(s)));
      continue;
    }
    MPT_DISPATCH_DEV_FLOAT(dout.dtype(), "add_backward", [&](auto tag) {
      using T = decltype(tag);
      axpby_impl(1.0f, static_cast<const T*>(dout.data_ptr()), 1.0f, static_cast<T*>(d->data_ptr()), dout.numel(),
                 s);
    });
  }
}

// dst = src in dst's dtype
void cast(const Tensor& src, const Tensor& dst, Stream s) {
  DeviceGuard g(src);
  if (src.dtype() == dst.dtype()) {
    if (src.data_ptr() != dst.data_ptr())
      MPT_CUDA_CHECK(cudaMemcpyAsync(dst.data_ptr(), src.data_ptr(), src.nbytes(), cudaMemcpyDeviceToDevice,
                                     stream_of(s)));
    return;
  }
  MPT_DISPATCH_DEV_FLOAT(src.dtype(), "cast", [&](auto stag) {
    using S = decltype(stag);
    MPT_DISPATCH_DEV_FLOAT(dst.dtype(), "cast", [&](auto dtag) {
      using D = decltype(dtag);
      const CastOp<S, D> op{static_cast<const S*>(src.data_ptr()), static_cast<D*>(dst.data_ptr())};
      launch_map(src.numel(), op, vec_aligned(op.src, sizeof(S)) && vec_aligned(op.dst, sizeof(D)), s, "cast");
    });
  });
}

// y = alpha · x + beta · y
void axpby(float alpha, const Tensor& x, float beta, const Tensor& y, Stream s) {
  DeviceGuard g(x);
  MPT_DISPATCH_DEV_FLOAT(x.dtype(), "axpby", [&](auto xtag) {
    using X = decltype(xtag);
    MPT_DISPATCH_DEV_FLOAT(y.dtype(), "axpby", [&](auto ytag) {
      using Y = decltype(ytag);
      axpby_impl(alpha, static_cast<const X*>(x.data_ptr()), beta, static_cast<Y*>(y.data_ptr()), x.numel(), s);
    });
  });
}

// x *= alpha  (y = alpha·x with y = x; beta = 0 so nothing is read twice)
void scale(const Tensor& x, float alpha, Stream s) {
  DeviceGuard g(x);
  MPT_DISPATCH_DEV_FLOAT(x.dtype(), "scale", [&](auto tag) {
    using T = decltype(tag);
    axpby_impl(alpha, static_cast<const T*>(x.data_ptr()), 0.0f, static_cast<T*>(x.data_ptr()), x.numel(), s);
  });
}

// ---- copy_strided ---------------------------------------------------------------------
namespace {

constexpr int kMaxDims = 8;
struct StridedDims {
  int ndim;
  int64_t shape[kMaxDims];
  int64_t src_stride[kMaxDims];
  int64_t dst_stride[kMaxDims];
};

// One element per thread iteration: linear index → coordinates (innermost fastest)
// → an offset in each tensor. E is a raw element of the right size.
template <typename E> __global__ void copy_strided_kernel(const E* src, E* dst, int64_t n, StridedDims d) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    int64_t rem = i, so = 0, doff = 0;
#pragma unroll
    for (int k = kMaxDims - 1; k >= 0; --k) {
      if (k >= d.ndim) continue;
      const int64_t c = rem % d.shape[k];
      rem /= d.shape[k];
      so += c * d.src_stride[k];
      doff += c * d.dst_stride[k];
    }
    dst[doff] = src[so];
  }
}

}  // namespace

// dst = src, same shape and dtype, any strides (views), same device.
void copy_strided(const Tensor& src, const Tensor& dst, Stream s) {
  DeviceGuard g(src);
  const int64_t n = src.numel();
  if (n == 0) return;
  if (src.is_contiguous() && dst.is_contiguous()) {
    if (src.data_ptr() != dst.data_ptr())
      MPT_CUDA_CHECK(cudaMemcpyAsync(dst.data_ptr(), src.data_ptr(), src.nbytes(), cudaMemcpyDeviceToDevice,
                                     stream_of(s)));
    return;
  }
  // Drop size-1 dims and merge dims that are contiguous in both tensors, so the
  // kernel does as few divisions as possible (and > 8 raw dims may still fit).
  std::vector<int64_t> sh, ss, ds;
  for (int k = 0; k < src.ndim(); ++k) {
    if (src.shape()[k] == 1) continue;
    const int64_t size = src.shape()[k], s1 = src.strides()[k], d1 = dst.strides()[k];
    if (!sh.empty() && ss.back() == s1 * size && ds.back() == d1 * size) {
      sh.back() *= size;
      ss.back() = s1;
      ds.back() = d1;
    } else {
      sh.push_back(size);
      ss.push_back(s1);
      ds.push_back(d1);
    }
  }
  if (sh.empty()) {  // a single element
    sh = {1};
    ss = {1};
    ds = {1};
  }
  MPT_CHECK(sh.size() <= static_cast<size_t>(kMaxDims),
            str("copy_strided: ", sh.size(), " non-mergeable dims (at most ", kMaxDims, ") in ", src.describe()),
            "make the source contiguous first");
  StridedDims d{};
  d.ndim = static_cast<int>(sh.size());
  for (int k = 0; k < d.ndim; ++k) {
    d.shape[k] = sh[k];
    d.src_stride[k] = ss[k];
    d.dst_stride[k] = ds[k];
  }
  const cudaStream_t st = stream_of(s);
  const int grid = grid_for(n, 256, 16);
  switch (dtype_size(src.dtype())) {
    case 2:
      MPT_LAUNCH(grid, 256, 0, st, copy_strided_kernel)(static_cast<const uint16_t*>(src.data_ptr()),
                                                static_cast<uint16_t*>(dst.data_ptr()), n, d);
      break;
    case 4:
      MPT_LAUNCH(grid, 256, 0, st, copy_strided_kernel)(static_cast<const uint32_t*>(src.data_ptr()),
                                                static_cast<uint32_t*>(dst.data_ptr()), n, d);
      break;
    case 8:
      MPT_LAUNCH(grid, 256, 0, st, copy_strided_kernel)(static_cast<const uint64_t*>(src.data_ptr()),
                                                static_cast<uint64_t*>(dst.data_ptr()), n, d);
      break;
    default: MPT_THROW(str("copy_strided: unsupported element size for ", src.describe()), "");
  }
  MPT_KERNEL_CHECK("copy_strided");
}

// ---- fill ---------------------------------------------------------------------------------
namespace {
template <typename E> __global__ void fill_kernel(E* p, int64_t n, E v) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    p[i] = v;
}
}  // namespace

// t (contiguous, any dtype) = value converted to t's dtype (as the CPU backend converts it).
void fill(const Tensor& t, double value, Stream s) {
  DeviceGuard g(t);
  const int64_t n = t.numel();
  if (n == 0) return;
  uint64_t bits = 0;  // the element's bit pattern
  switch (t.dtype()) {
    case DType::F32: {
      const float f = static_cast<float>(value);
      uint32_t u;
      std::memcpy(&u, &f, 4);
      bits = u;
      break;
    }
    case DType::BF16: bits = f32_to_bf16(static_cast<float>(value)).bits; break;
    case DType::F16: bits = f32_to_f16(static_cast<float>(value)).bits; break;
    case DType::I32: bits = static_cast<uint32_t>(static_cast<int32_t>(value)); break;
    case DType::I64: bits = static_cast<uint64_t>(static_cast<int64_t>(value)); break;
    case DType::U16: bits = static_cast<uint16_t>(value); break;
  }
  const cudaStream_t st = stream_of(s);
  if (bits == 0) {
    MPT_CUDA_CHECK(cudaMemsetAsync(t.data_ptr(), 0, t.nbytes(), st));
    return;
  }
  const int grid = grid_for(n, 256, 16);
  switch (dtype_size(t.dtype())) {
    case 2:
      MPT_LAUNCH(grid, 256, 0, st, fill_kernel)(static_cast<uint16_t*>(t.data_ptr()), n, static_cast<uint16_t>(bits));
      break;
    case 4:
      MPT_LAUNCH(grid, 256, 0, st, fill_kernel)(static_cast<uint32_t*>(t.data_ptr()), n, static_cast<uint32_t>(bits));
      break;
    default: MPT_LAUNCH(grid, 256, 0, st, fill_kernel)(static_cast<uint64_t*>(t.data_ptr()), n, bits); break;
  }
  MPT_KERNEL_CHECK("fill");
}

}  // namespace mpitron::cuda
