// tensor/cpu/layernorm.cpp — layernorm forward and backward, one row per iteration.
#include <cmath>

#include "tensor/cpu/common.h"
#include "tensor/cpu/ops.h"

namespace mpitron::cpu {

void layernorm_forward(const Tensor& x, const Tensor& weight, const Tensor& bias, const Tensor& out,
                       const Tensor& mean, const Tensor& rstd, float eps, Stream) {
  const int64_t c = x.dim(-1), n = c ? x.numel() / c : 0;
  F32In fw(weight), fb(bias);
  float* mp = mean.data<float>();
  float* rp = rstd.data<float>();
  dispatch_float(x.dtype(), "layernorm_forward", [&](auto tag) {
    using T = decltype(tag);
    const T* xp = static_cast<const T*>(x.data_ptr());
    T* op = static_cast<T*>(out.data_ptr());
    const float *w = fw.get(), *b = fb.get();
#pragma omp parallel
    {
      std::vector<float> row(static_cast<size_t>(c));
#pragma omp for schedule(static)
      for (int64_t r = 0; r < n; ++r) {
        const T* xr = xp + r * c;
        float s = 0;
        for (int64_t j = 0; j < c; ++j) s += (row[j] = to_f32(xr[j]));
        const float mu = s / static_cast<float>(c);
        float v = 0;
        for (int64_t j = 0; j < c; ++j) v += (row[j] - mu) * (row[j] - mu);
        const float rs = 1.0f / std::sqrt(v / static_cast<float>(c) + eps);
        T* orow = op + r * c;
        for (int64_t j = 0; j < c; ++j) orow[j] = from_f32<T>((row[j] - mu) * rs * w[j] + b[j]);
        mp[r] = mu;
        rp[r] = rs;
      }
    }
  });
}

void layernorm_backward(const Tensor& dout, const Tensor& x, const Tensor& weight, const Tensor& mean,
                        const Tensor& rstd, const Tensor& dx, const Tensor& dweight, const Tensor& dbias,
                        bool accumulate_dx, Stream) {
  const int64_t c = x.dim(-1), n = c ? x.numel() / c : 0;
  F32In fw(weight);
  const float* mp = mean.data<float>();
  const float* rp = rstd.data<float>();
  const int nt = omp_get_max_threads();
  std::vector<float> pw(static_cast<size_t>(nt) * c, 0.0f), pb(static_cast<size_t>(nt) * c, 0.0f);
  dispatch_float(x.dtype(), "layernorm_backward", [&](auto tag) {
    using T = decltype(tag);
    const T* xp = static_cast<const T*>(x.data_ptr());
    const T* dp = static_cast<const T*>(dout.data_ptr());
    T* dxp = dx.defined() ? static_cast<T*>(dx.data_ptr()) : nullptr;
    const float* w = fw.get();
#pragma omp parallel num_threads(nt)
    {
      float* mw = pw.data() + static_cast<size_t>(omp_get_thread_num()) * c;
      float* mb = pb.data() + static_cast<size_t>(omp_get_thread_num()) * c;
      std::vector<float> xhat(static_cast<size_t>(c)), g(static_cast<size_t>(c));
#pragma omp for schedule(static)
      for (int64_t r = 0; r < n; ++r) {
        const float mu = mp[r], rs = rp[r];
        float sum_g = 0, sum_gx = 0;
        for (int64_t j = 0; j < c; ++j) {
          const float d = to_f32(dp[r * c + j]);
          xhat[j] = (to_f32(xp[r * c + j]) - mu) * rs;
          g[j] = d * w[j];
          sum_g += g[j];
          sum_gx += g[j] * xhat[j];
          mw[j] += d * xhat[j];
          mb[j] += d;
        }
        if (dxp) {
          const float inv_c = 1.0f / static_cast<float>(c);
          T* dr = dxp + r * c;
          for (int64_t j = 0; j < c; ++j) {
            float v = rs * (g[j] - inv_c * sum_g - xhat[j] * inv_c * sum_gx);
            if (accumulate_dx) v += to_f32(dr[j]);
            dr[j] = from_f32<T>(v);
          }
        }
      }
    }
  });
  auto reduce_into = [&](const Tensor& grad, const std::vector<float>& part) {
    if (!grad.defined()) return;
    F32Out o(grad, true);
    for (int64_t j = 0; j < c; ++j) {
      float s = 0;
      for (int t = 0; t < nt; ++t) s += part[static_cast<size_t>(t) * c + j];
      o.get()[j] += s;
    }
    o.commit();
  };
  reduce_into(dweight, pw);
  reduce_into(dbias, pb);
}

}  // namespace mpitron::cpu
