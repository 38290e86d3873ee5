// tensor/cpu/attention.cpp — scaled-dot-product attention, causal or bidirectional
// with a key padding mask, whole (attention.h) or as one block of a longer
// sequence (attention_block.h): the reference path, one implementation for both.
//
// An operand (B, T, H, HD) is read through (pointer, batch stride, row stride) with
// the heads of a row packed (head h at +h·HD): the packed qkv (B, T, NH + 2G, HD) is
// three such operands (Q at column 0, K at NH·HD, V at (NH + G)·HD, row stride
// W = (NH + 2G)·HD), a block's q/k/v views are one each. bf16/f16 operands are
// widened to f32 copies first; f32 ones are read in place. q and k heads are HD wide,
// v, out, dout, dv heads Dv wide (a block with MLA's value heads, Dv != HD; the packed
// call has Dv = HD): S and dS contract over HD, O = P·V and dO·Vᵀ over Dv.
// Per (batch, head h) with kv group g = h / (NH/G), query rows go in tiles of
// kTileRows: S = Q_tile·K_gᵀ over the keys [c0, n) some row of the tile sees (causal:
// n = the last row's end, a prefix that grows with the row; a sliding window also
// starts at c0 = the first row's first key, so a tile skips the keys no row of it
// sees and a long sequence costs T·(tile + W), not T²), the masked softmax runs OpenMP-parallel over the tile's rows, and
// O_tile = P·V_g. So the scratch is tile × Tk, not Tq × Tk (a long sequence on the
// CPU), and every product is a BLAS sgemm on strided views (no permute copies).
// Backward recomputes P from lse (as flash attention does) tile by tile:
// dP = dO·V_gᵀ, D_i = Σ_d dO_id·O_id, dS = P ∘ (dP ∘ M/(1 − p) − D),
// dQ_tile = scale·dS·K_g, dK_g += scale·dSᵀ·Q_tile, dV_g += (P ∘ M/(1 − p))ᵀ·dO_tile — dK and dV
// start at 0 and sum over the tiles and over the heads of group g.
// Masking: row i of batch b sees keys lo(i) <= j < hi(b, i) = min(len_b, causal ? i + d + 1 : Tk)
// (d = q_start − k_start, 0 for a whole call; lo = max(0, i + d − W) with a sliding window
// W, else 0); P and dS are 0 outside, so padded keys
// get dK = dV = 0, and a row that sees nothing gets out 0, lse −∞.
// Attention dropout (attention.h): P is scaled by M/(1 − p) before P·V, M regenerated
// from the Philox stream at the GLOBAL position (q_start + i, k_start + j, seq).
// Logit soft-capping (AttentionMask/AttentionBlock::softcap c > 0) then replaces S (bias
// included) by c·tanh(S/c) on the visible entries; backward keeps 1 − tanh² per entry (a
// third tile scratch) and multiplies dS by it before dQ, dK and bias_grad take it.
// A block's score bias (attention_block.h) is added to S's visible entries before the
// softmax (forward) and before exp(S − lse) (backward); backward keeps dS unscaled
// (scale goes into the dQ and dK sgemms' alpha) and adds it into bias_grad[i, j, h]:
// within a tile the OpenMP rows are distinct i, and (b, h) run serially, so no two
// threads touch one element.
#include <cblas.h>

#include <algorithm>
#include <cmath>

#include "tensor/cpu/common.h"
#include "tensor/cpu/ops.h"
#include "tensor/cpu/vecmath.h"

namespace mpitron::cpu {

namespace {

constexpr int64_t kTileRows = 256;

// C (m, n, ldc) = alpha · op(A) · op(B) + beta · C, row-major.
void sgemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda,
           const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, static_cast<int>(m),
              static_cast<int>(n), static_cast<int>(k), alpha, a, static_cast<int>(lda), b, static_cast<int>(ldb), beta,
              c, static_cast<int>(ldc));
}

