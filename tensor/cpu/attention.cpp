// tensor/cpu/attention.cpp — scaled-dot-product attention, causal or bidirectional
// with a key padding mask (the reference path).
//
// qkv (B, T, NH + 2G, HD) (the 5-D MHA form is the same bytes with G = NH),
// out (B, T, NH, HD), lse (B, NH, T). Per (batch, head h) with kv group
// g = h / (NH/G) the scores S = Q_h·K_gᵀ (T, T) and the products P·V_g, dO·V_gᵀ,
// dS·K_g, dSᵀ·Q_h, Pᵀ·dO are BLAS sgemm calls on strided views of the packed qkv
// (leading dimension W = (NH + 2G)·HD); softmax, masking and the elementwise
// backward run OpenMP-parallel over rows. Backward recomputes P from lse (as
// flash attention does) instead of storing it; dK_g and dV_g sum over the heads
// of group g (consecutive, so the first one writes and the others add).
// Attention dropout (attention.h) scales P by M/(1 − p) before P·V in forward;
// backward regenerates M from the Philox stream, masks dO·Vᵀ and P (for dV).
// Masking (attention.h's AttentionMask): row i of batch b sees keys j < hi(b, i) =
// min(len_b, causal ? i + 1 : T); P and dS are 0 beyond, so the full-width GEMMs
// give dK = dV = 0 for padded keys.
#include <cblas.h>

#include <algorithm>
#include <cmath>

#include "tensor/cpu/common.h"
#include "tensor/cpu/ops.h"
#include "tensor/cpu/vecmath.h"

namespace mpitron::cpu {

namespace {

// C (m, n, ldc) = alpha · op(A) · op(B) + beta · C, row-major.
void sgemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda,
           const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, static_cast<int>(m),
              static_cast<int>(n), static_cast<int>(k), alpha, a, static_cast<int>(lda), b, static_cast<int>(ldb), beta,
              c, static_cast<int>(ldc));
}

// The visible keys of one sample: row i sees j < hi(i).
struct RowMask {
  int64_t len;  // keys j >= len are padding
  bool causal;
  int64_t hi(int64_t i) const { return causal ? std::min(i + 1, len) : len; }
};
RowMask row_mask(const AttentionMask& m, int64_t b, int64_t T) {
  const int64_t len = m.kv_lengths.defined() ? m.kv_lengths.data<int32_t>()[b] : T;
  return {std::clamp<int64_t>(len, 0, T), m.causal};
}

// P (T, T) = masked softmax of S (in place) given each row's lse; zero where masked.
void probs_from_lse(float* s, const float* lse, int64_t T, const RowMask& rm) {
#pragma omp parallel for schedule(static) if (T >= 64)
  for (int64_t i = 0; i < T; ++i) {
    float* row = s + i * T;
    const float l = lse[i];
    const int64_t hi = rm.hi(i);
#pragma omp simd
    for (int64_t j = 0; j < hi; ++j) row[j] = fast_exp(row[j] - l);
    for (int64_t j = hi; j < T; ++j) row[j] = 0.0f;
  }
}

// Dimensions of an attention call (qkv 5-D MHA or 4-D GQA; out (B, T, NH, HD)).
struct Dims {
  int64_t B, T, NH, G, HD, W;  // W: elements per token of qkv
  int64_t q(int64_t h) const { return h * HD; }                        // column of Q head h
  int64_t k(int64_t h) const { return (NH + h / (NH / G)) * HD; }      // of its K group
  int64_t v(int64_t h) const { return (NH + G + h / (NH / G)) * HD; }  // of its V group
};
Dims dims_of(const Tensor& qkv, const Tensor& out) {
  const int64_t nh = out.dim(2), hd = out.dim(3);
  const int64_t heads = qkv.ndim() == 5 ? 3 * qkv.dim(3) : qkv.dim(2);
  return {out.dim(0), out.dim(1), nh, (heads - nh) / 2, hd, heads * hd};
}

// Row i of M/(1 − p) for (batch b, global head h), j < hi, into m.
void keep_row(const AttentionDropout& dr, int64_t b, int64_t h, int64_t i, int64_t hi, int64_t T, float* m) {
  const float inv = 1.0f / (1.0f - dr.p);
  for (int64_t j = 0; j < hi; ++j) m[j] = attention_keep(dr.seed, dr.offset, b, h, i, j, T, dr.p) ? inv : 0.0f;
}

}  // namespace

