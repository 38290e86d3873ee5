// tensor/cpu/elementwise.cpp — add (residual), its backward, cast, axpby, scale.
#include "tensor/cpu/common.h"
#include "tensor/cpu/ops.h"

namespace mpitron::cpu {

void add_forward(const Tensor& a, const Tensor& b, const Tensor& out, Stream) {
  const int64_t n = a.numel();
  dispatch_float(a.dtype(), "add_forward", [&](auto tag) {
    using T = decltype(tag);
    const T* x = static_cast<const T*>(a.data_ptr());
    const T* y = static_cast<const T*>(b.data_ptr());
    T* o = static_cast<T*>(out.data_ptr());
#pragma omp parallel for schedule(static) if (n > 65536)
    for (int64_t i = 0; i < n; ++i) o[i] = from_f32<T>(to_f32(x[i]) + to_f32(y[i]));
  });
}

void add_backward(const Tensor& dout, const Tensor& da, const Tensor& db, bool accumulate, Stream s) {
  for (const Tensor* g : {&da, &db}) {
    if (!g->defined() || (g->shares_storage(dout) && g->offset() == dout.offset())) {
      if (g->defined() && accumulate) cpu::axpby(1.0f, dout, 1.0f, *g, s);  // g += g
      continue;
    }
    cpu::axpby(1.0f, dout, accumulate ? 1.0f : 0.0f, *g, s);
  }
}

void cast(const Tensor& src, const Tensor& dst, Stream) {
  const int64_t n = src.numel();
  dispatch_float(src.dtype(), "cast", [&](auto stag) {
    using S = decltype(stag);
    dispatch_float(dst.dtype(), "cast", [&](auto dtag) {
      using D = decltype(dtag);
      const S* x = static_cast<const S*>(src.data_ptr());
      D* y = static_cast<D*>(dst.data_ptr());
#pragma omp parallel for schedule(static) if (n > 65536)
      for (int64_t i = 0; i < n; ++i) y[i] = from_f32<D>(to_f32(x[i]));
    });
  });
}

void axpby(float alpha, const Tensor& x, float beta, const Tensor& y, Stream) {
  const int64_t n = x.numel();
  dispatch_float(x.dtype(), "axpby", [&](auto xtag) {
    using X = decltype(xtag);
    dispatch_float(y.dtype(), "axpby", [&](auto ytag) {
      using Y = decltype(ytag);
      const X* xp = static_cast<const X*>(x.data_ptr());
      Y* yp = static_cast<Y*>(y.data_ptr());
      if (beta == 0.0f) {
#pragma omp parallel for schedule(static) if (n > 65536)
        for (int64_t i = 0; i < n; ++i) yp[i] = from_f32<Y>(alpha * to_f32(xp[i]));
      } else {
#pragma omp parallel for schedule(static) if (n > 65536)
        for (int64_t i = 0; i < n; ++i) yp[i] = from_f32<Y>(alpha * to_f32(xp[i]) + beta * to_f32(yp[i]));
      }
    });
  });
}

void scale(const Tensor& x, float alpha, Stream) {
  const int64_t n = x.numel();
  dispatch_float(x.dtype(), "scale", [&](auto tag) {
    using T = decltype(tag);
    T* p = static_cast<T*>(x.data_ptr());
#pragma omp parallel for schedule(static) if (n > 65536)
    for (int64_t i = 0; i < n; ++i) p[i] = from_f32<T>(alpha * to_f32(p[i]));
  });
}

}  // namespace mpitron::cpu
