// tensor/cpu/head_norm.cpp — RMS normalisation of head views in two phases (head_norm.h).
//
// An (N, H, D) view with packed heads holds each row's H·D values contiguously at
// p + n·stride(0); its G groups (H per head, 1 whole row) are the runs of L = H·D/G values
// at + g·L, and the weight index of a value is its offset e < L in its group. Rows run
// OpenMP-parallel; sums are f32 in element order. dweight: per-thread partials summed in
// thread order (deterministic for a thread count), each element's contribution read before
// dx overwrites it (dx may alias dout).
#include <cmath>

#include "tensor/cpu/common.h"
#include "tensor/cpu/ops.h"

namespace mpitron::cpu {

namespace {
// The groups of x under the statistic stat (N, G).
struct Groups {
  int64_t N, G, L;
};
Groups groups_of(const Tensor& x, const Tensor& stat) {
  const int64_t G = stat.dim(1);
  return {x.dim(0), G, x.dim(1) * x.dim(2) / G};
}
// Element e of group g of row n of an (N, H, D) view.
template <typename T>
struct Rows {
  T* p;
  int64_t s0;
  T* at(int64_t n, int64_t g, int64_t L) const { return p + n * s0 + g * L; }
};
template <typename T>
Rows<T> rows(const Tensor& t) {
  return {static_cast<T*>(t.data_ptr()), t.strides()[0]};
}
}  // namespace

void head_norm_sumsq(const Tensor& x, const Tensor& ss, Stream) {
  const Groups gr = groups_of(x, ss);
  float* sp = ss.data<float>();
  dispatch_float(x.dtype(), "head_norm_sumsq", [&](auto tag) {
    using T = decltype(tag);
    const Rows<const T> xr = rows<const T>(x);
#pragma omp parallel for schedule(static) if (gr.N * gr.G * gr.L > 16384)
    for (int64_t n = 0; n < gr.N; ++n)
      for (int64_t g = 0; g < gr.G; ++g) {
        const T* v = xr.at(n, g, gr.L);
        float acc = 0;
        for (int64_t e = 0; e < gr.L; ++e) acc += to_f32(v[e]) * to_f32(v[e]);
        sp[n * gr.G + g] = acc;
      }
  });
}

void head_norm_forward(const Tensor& x, const Tensor& ss, int64_t count, float eps, const Tensor& weight,
                       const Tensor& out, const Tensor& rstd, Stream) {
  const Groups gr = groups_of(x, ss);
  const float* sp = ss.data<float>();
  float* rp = rstd.data<float>();
  const float inv_count = 1.0f / static_cast<float>(count);
  F32In fw(weight);
  dispatch_float(x.dtype(), "head_norm_forward", [&](auto tag) {
    using T = decltype(tag);
    const Rows<const T> xr = rows<const T>(x);
    const Rows<T> orow = rows<T>(out);
    const float* w = fw.get();
#pragma omp parallel for schedule(static) if (gr.N * gr.G * gr.L > 16384)
    for (int64_t n = 0; n < gr.N; ++n)
      for (int64_t g = 0; g < gr.G; ++g) {
        const float r = 1.0f / std::sqrt(sp[n * gr.G + g] * inv_count + eps);
        const T* v = xr.at(n, g, gr.L);
        T* o = orow.at(n, g, gr.L);  // may be v (in place): element e is read before it is written
        for (int64_t e = 0; e < gr.L; ++e) o[e] = from_f32<T>(to_f32(v[e]) * r * w[e]);
        rp[n * gr.G + g] = r;
      }
  });
}

void head_norm_backward_dot(const Tensor& dout, const Tensor& x, const Tensor& weight, const Tensor& rstd,
                            const Tensor& dot, Stream) {
  const Groups gr = groups_of(x, rstd);
  const float* rp = rstd.data<float>();
  float* dp = dot.data<float>();
  F32In fw(weight);
  dispatch_float(x.dtype(), "head_norm_backward_dot", [&](auto tag) {
    using T = decltype(tag);
    const Rows<const T> xr = rows<const T>(x), dr = rows<const T>(dout);
    const float* w = fw.get();
#pragma omp parallel for schedule(static) if (gr.N * gr.G * gr.L > 16384)
    for (int64_t n = 0; n < gr.N; ++n)
      for (int64_t g = 0; g < gr.G; ++g) {
        const float r = rp[n * gr.G + g];
        const T* v = xr.at(n, g, gr.L);
        const T* d = dr.at(n, g, gr.L);
        float acc = 0;
        for (int64_t e = 0; e < gr.L; ++e) acc += to_f32(d[e]) * w[e] * (to_f32(v[e]) * r);
        dp[n * gr.G + g] = acc;
      }
  });
}

void head_norm_backward(const Tensor& dout, const Tensor& x, const Tensor& weight, const Tensor& rstd,
                        const Tensor& dot, int64_t count, const Tensor& dx, const Tensor& dweight, Stream) {
  const Groups gr = groups_of(x, rstd);
  const float* rp = rstd.data<float>();
  const float* dotp = dot.data<float>();
  const float inv_count = 1.0f / static_cast<float>(count);
  F32In fw(weight);
  const int nt = omp_get_max_threads();
  std::vector<float> pw(dweight.defined() ? static_cast<size_t>(nt * gr.L) : 0, 0.0f);
  dispatch_float(x.dtype(), "head_norm_backward", [&](auto tag) {
    using T = decltype(tag);
    const Rows<const T> xr = rows<const T>(x), dr = rows<const T>(dout);
    const Rows<T> gxr = dx.defined() ? rows<T>(dx) : Rows<T>{nullptr, 0};
    const float* w = fw.get();
#pragma omp parallel num_threads(nt)
    {
      float* mw = pw.empty() ? nullptr : pw.data() + static_cast<size_t>(omp_get_thread_num()) * gr.L;
#pragma omp for schedule(static)
      for (int64_t n = 0; n < gr.N; ++n)
        for (int64_t g = 0; g < gr.G; ++g) {
          const float r = rp[n * gr.G + g], c = dotp[n * gr.G + g] * inv_count;
          const T* v = xr.at(n, g, gr.L);
          const T* d = dr.at(n, g, gr.L);
          T* o = gxr.p ? gxr.at(n, g, gr.L) : nullptr;  // may be d: element e is read before it is written
          for (int64_t e = 0; e < gr.L; ++e) {
            const float de = to_f32(d[e]), xh = to_f32(v[e]) * r;
            if (mw) mw[e] += de * xh;
            if (o) o[e] = from_f32<T>(r * (de * w[e] - xh * c));
          }
        }
    }
  });
  if (!dweight.defined()) return;
  F32Out o(dweight, true);
  for (int64_t e = 0; e < gr.L; ++e) {
    float acc = 0;
    for (int t = 0; t < nt; ++t) acc += pw[static_cast<size_t>(t * gr.L + e)];
    o.get()[e] += acc;
  }
  o.commit();
}

}  // namespace mpitron::cpu