// Element (b, t, head, e) of a (B, T, H, HD) operand at p[b·sb + t·st + head·HD + e].
template <typename F>
struct Rows {
  F* p = nullptr;
  int64_t sb = 0, st = 0;
  F* at(int64_t b, int64_t t, int64_t head, int64_t hd) const { return p + b * sb + t * st + head * hd; }
  Rows<F> shift(int64_t elems) const { return {p + elems, sb, st}; }
};
using In = Rows<const float>;
using Out = Rows<float>;

// A (B, T, H, HD) tensor (a view with packed heads) read as f32: its own memory when
// it is f32, else a widened contiguous copy.
class ReadF32 {
 public:
  explicit ReadF32(const Tensor& t) {
    if (t.dtype() == DType::F32) {
      r_ = {t.data<float>(), t.strides()[0], t.strides()[1]};
      return;
    }
    keep_ = t.contiguous().to(DType::F32);
    r_ = {keep_.data<float>(), keep_.strides()[0], keep_.strides()[1]};
  }
  In get() const { return r_; }

 private:
  Tensor keep_;
  In r_;
};

// A (B, T, H, HD) output written as f32: in place when it is f32, else into a
// contiguous scratch that commit() rounds into it.
class WriteF32 {
 public:
  explicit WriteF32(const Tensor& t) : dst_(t) {
    if (t.dtype() == DType::F32) {
      w_ = {t.data<float>(), t.strides()[0], t.strides()[1]};
      return;
    }
    tmp_ = Tensor::empty(t.shape(), DType::F32, Device::cpu());
    w_ = {tmp_.data<float>(), tmp_.strides()[0], tmp_.strides()[1]};
  }
  Out get() const { return w_; }
  void commit() {
    if (tmp_.defined()) dst_.copy_from(tmp_.to(dst_.dtype()));
  }

 private:
  Tensor dst_, tmp_;
  Out w_;
};

// One attention problem: queries (B, Tq, NH) against keys (B, Tk, G); q and k heads of
// width HD, v and out heads of width Dv (= HD except for MLA's value heads).
struct Geo {
  int64_t B, Tq, Tk, NH, G, HD, Dv;
  int64_t group(int64_t h) const { return h / (NH / G); }
};

// Which keys row i of sample b sees: lo(i) <= j < hi(b, i); neither bound shrinks as i grows.
struct Visible {
  int64_t diag = 0;  // q_start − k_start: causal row i sees keys j <= i + diag
  bool causal = true;
  const int32_t* len = nullptr;  // per-sample key lengths (padding), null: all Tk
  int64_t tk = 0;
  int64_t window = 0;  // > 0: row i sees keys j >= i + diag − window (sliding window)
  int64_t hi(int64_t b, int64_t i) const {
    int64_t h = len ? std::clamp<int64_t>(len[b], 0, tk) : tk;
    if (causal) h = std::min(h, std::max<int64_t>(0, i + diag + 1));
    return h;
  }
  int64_t lo(int64_t i) const { return window > 0 ? std::clamp<int64_t>(i + diag - window, 0, tk) : 0; }
};

// The dropout keep mask at global positions: M/(1 − p) of (b, head h, row i, key j).
struct Drop {
  AttentionDropout dr;
  int64_t q0 = 0, k0 = 0, seq = 0;
  bool on() const { return dr.p > 0; }
  float keep(int64_t b, int64_t h, int64_t i, int64_t j) const {
    return attention_keep(dr.seed, dr.offset, b, dr.first_head + h, q0 + i, k0 + j, seq, dr.p) ? 1.0f / (1.0f - dr.p)
                                                                                                : 0.0f;
  }
};

// What becomes of the scaled scores before the mask: a block's score bias and its gradient,
// (Tq, Tk, NH) f32 contiguous (null: none), then the logit soft-cap c·tanh(S/c) (0: none).
struct Bias {
  const float* b = nullptr;
  float* grad = nullptr;
  int64_t tk = 0, nh = 0;
  float softcap = 0.0f;
  int64_t at(int64_t i, int64_t j, int64_t h) const { return (i * tk + j) * nh + h; }
};

