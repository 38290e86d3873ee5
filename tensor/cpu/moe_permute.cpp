// tensor/cpu/moe_permute.cpp — MoE token permutation (tensor/moe_permute.h).
//   permute:   out[dest[n·k + j]] = x[n]
//   backward:  dx[n] = Σ_j dout[dest[n·k + j]]                       (j in order, f32)
//   unpermute: y[n]  = Σ_j probs[n, j] · in[dest[n·k + j]]             (j in order, f32)
//   backward:  din[dest[n·k + j]] = probs[n, j] · dy[n];  dprobs[n, j] = ⟨dy[n], in[dest[n·k + j]]⟩
// Parallel over tokens (every output row is written by one iteration).
#include <algorithm>

#include "tensor/cpu/common.h"
#include "tensor/cpu/ops.h"

namespace mpitron::cpu {

namespace {
// The row of (n, j), or −1 when dropped or outside [0, rows).
inline int64_t row_of(const int32_t* dest, int64_t i, int64_t rows) {
  const int64_t r = dest[i];
  return r >= 0 && r < rows ? r : -1;
}
}  // namespace

void moe_permute(const Tensor& x, const Tensor& dest, const Tensor& out, Stream) {
  const int64_t N = x.dim(0), C = x.dim(1), R = out.dim(0), k = N ? dest.numel() / N : 1;
  const int32_t* d = dest.data<int32_t>();
  dispatch_float(x.dtype(), "moe_permute", [&](auto tag) {
    using T = decltype(tag);
    const T* px = static_cast<const T*>(x.data_ptr());
    T* po = static_cast<T*>(out.data_ptr());
#pragma omp parallel for schedule(static) if (N * C > 65536)
    for (int64_t n = 0; n < N; ++n)
      for (int64_t j = 0; j < k; ++j) {
        const int64_t r = row_of(d, n * k + j, R);
        if (r >= 0) std::copy(px + n * C, px + (n + 1) * C, po + r * C);
      }
  });
}

namespace {
// y[n] = Σ_j w_j · rows[dest[n·k + j]], w_j = probs[n·k + j] (1 without probs): the permute
// backward (rows = dout) and the unpermute (rows = the experts' outputs).
void gather_sum(const Tensor& rows, const Tensor& dest, const float* probs, const Tensor& y, const char* what) {
  const int64_t N = y.dim(0), C = y.dim(1), R = rows.dim(0), k = N ? dest.numel() / N : 1;
  const int32_t* d = dest.data<int32_t>();
  dispatch_float(y.dtype(), what, [&](auto tag) {
    using T = decltype(tag);
    const T* pr = static_cast<const T*>(rows.data_ptr());
    T* py = static_cast<T*>(y.data_ptr());
#pragma omp parallel for schedule(static) if (N * C > 65536)
    for (int64_t n = 0; n < N; ++n) {
      std::vector<float> acc(static_cast<size_t>(C), 0.0f);
      for (int64_t j = 0; j < k; ++j) {
        const int64_t r = row_of(d, n * k + j, R);
        if (r < 0) continue;
        const float w = probs ? probs[n * k + j] : 1.0f;
        for (int64_t c = 0; c < C; ++c) acc[static_cast<size_t>(c)] += w * to_f32(pr[r * C + c]);
      }
      for (int64_t c = 0; c < C; ++c) py[n * C + c] = from_f32<T>(acc[static_cast<size_t>(c)]);
    }
  });
}
}  // namespace

void moe_permute_backward(const Tensor& dout, const Tensor& dest, const Tensor& dx, Stream) {
  gather_sum(dout, dest, nullptr, dx, "moe_permute_backward");
}

void moe_unpermute(const Tensor& in, const Tensor& dest, const Tensor& probs, const Tensor& y, Stream) {
  gather_sum(in, dest, probs.data<float>(), y, "moe_unpermute");
}

void moe_unpermute_backward(const Tensor& dy, const Tensor& in, const Tensor& dest, const Tensor& probs,
                            const Tensor& din, const Tensor& dprobs, Stream) {
  const int64_t N = dy.dim(0), C = dy.dim(1), R = in.dim(0), k = N ? dest.numel() / N : 1;
  const int32_t* d = dest.data<int32_t>();
  const float* p = probs.data<float>();
  float* dp = dprobs.data<float>();
  dispatch_float(dy.dtype(), "moe_unpermute_backward", [&](auto tag) {
    using T = decltype(tag);
    const T* pdy = static_cast<const T*>(dy.data_ptr());
    const T* pi = static_cast<const T*>(in.data_ptr());
    T* pdi = static_cast<T*>(din.data_ptr());
#pragma omp parallel for schedule(static) if (N * C > 65536)
    for (int64_t n = 0; n < N; ++n)
      for (int64_t j = 0; j < k; ++j) {
        const int64_t r = row_of(d, n * k + j, R);
        float dot = 0.0f;
        if (r >= 0) {
          const float w = p[n * k + j];
          for (int64_t c = 0; c < C; ++c) {
            const float g = to_f32(pdy[n * C + c]);
            pdi[r * C + c] = from_f32<T>(w * g);
            dot += g * to_f32(pi[r * C + c]);
          }
        }
        dp[n * k + j] = dot;
      }
  });
}

}  // namespace mpitron::cpu