void attention_forward(const Tensor& qkv, const Tensor& out, const Tensor& lse, float scale,
                       const AttentionDropout& dr, const AttentionMask& am, Stream) {
  const Dims d = dims_of(qkv, out);
  const int64_t B = d.B, T = d.T, NH = d.NH, HD = d.HD, C = NH * HD, W = d.W;
  F32In fin(qkv);
  F32Out fout(out, false);
  const float* x = fin.get();
  float* o = fout.get();
  float* l = lse.data<float>();
  std::vector<float> s(static_cast<size_t>(T * T)), mask(dr.p > 0 ? static_cast<size_t>(T * T) : 0);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < NH; ++h) {
      const float* xb = x + b * T * W;
      float* lrow = l + (b * NH + h) * T;
      const RowMask rm = row_mask(am, b, T);
      sgemm(false, true, T, T, HD, scale, xb + d.q(h), W, xb + d.k(h), W, 0.0f, s.data(), T);  // S = Q·Kᵀ·scale
#pragma omp parallel for schedule(static) if (T >= 64)
      for (int64_t i = 0; i < T; ++i) {
        float* row = s.data() + i * T;
        const int64_t hi = rm.hi(i);
        for (int64_t j = hi; j < T; ++j) row[j] = 0.0f;
        if (hi == 0) {  // no visible key: out 0, lse −∞ (attention.h)
          lrow[i] = -INFINITY;
          continue;
        }
        float mx = -INFINITY;
        for (int64_t j = 0; j < hi; ++j) mx = std::max(mx, row[j]);
        float sum = 0;
#pragma omp simd reduction(+ : sum)
        for (int64_t j = 0; j < hi; ++j) sum += (row[j] = fast_exp(row[j] - mx));
        const float inv = 1.0f / sum;
#pragma omp simd
        for (int64_t j = 0; j < hi; ++j) row[j] *= inv;
        lrow[i] = mx + std::log(sum);
        if (dr.p > 0) {  // P ∘ M/(1 − p): lse stays the undropped softmax's
          float* m = mask.data() + i * T;
          keep_row(dr, b, dr.first_head + h, i, hi, T, m);
          for (int64_t j = 0; j < hi; ++j) row[j] *= m[j];
        }
      }
      sgemm(false, false, T, HD, T, 1.0f, s.data(), T, xb + d.v(h), W, 0.0f, o + b * T * C + h * HD, C);  // O = P·V
    }
  fout.commit();
}

void attention_backward(const Tensor& dout, const Tensor& qkv, const Tensor& out, const Tensor& lse,
                        const Tensor& dqkv, float scale, const AttentionDropout& dr, const AttentionMask& am, Stream) {
  const Dims d = dims_of(qkv, out);
  const int64_t B = d.B, T = d.T, NH = d.NH, HD = d.HD, C = NH * HD, W = d.W, rep = d.NH / d.G;
  F32In fin(qkv), fo(out), fd(dout);
  F32Out fdq(dqkv, false);
  const float *x = fin.get(), *o = fo.get(), *dO = fd.get();
  const float* l = lse.data<float>();
  float* dx = fdq.get();
  std::vector<float> p(static_cast<size_t>(T * T)), dp(static_cast<size_t>(T * T)),
      mask(dr.p > 0 ? static_cast<size_t>(T * T) : 0);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < NH; ++h) {
      const float* xb = x + b * T * W;
      const float* doh = dO + b * T * C + h * HD;
      const float* oh = o + b * T * C + h * HD;
      float* db = dx + b * T * W;
      const float kv_beta = h % rep == 0 ? 0.0f : 1.0f;  // the group's first head writes dK/dV, the rest add
      const RowMask rm = row_mask(am, b, T);
      sgemm(false, true, T, T, HD, scale, xb + d.q(h), W, xb + d.k(h), W, 0.0f, p.data(), T);  // S
      probs_from_lse(p.data(), l + (b * NH + h) * T, T, rm);                                   // P
      sgemm(false, true, T, T, HD, 1.0f, doh, C, xb + d.v(h), W, 0.0f, dp.data(), T);          // dP = dO·Vᵀ
#pragma omp parallel for schedule(static) if (T >= 64)
      for (int64_t i = 0; i < T; ++i) {
        float d = 0;
        for (int64_t e = 0; e < HD; ++e) d += doh[i * C + e] * oh[i * C + e];
        float* dprow = dp.data() + i * T;
        float* prow = p.data() + i * T;
        if (dr.p > 0) {  // dP = (dO·Vᵀ) ∘ M/(1 − p); P ← P ∘ M/(1 − p) for dV after dS is formed
          const int64_t hi = rm.hi(i);
          float* m = mask.data() + i * T;
          keep_row(dr, b, dr.first_head + h, i, hi, T, m);
          for (int64_t j = 0; j < hi; ++j) {
            dprow[j] = prow[j] * (dprow[j] * m[j] - d) * scale;
            prow[j] *= m[j];
          }
          for (int64_t j = hi; j < T; ++j) dprow[j] = 0.0f;
          continue;
        }
#pragma omp simd
        for (int64_t j = 0; j < T; ++j) dprow[j] = prow[j] * (dprow[j] - d) * scale;  // dS (0 where P is 0)
      }
      sgemm(false, false, T, HD, T, 1.0f, dp.data(), T, xb + d.k(h), W, 0.0f, db + d.q(h), W);     // dQ = dS·K
      sgemm(true, false, T, HD, T, 1.0f, dp.data(), T, xb + d.q(h), W, kv_beta, db + d.k(h), W);  // dK (+)= dSᵀ·Q
      sgemm(true, false, T, HD, T, 1.0f, p.data(), T, doh, C, kv_beta, db + d.v(h), W);  // dV (+)= (P∘M/(1−p))ᵀ·dO
    }
  fdq.commit();
}

}  // namespace mpitron::cpu