// The statistics (B, NH, T) f32 with element (b, h, i) at p[b·sb + h·sh + i].
template <typename F>
struct Stats {
  F* p;
  int64_t sb, sh;
  F* at(int64_t b, int64_t h) const { return p + b * sb + h * sh; }
};

void forward_core(const Geo& g, In q, In k, In v, Out o, Stats<float> lse, float scale, const Visible& vis,
                  const Drop& drop, const Bias& bias = {}) {
  const int64_t HD = g.HD, Dv = g.Dv, Tk = g.Tk;
  std::vector<float> s(static_cast<size_t>(std::min(kTileRows, g.Tq) * Tk));
  for (int64_t b = 0; b < g.B; ++b)
    for (int64_t h = 0; h < g.NH; ++h) {
      const int64_t grp = g.group(h);
      float* lrow = lse.at(b, h);
      for (int64_t i0 = 0; i0 < g.Tq; i0 += kTileRows) {
        const int64_t m = std::min(kTileRows, g.Tq - i0);
        const int64_t c0 = vis.lo(i0);              // the tile's first row's first key: the least of any row
        const int64_t n = vis.hi(b, i0 + m - 1);    // the keys the tile's last row sees: the most of any row
        const int64_t w = n - c0;                   // S's columns: keys c0 … n − 1
        float* o0 = o.at(b, i0, h, Dv);
        if (w <= 0) {  // no row of the tile sees a key: out 0, lse −∞ (attention.h)
          for (int64_t r = 0; r < m; ++r) {
            std::fill(o0 + r * o.st, o0 + r * o.st + Dv, 0.0f);
            lrow[i0 + r] = -INFINITY;
          }
          continue;
        }
        sgemm(false, true, m, w, HD, scale, q.at(b, i0, h, HD), q.st, k.at(b, c0, grp, HD), k.st, 0.0f, s.data(),
              w);  // S = Q·Kᵀ·scale over keys c0 … n − 1
#pragma omp parallel for schedule(static) if (m * w >= 4096)
        for (int64_t r = 0; r < m; ++r) {
          const int64_t i = i0 + r, hi = vis.hi(b, i) - c0, lo = std::min(vis.lo(i) - c0, std::max<int64_t>(hi, 0));
          float* row = s.data() + r * w;
          for (int64_t j = 0; j < lo; ++j) row[j] = 0.0f;
          for (int64_t j = std::max(hi, lo); j < w; ++j) row[j] = 0.0f;
          if (hi <= lo) {
            lrow[i] = -INFINITY;
            continue;
          }
          if (bias.b)  // S += bias[i, c0 + j, h]
            for (int64_t j = lo; j < hi; ++j) row[j] += bias.b[bias.at(i, c0 + j, h)];
          if (bias.softcap > 0.0f)  // S = c·tanh(S/c)
            for (int64_t j = lo; j < hi; ++j) row[j] = bias.softcap * std::tanh(row[j] / bias.softcap);
          float mx = -INFINITY;
          for (int64_t j = lo; j < hi; ++j) mx = std::max(mx, row[j]);
          float sum = 0;
#pragma omp simd reduction(+ : sum)
          for (int64_t j = lo; j < hi; ++j) sum += (row[j] = fast_exp(row[j] - mx));
          const float inv = 1.0f / sum;
#pragma omp simd
          for (int64_t j = lo; j < hi; ++j) row[j] *= inv;
          lrow[i] = mx + std::log(sum);
          if (drop.on())  // P ∘ M/(1 − p): lse stays the undropped softmax's
            for (int64_t j = lo; j < hi; ++j) row[j] *= drop.keep(b, h, i, c0 + j);
        }
        sgemm(false, false, m, Dv, w, 1.0f, s.data(), w, v.at(b, c0, grp, Dv), v.st, 0.0f, o0, o.st);  // O = P·V
      }
    }
}

