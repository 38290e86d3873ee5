// tensor/cpu/attention.cpp — causal scaled-dot-product attention (the reference path).
//
// qkv (B, T, 3, NH, HD), out (B, T, NH, HD), lse (B, NH, T). Forward walks one
// query row at a time with a numerically safe softmax; backward recomputes the
// probabilities from lse (as flash attention does) instead of storing them.
#include <cmath>

#include "tensor/cpu/common.h"
#include "tensor/cpu/ops.h"

namespace mpitron::cpu {

void attention_forward(const Tensor& qkv, const Tensor& out, const Tensor& lse, float scale, Stream) {
  const int64_t B = qkv.dim(0), T = qkv.dim(1), NH = qkv.dim(3), HD = qkv.dim(4), C = NH * HD;
  F32In fin(qkv);
  F32Out fout(out, false);
  const float* x = fin.get();
  float* o = fout.get();
  float* l = lse.data<float>();
  const int64_t rows = B * NH * T;
#pragma omp parallel
  {
    std::vector<float> p(static_cast<size_t>(T)), acc(static_cast<size_t>(HD));
#pragma omp for schedule(dynamic, 8)
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t b = r / (NH * T), h = (r / T) % NH, i = r % T;
      const float* q = x + (b * T + i) * 3 * C + h * HD;
      float mx = -INFINITY;
      for (int64_t j = 0; j <= i; ++j) {
        const float* k = x + (b * T + j) * 3 * C + C + h * HD;
        float s = 0;
        for (int64_t d = 0; d < HD; ++d) s += q[d] * k[d];
        p[j] = s * scale;
        mx = std::max(mx, p[j]);
      }
      float sum = 0;
      for (int64_t j = 0; j <= i; ++j) sum += (p[j] = std::exp(p[j] - mx));
      std::fill(acc.begin(), acc.end(), 0.0f);
      for (int64_t j = 0; j <= i; ++j) {
        const float* v = x + (b * T + j) * 3 * C + 2 * C + h * HD;
        for (int64_t d = 0; d < HD; ++d) acc[d] += p[j] * v[d];
      }
      const float inv = 1.0f / sum;
      float* orow = o + (b * T + i) * C + h * HD;
      for (int64_t d = 0; d < HD; ++d) orow[d] = acc[d] * inv;
      l[(b * NH + h) * T + i] = mx + std::log(sum);
    }
  }
  fout.commit();
}

void attention_backward(const Tensor& dout, const Tensor& qkv, const Tensor& out, const Tensor& lse,
                        const Tensor& dqkv, float scale, Stream) {
  const int64_t B = qkv.dim(0), T = qkv.dim(1), NH = qkv.dim(3), HD = qkv.dim(4), C = NH * HD;
  F32In fin(qkv), fo(out), fd(dout);
  F32Out fdq(dqkv, false);
  const float *x = fin.get(), *o = fo.get(), *dO = fd.get();
  const float* l = lse.data<float>();
  float* dx = fdq.get();
#pragma omp parallel
  {
    std::vector<float> dk(static_cast<size_t>(T * HD)), dv(static_cast<size_t>(T * HD));
    std::vector<float> p(static_cast<size_t>(T)), dq(static_cast<size_t>(HD));
#pragma omp for schedule(dynamic, 1)
    for (int64_t bh = 0; bh < B * NH; ++bh) {
      const int64_t b = bh / NH, h = bh % NH;
      std::fill(dk.begin(), dk.end(), 0.0f);
      std::fill(dv.begin(), dv.end(), 0.0f);
      for (int64_t i = 0; i < T; ++i) {
        const float* q = x + (b * T + i) * 3 * C + h * HD;
        const float* doi = dO + (b * T + i) * C + h * HD;
        const float* oi = o + (b * T + i) * C + h * HD;
        const float li = l[(b * NH + h) * T + i];
        float Di = 0;
        for (int64_t d = 0; d < HD; ++d) Di += doi[d] * oi[d];
        std::fill(dq.begin(), dq.end(), 0.0f);
        for (int64_t j = 0; j <= i; ++j) {
          const float* k = x + (b * T + j) * 3 * C + C + h * HD;
          const float* v = x + (b * T + j) * 3 * C + 2 * C + h * HD;
          float s = 0, dp = 0;
          for (int64_t d = 0; d < HD; ++d) {
            s += q[d] * k[d];
            dp += doi[d] * v[d];
          }
          const float pij = std::exp(s * scale - li);
          const float ds = pij * (dp - Di) * scale;
          float* dkj = dk.data() + j * HD;
          float* dvj = dv.data() + j * HD;
          for (int64_t d = 0; d < HD; ++d) {
            dq[d] += ds * k[d];
            dkj[d] += ds * q[d];
            dvj[d] += pij * doi[d];
          }
        }
        float* dqi = dx + (b * T + i) * 3 * C + h * HD;
        for (int64_t d = 0; d < HD; ++d) dqi[d] = dq[d];
      }
      for (int64_t j = 0; j < T; ++j) {
        float* dkj = dx + (b * T + j) * 3 * C + C + h * HD;
        float* dvj = dx + (b * T + j) * 3 * C + 2 * C + h * HD;
        for (int64_t d = 0; d < HD; ++d) {
          dkj[d] = dk[j * HD + d];
          dvj[d] = dv[j * HD + d];
        }
      }
    }
  }
  fdq.commit();
}

}  // namespace mpitron::cpu
