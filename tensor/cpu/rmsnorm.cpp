// tensor/cpu/rmsnorm.cpp — RMSNorm forward and backward, one row per iteration.
#include <cmath>

#include "tensor/cpu/common.h"
#include "tensor/cpu/ops.h"

namespace mpitron::cpu {

void rmsnorm_forward(const Tensor& x, const Tensor& weight, const Tensor& out, const Tensor& rstd, float eps,
                     Stream) {
  const int64_t c = x.dim(-1), n = c ? x.numel() / c : 0;
  F32In fw(weight);
  float* rp = rstd.data<float>();
  dispatch_float(x.dtype(), "rmsnorm_forward", [&](auto tag) {
    using T = decltype(tag);
    const T* xp = static_cast<const T*>(x.data_ptr());
    T* op = static_cast<T*>(out.data_ptr());
    const float* w = fw.get();
#pragma omp parallel
    {
      std::vector<float> row(static_cast<size_t>(c));
#pragma omp for schedule(static)
      for (int64_t r = 0; r < n; ++r) {
        const T* xr = xp + r * c;
        float ss = 0;
        for (int64_t j = 0; j < c; ++j) {
          row[j] = to_f32(xr[j]);
          ss += row[j] * row[j];
        }
        const float rs = 1.0f / std::sqrt(ss / static_cast<float>(c) + eps);
        T* orow = op + r * c;
        for (int64_t j = 0; j < c; ++j) orow[j] = from_f32<T>(row[j] * rs * w[j]);
        rp[r] = rs;
      }
    }
  });
}

void rmsnorm_backward(const Tensor& dout, const Tensor& x, const Tensor& weight, const Tensor& rstd,
                      const Tensor& dx, const Tensor& dweight, bool accumulate_dx, Stream) {
  const int64_t c = x.dim(-1), n = c ? x.numel() / c : 0;
  F32In fw(weight);
  const float* rp = rstd.data<float>();
  const int nt = omp_get_max_threads();
  // Per-thread dweight partials, summed in thread order below (deterministic for a thread count).
  std::vector<float> pw(dweight.defined() ? static_cast<size_t>(nt) * c : 0, 0.0f);
  dispatch_float(x.dtype(), "rmsnorm_backward", [&](auto tag) {
    using T = decltype(tag);
    const T* xp = static_cast<const T*>(x.data_ptr());
    const T* dp = static_cast<const T*>(dout.data_ptr());
    T* dxp = dx.defined() ? static_cast<T*>(dx.data_ptr()) : nullptr;
    const float* w = fw.get();
#pragma omp parallel num_threads(nt)
    {
      float* mw = pw.empty() ? nullptr : pw.data() + static_cast<size_t>(omp_get_thread_num()) * c;
      std::vector<float> xhat(static_cast<size_t>(c)), g(static_cast<size_t>(c));
#pragma omp for schedule(static)
      for (int64_t r = 0; r < n; ++r) {
        const float rs = rp[r];
        float sum_gx = 0;
        for (int64_t j = 0; j < c; ++j) {
          const float d = to_f32(dp[r * c + j]);
          xhat[j] = to_f32(xp[r * c + j]) * rs;
          g[j] = d * w[j];
          sum_gx += g[j] * xhat[j];
          if (mw) mw[j] += d * xhat[j];
        }
        if (dxp) {
          const float mean_gx = sum_gx / static_cast<float>(c);
          T* dr = dxp + r * c;
          for (int64_t j = 0; j < c; ++j) {
            float v = rs * (g[j] - xhat[j] * mean_gx);
            if (accumulate_dx) v += to_f32(dr[j]);
            dr[j] = from_f32<T>(v);
          }
        }
      }
    }
  });
  if (!dweight.defined()) return;
  F32Out o(dweight, true);
  for (int64_t j = 0; j < c; ++j) {
    float s = 0;
    for (int t = 0; t < nt; ++t) s += pw[static_cast<size_t>(t) * c + j];
    o.get()[j] += s;
  }
  o.commit();
}

}  // namespace mpitron::cpu