void backward_core(const Geo& g, In dO, In q, In k, In v, In o, Stats<const float> lse, Out dq, Out dk, Out dv,
                   float scale, const Visible& vis, const Drop& drop, const Bias& bias = {}) {
  const int64_t HD = g.HD, Dv = g.Dv, Tk = g.Tk;
  // dK, dV sum over tiles and over each group's heads: start from 0.
  for (const auto& [d, wd] : {std::pair<Out, int64_t>{dk, HD}, std::pair<Out, int64_t>{dv, Dv}})
    for (int64_t b = 0; b < g.B; ++b)
#pragma omp parallel for schedule(static) if (Tk >= 64)
      for (int64_t t = 0; t < Tk; ++t) std::fill(d.at(b, t, 0, wd), d.at(b, t, 0, wd) + g.G * wd, 0.0f);
  const size_t sq = static_cast<size_t>(std::min(kTileRows, g.Tq) * Tk);
  std::vector<float> p(sq), dp(sq), dcap(bias.softcap > 0.0f ? sq : 0);  // dcap: 1 − tanh² of the capped scores
  for (int64_t b = 0; b < g.B; ++b)
    for (int64_t h = 0; h < g.NH; ++h) {
      const int64_t grp = g.group(h);
      const float* lrow = lse.at(b, h);
      for (int64_t i0 = 0; i0 < g.Tq; i0 += kTileRows) {
        const int64_t m = std::min(kTileRows, g.Tq - i0);
        const int64_t c0 = vis.lo(i0), n = vis.hi(b, i0 + m - 1), w = n - c0;  // keys c0 … n − 1
        float* dq0 = dq.at(b, i0, h, HD);
        if (w <= 0) {
          for (int64_t r = 0; r < m; ++r) std::fill(dq0 + r * dq.st, dq0 + r * dq.st + HD, 0.0f);
          continue;
        }
        const float* q0 = q.at(b, i0, h, HD);
        const float* do0 = dO.at(b, i0, h, Dv);
        sgemm(false, true, m, w, HD, scale, q0, q.st, k.at(b, c0, grp, HD), k.st, 0.0f, p.data(), w);  // S
        sgemm(false, true, m, w, Dv, 1.0f, do0, dO.st, v.at(b, c0, grp, Dv), v.st, 0.0f, dp.data(), w);  // dO·Vᵀ
#pragma omp parallel for schedule(static) if (m * w >= 4096)
        for (int64_t r = 0; r < m; ++r) {
          const int64_t i = i0 + r, hi = vis.hi(b, i) - c0, lo = std::min(vis.lo(i) - c0, std::max<int64_t>(hi, 0));
          const float* dor = dO.at(b, i, h, Dv);
          const float* orow = o.at(b, i, h, Dv);
          float d = 0;
          for (int64_t e = 0; e < Dv; ++e) d += dor[e] * orow[e];
          float* prow = p.data() + r * w;
          float* dprow = dp.data() + r * w;
          const float l = lrow[i];
          for (int64_t j = 0; j < lo; ++j) prow[j] = dprow[j] = 0.0f;
          if (bias.b)  // S += bias[i, c0 + j, h]
            for (int64_t j = lo; j < hi; ++j) prow[j] += bias.b[bias.at(i, c0 + j, h)];
          float* crow = dcap.empty() ? nullptr : dcap.data() + r * w;
          if (crow)  // S = c·tanh(S/c); keep its derivative 1 − tanh²
            for (int64_t j = lo; j < hi; ++j) {
              const float t = std::tanh(prow[j] / bias.softcap);
              crow[j] = 1.0f - t * t;
              prow[j] = bias.softcap * t;
            }
#pragma omp simd
          for (int64_t j = lo; j < hi; ++j) prow[j] = fast_exp(prow[j] - l);  // P from the (merged) lse
          for (int64_t j = std::max(hi, lo); j < w; ++j) prow[j] = dprow[j] = 0.0f;
          if (drop.on()) {  // dS = P ∘ (dP ∘ M/(1 − p) − D); P ← P ∘ M/(1 − p) for dV
            for (int64_t j = lo; j < hi; ++j) {
              const float mk = drop.keep(b, h, i, c0 + j);
              dprow[j] = prow[j] * (dprow[j] * mk - d);
              prow[j] *= mk;
            }
          } else {
#pragma omp simd
            for (int64_t j = lo; j < hi; ++j) dprow[j] = prow[j] * (dprow[j] - d);  // dS (unscaled)
          }
          if (crow)  // the gradient w.r.t. the score before the cap
            for (int64_t j = lo; j < hi; ++j) dprow[j] *= crow[j];
          if (bias.grad)  // d loss / d bias[i, j, h] += dS (row i is this thread's alone)
            for (int64_t j = lo; j < hi; ++j) bias.grad[bias.at(i, c0 + j, h)] += dprow[j];
        }
        sgemm(false, false, m, HD, w, scale, dp.data(), w, k.at(b, c0, grp, HD), k.st, 0.0f, dq0, dq.st);  // dQ = scale·dS·K
        sgemm(true, false, w, HD, m, scale, dp.data(), w, q0, q.st, 1.0f, dk.at(b, c0, grp, HD), dk.st);  // dK += scale·dSᵀ·Q
        sgemm(true, false, w, Dv, m, 1.0f, p.data(), w, do0, dO.st, 1.0f, dv.at(b, c0, grp, Dv), dv.st);  // dV += Pᵀ·dO
      }
    }
}

// The whole-call geometry of a packed qkv (5-D MHA or 4-D GQA) and out (B, T, NH, HD).
Geo packed_geo(const Tensor& qkv, const Tensor& out) {
  const int64_t nh = out.dim(2), hd = out.dim(3);
  const int64_t heads = qkv.ndim() == 5 ? 3 * qkv.dim(3) : qkv.dim(2);
  return {out.dim(0), out.dim(1), out.dim(1), nh, (heads - nh) / 2, hd, hd};
}
Visible whole_visible(const AttentionMask& m, const Geo& g) {
  return {0, m.causal, m.kv_lengths.defined() ? m.kv_lengths.data<int32_t>() : nullptr, g.Tk, m.window};
}
Drop whole_drop(const AttentionDropout& dr, const Geo& g) { return {dr, 0, 0, g.Tq}; }
Bias whole_scores(const AttentionMask& m, const Geo& g) { return {nullptr, nullptr, g.Tk, g.NH, m.softcap}; }
Drop block_drop(const AttentionDropout& dr, const AttentionBlock& blk, int64_t tq) {
  return {dr, blk.q_start, blk.k_start, blk.seq > 0 ? blk.seq : tq};
}
Visible block_visible(const AttentionBlock& blk, const Geo& g) {
  return {blk.q_start - blk.k_start, blk.causal, blk.kv_lengths.defined() ? blk.kv_lengths.data<int32_t>() : nullptr,
          g.Tk};
}
Bias block_bias(const AttentionBlock& blk, const Geo& g, bool with_grad) {
  return {blk.bias.defined() ? blk.bias.data<float>() : nullptr,
          with_grad && blk.bias_grad.defined() ? blk.bias_grad.data<float>() : nullptr, g.Tk, g.NH, blk.softcap};
}

}  // namespace

void attention_forward(const Tensor& qkv, const Tensor& out, const Tensor& lse, float scale,
                       const AttentionDropout& dr, const AttentionMask& am, Stream) {
  const Geo g = packed_geo(qkv, out);
  const int64_t T = g.Tq, W = (g.NH + 2 * g.G) * g.HD, C = g.NH * g.HD;
  F32In fin(qkv);
  F32Out fout(out, false);
  const In x{fin.get(), T * W, W};
  forward_core(g, x, x.shift(g.NH * g.HD), x.shift((g.NH + g.G) * g.HD), Out{fout.get(), T * C, C},
               {lse.data<float>(), g.NH * T, T}, scale, whole_visible(am, g), whole_drop(dr, g), whole_scores(am, g));
  fout.commit();
}

void attention_backward(const Tensor& dout, const Tensor& qkv, const Tensor& out, const Tensor& lse,
                        const Tensor& dqkv, float scale, const AttentionDropout& dr, const AttentionMask& am, Stream) {
  const Geo g = packed_geo(qkv, out);
  const int64_t T = g.Tq, W = (g.NH + 2 * g.G) * g.HD, C = g.NH * g.HD;
  F32In fin(qkv), fo(out), fd(dout);
  F32Out fdq(dqkv, false);
  const In x{fin.get(), T * W, W};
  const Out dx{fdq.get(), T * W, W};
  backward_core(g, In{fd.get(), T * C, C}, x, x.shift(g.NH * g.HD), x.shift((g.NH + g.G) * g.HD),
                In{fo.get(), T * C, C}, {lse.data<float>(), g.NH * T, T}, dx, dx.shift(g.NH * g.HD),
                dx.shift((g.NH + g.G) * g.HD), scale, whole_visible(am, g), whole_drop(dr, g), whole_scores(am, g));
  fdq.commit();
}

void attention_block_forward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                             const Tensor& lse, float scale, const AttentionBlock& blk, const AttentionDropout& dr,
                             Stream) {
  const Geo g{q.dim(0), q.dim(1), k.dim(1), q.dim(2), k.dim(2), q.dim(3), v.dim(3)};
  ReadF32 fq(q), fk(k), fv(v);
  WriteF32 fo(out);
  forward_core(g, fq.get(), fk.get(), fv.get(), fo.get(), {lse.data<float>(), lse.strides()[0], lse.strides()[1]},
               scale, block_visible(blk, g), block_drop(dr, blk, g.Tq), block_bias(blk, g, false));
  fo.commit();
}

void attention_block_backward(const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v,
                              const Tensor& out, const Tensor& lse, const Tensor& dq, const Tensor& dk,
                              const Tensor& dv, float scale, const AttentionBlock& blk, const AttentionDropout& dr,
                              Stream) {
  const Geo g{q.dim(0), q.dim(1), k.dim(1), q.dim(2), k.dim(2), q.dim(3), v.dim(3)};
  ReadF32 fdo(dout), fq(q), fk(k), fv(v), fo(out);
  WriteF32 fdq(dq), fdk(dk), fdv(dv);
  backward_core(g, fdo.get(), fq.get(), fk.get(), fv.get(), fo.get(),
                {lse.data<float>(), lse.strides()[0], lse.strides()[1]}, fdq.get(), fdk.get(), fdv.get(), scale,
                block_visible(blk, g), block_drop(dr, blk, g.Tq), block_bias(blk, g, true));
  fdq.commit();
  fdk.commit();
  fdv.commit();
}

void attention_merge(const Tensor& acc, const Tensor& acc_lse, const Tensor& part, const Tensor& part_lse, Stream) {
  const int64_t B = acc.dim(0), T = acc.dim(1), NH = acc.dim(2), HD = acc.dim(3);
  ReadF32 fp(part);
  const In pr = fp.get();
  const Stats<const float> pl{part_lse.data<float>(), part_lse.strides()[0], part_lse.strides()[1]};
  float* a = acc.data<float>();
  float* al = acc_lse.data<float>();
#pragma omp parallel for collapse(2) schedule(static) if (B * NH * T >= 4096)
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < NH; ++h)
      for (int64_t i = 0; i < T; ++i) {
        const float lp = pl.at(b, h)[i];
        if (lp == -INFINITY) continue;  // the block gave this row nothing
        float& la = al[(b * NH + h) * T + i];
        const float hi = std::max(la, lp);
        const float L = hi + std::log1p(std::exp(-std::fabs(la - lp)));  // la = −∞: exp(−∞) = 0, L = lp
        const float wa = std::exp(la - L), wp = std::exp(lp - L);
        float* ar = a + ((b * T + i) * NH + h) * HD;
        const float* p = pr.at(b, i, h, HD);
        for (int64_t e = 0; e < HD; ++e) ar[e] = ar[e] * wa + p[e] * wp;
        la = L;
      }
}

}  // namespace mpitron::cpu
