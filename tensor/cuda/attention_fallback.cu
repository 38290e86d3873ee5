// tensor/cuda/attention_fallback.cu — attention (causal, or bidirectional with a key
// padding mask; whole, or one block of a longer sequence) from cuBLASLt GEMMs and a
// masked softmax kernel: the path for f32, for shapes and masks cuDNN rejects, for
// builds without cuDNN, for attention dropout, and for tests (cuda_attention_force_fallback).
//
//   One AttnProblem (internal.h): q (B, Tq, NH, HD), k (B, Tk, G, HD), v (B, Tk, G, Dv),
//   out/dout (B, Tq, NH, Dv), lse (B, NH, Tq) f32, each a strided operand with the heads
//   of a row packed; rep = NH/G. Dv = HD but for MLA's value heads (a block): the GEMMs
//   that contract over the head (S, dQ, dK) take HD, those over V's (O, dP, dV) take Dv.
//   The packed qkv of attention.h is three such operands (Dv = HD, row stride
//   W = (NH + 2G)·HD), a block of attention_block.h its own views. Head
//   h = g·rep + r (kv group g, r < rep) of Q is the Tq×HD matrix at q + b·sb + h·HD
//   with row stride st; K and V of group g likewise. So no permute copies are needed.
//   For a fixed r, the heads g·rep + r of a chunk of groups are one strided batch
//   (Q batch stride rep·HD, K batch stride HD, V Dv); MHA (rep = 1) is one batch
//   over the chunk's heads.
//
// Forward, per (b, chunk of groups, r):
//   S = scale·Q·Kᵀ            (hc, Tq, Tk) f32 scratch
//   P = exp(S − lse), masked   (hc, Tq, Tk) io dtype; lse = rowwise logsumexp of S (j < hi)
//   O = P·V
// Backward (P recomputed from S and the given lse — for a block, the merged one):
//   dP = dO·Vᵀ, D_i = Σ_d dO_id·O_id, dS = P ⊙ (dP − D)
//   dV = Pᵀ·dO,  dQ = scale·dS·K,  dK = scale·dSᵀ·Q
// With rep > 1, dK and dV of a group sum over its rep heads: they accumulate in f32
// scratch (GEMM beta = 1 after the first r) and are rounded into dk/dv once.
// Scratch comes from the caching allocator; groups are processed in chunks so it
// stays under ~512 MiB whatever Tq·Tk is. P and dS are rounded to the io dtype before
// their GEMMs (as flash attention kernels do); all accumulation is f32.
// Attention dropout (attention.h): the kernels multiply P by M/(1 − p) before
// P·V (forward) and Pᵀ·dO (backward) and mask dP before dS, M from attention_keep
// for (b, first_head + local head, q_start + i, k_start + j, seq) — the CPU path's
// mask exactly, at the rows' global positions.
// Masking: row i of sample b sees keys lo <= j < hi = min(len_b, causal ? i + q_start −
// k_start + 1 : Tk), len_b read on the device from kv_len and clamped to [0, Tk], lo =
// max(0, i + q_start − k_start − W) with a sliding window W (else 0); the
// full Tq×Tk GEMMs run regardless and the kernels write P = dS = 0 outside, so
// masked keys get dK = dV = 0; a row with hi = 0 gets out 0, lse −∞.
// Logit soft-capping (softcap c > 0, Gemma 2; never cuDNN's) replaces S (bias included) by
// c·tanh(S/c) in the same kernels, and the backward kernel multiplies dS by 1 − tanh².
// A block's score bias (Tq, Tk, NH) (attention_block.h) is added to S's visible
// entries in the kernels, before the max/exp (forward) and exp(S − lse) (backward);
// the backward kernel adds the unscaled f32 dS into bias_grad[i, j, h]. No atomics
// are needed: within one launch every (head, i, j) is one lane's, and launches (per
// sample, group chunk, head offset) run in order on the stream — so the sum is
// deterministic.
#include <algorithm>

#include "tensor/attention.h"
#include "tensor/cuda/common.cuh"
#include "tensor/cuda/internal.h"

namespace mpitron::cuda {

namespace {
constexpr int kWarpsPerBlock = 8;
constexpr size_t kScratchBudget = size_t(512) << 20;

// Groups per chunk so that `bytes_per_elem`·gc·Tq·Tk fits the budget.
int64_t group_chunk(const AttnProblem& d, size_t bytes_per_elem) {
  const size_t per_group = bytes_per_elem * static_cast<size_t>(d.Tq) * static_cast<size_t>(d.Tk);
  return std::max<int64_t>(1, std::min<int64_t>(d.G, static_cast<int64_t>(kScratchBudget / std::max<size_t>(per_group, 1))));
}

// Mask and dropout of one kernel launch: batch entry k of the launch is global head
// head0 + k·head_step of sample b; its row i is the query at q0 + i, key j at k0 + j.
struct DropRows {
  float p;  // 0: no dropout
  uint64_t seed, offset;
  int64_t b, head0;
  const int32_t* kv_len;  // (B) on the device, or null: every key
  bool causal;
  int64_t q0, k0, seq;  // global positions of row 0 and key 0; the dropout's T
  int64_t window;       // > 0: row i sees keys j >= lo(i) (sliding window)
  // Row i sees keys lo(i) <= j < hi(i).
  __device__ int lo(int i) const {
    if (window <= 0) return 0;
    const int64_t c = q0 + i - k0 - window;
    return static_cast<int>(c < 0 ? 0 : c);
  }
  __device__ int hi(int i, int tk) const {
    int64_t len = kv_len ? kv_len[b] : tk;
    len = len < 0 ? 0 : len > tk ? tk : len;
    if (!causal) return static_cast<int>(len);
    const int64_t c = q0 + i - k0 + 1;
    return static_cast<int>(c < 0 ? 0 : c < len ? c : len);
  }
  // M/(1 − p) at (k, i, j)
  __device__ float keep(int64_t k, int i, int j, int head_step) const {
    if (p == 0.0f) return 1.0f;
    return attention_keep(seed, offset, b, head0 + k * head_step, q0 + i, k0 + j, seq, p) ? 1.0f / (1.0f - p) : 0.0f;
  }
};
// What becomes of a launch's scaled scores before the mask: the score bias (batch entry k is
// local head h0 + k·head_step; element (i, j, h) at (i·Tk + j)·nh + h), then the logit soft-cap.
struct BiasRows {
  const float* b;  // null: none
  float* grad;     // null: none
  int64_t nh, h0;
  float cap;       // > 0: U → cap·tanh(U/cap) (U: the score with its bias); 0: none
  __device__ int64_t at(int64_t k, int i, int j, int tk, int head_step) const {
    return (static_cast<int64_t>(i) * tk + j) * nh + h0 + k * head_step;
  }
  __device__ float add(int64_t k, int i, int j, int tk, int head_step) const {
    return b ? b[at(k, i, j, tk, head_step)] : 0.0f;
  }
  // The score the softmax sees for S[k, i, j] = s.
  __device__ float score(float s, int64_t k, int i, int j, int tk, int head_step) const {
    const float u = s + add(k, i, j, tk, head_step);
    return cap > 0.0f ? cap * tanhf(u / cap) : u;
  }
};
BiasRows bias_rows(const AttnProblem& d, int64_t h0) { return {d.bias, d.bias_grad, d.NH, h0, d.softcap}; }

DropRows drop_rows(const AttnProblem& d, const AttentionDropout& drop, int64_t b, int64_t h0) {
  return DropRows{drop.p, drop.seed, drop.offset, b, drop.first_head + h0, d.kv_len, d.causal,
                  d.q_start, d.k_start, d.seq > 0 ? d.seq : d.Tq, d.window};
}

// Row r = k·Tq + i of S (gc·Tq rows of length Tk; batch entry k is head h0 + k·head_step):
// lse and P for the masked row. lse points at head h0's row; head h0 + k·head_step's
// statistics are at + k·head_step·lse_sh.
template <typename T>
__global__ void masked_softmax_forward_kernel(const float* S, T* P, float* lse, int64_t lse_sh, int64_t rows, int tq,
                                              int tk, int head_step, DropRows dr, BiasRows bias) {
  const int lane = threadIdx.x & 31;
  const int64_t r = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + (threadIdx.x >> 5);
  if (r >= rows) return;
  const int i = static_cast<int>(r % tq);
  const int64_t k = r / tq;
  const int hi = dr.hi(i, tk), lo = dr.lo(i);
  const float* sr = S + r * tk;
  T* pr = P + r * tk;
  float m = -INFINITY;
  for (int j = lo + lane; j < hi; j += 32) m = fmaxf(m, bias.score(sr[j], k, i, j, tk, head_step));
  m = warp_max(m);
  float sum = 0.0f;
  for (int j = lo + lane; j < hi; j += 32) sum += expf(bias.score(sr[j], k, i, j, tk, head_step) - m);
  sum = warp_sum(sum);
  const float l = hi > lo ? m + logf(sum) : -INFINITY;  // no visible key: P = 0, lse −∞
  for (int j = lane; j < tk; j += 32)
    pr[j] = from_float<T>(j >= lo && j < hi
                              ? expf(bias.score(sr[j], k, i, j, tk, head_step) - l) * dr.keep(k, i, j, head_step)
                              : 0.0f);
  if (lane == 0) lse[k * head_step * lse_sh + i] = l;
}

// Row r = k·Tq + i: P = exp(S + bias − lse) (masked: 0 for j >= hi), dS = P ⊙ (dP·M/(1−p) − D_i),
// D_i = dO_i·O_i; the P written (for dV) is P·M/(1 − p); bias_grad[i, j, h] += dS (f32).
// With the soft-cap, P = exp(cap·tanh(U/cap) − lse), U = S + bias, and dS is multiplied by
// 1 − tanh²(U/cap) (the gradient w.r.t. U).
// dout/out/lse point at head h0 of sample b; batch entry k is head h0 + k·head_step,
// whose row i is at i·st + k·head_step·hd (hd: out's head width, Dv).
template <typename T>
__global__ void masked_softmax_backward_kernel(const float* S, const float* dP, const float* lse, int64_t lse_sh,
                                               const T* dout, int64_t dout_st, const T* out, int64_t out_st, T* P,
                                               T* dS, int64_t rows, int tq, int tk, int hd, int head_step,
                                               DropRows dr, BiasRows bias) {
  const int lane = threadIdx.x & 31;
  const int64_t r = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + (threadIdx.x >> 5);
  if (r >= rows) return;
  const int i = static_cast<int>(r % tq);
  const int64_t h = (r / tq) * head_step;
  const T* dor = dout + i * dout_st + h * hd;
  const T* orow = out + i * out_st + h * hd;
  float dsum = 0.0f;
  for (int d = lane; d < hd; d += 32) dsum += to_float(dor[d]) * to_float(orow[d]);
  dsum = warp_sum(dsum);
  const float l = lse[h * lse_sh + i];
  const float* sr = S + r * tk;
  const float* dpr = dP + r * tk;
  T* pr = P + r * tk;
  T* dsr = dS + r * tk;
  const int hi = dr.hi(i, tk), lo = dr.lo(i);
  for (int j = lane; j < tk; j += 32) {
    const bool seen = j >= lo && j < hi;
    float u = seen ? sr[j] + bias.add(r / tq, i, j, tk, head_step) : 0.0f, cap_grad = 1.0f;
    if (bias.cap > 0.0f && seen) {  // U → cap·tanh(U/cap), whose derivative is 1 − tanh²
      const float t = tanhf(u / bias.cap);
      u = bias.cap * t;
      cap_grad = 1.0f - t * t;
    }
    const float p = seen ? expf(u - l) : 0.0f;
    const float m = seen ? dr.keep(r / tq, i, j, head_step) : 0.0f;
    float ds = p * (dpr[j] * m - dsum);
    if (bias.cap > 0.0f) ds *= cap_grad;  // the gradient w.r.t. U (dQ, dK and bias_grad take it)
    pr[j] = from_float<T>(p * m);
    dsr[j] = from_float<T>(ds);
    if (bias.grad && seen) bias.grad[bias.at(r / tq, i, j, tk, head_step)] += ds;
  }
}

// dst (Tk rows of stride st) ← src (gc, Tk, hd) f32: group k's rows land at column k·hd
// (hd: HD for dK, Dv for dV).
// Rounds the f32-accumulated dK or dV of a chunk of groups into the output.
template <typename T>
__global__ void store_group_grad_kernel(const float* src, T* dst, int64_t n, int tk, int hd, int64_t st) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t e = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; e < n; e += stride) {
    const int64_t k = e / (static_cast<int64_t>(tk) * hd), i = (e / hd) % tk, c = e % hd;
    dst[i * st + k * hd + c] = from_float<T>(src[e]);
  }
}

// Element (b, 0, head, 0) of an operand, as bytes.
char* row0(const AttnRows& r, int64_t b, int64_t head, int64_t hd, size_t es) {
  return static_cast<char*>(r.p) + (b * r.sb + head * hd) * static_cast<int64_t>(es);
}
}  // namespace

AttnProblem attention_problem(const Tensor& qkv, const Tensor& out, const Tensor& lse, const AttentionMask& mask,
                              const Tensor& dout, const Tensor& dqkv) {
  AttnProblem d;
  d.device = qkv.device().index;
  const int64_t nh = out.dim(2), hd = out.dim(3);
  const int64_t heads = qkv.ndim() == 5 ? 3 * qkv.dim(3) : qkv.dim(2);
  d.B = out.dim(0), d.Tq = d.Tk = out.dim(1), d.NH = nh, d.G = (heads - nh) / 2, d.HD = d.Dv = hd, d.dt = qkv.dtype();
  const int64_t W = heads * hd, C = nh * hd, T = d.Tq;
  const size_t es = dtype_size(d.dt);
  auto packed = [&](const Tensor& t, int64_t col) {
    return AttnRows{t.defined() ? static_cast<char*>(t.data_ptr()) + col * hd * static_cast<int64_t>(es) : nullptr,
                    T * W, W};
  };
  d.q = packed(qkv, 0), d.k = packed(qkv, nh), d.v = packed(qkv, nh + d.G);
  d.dq = packed(dqkv, 0), d.dk = packed(dqkv, nh), d.dv = packed(dqkv, nh + d.G);
  d.out = {out.data_ptr(), T * C, C};
  d.dout = {dout.defined() ? dout.data_ptr() : nullptr, T * C, C};
  d.lse = static_cast<float*>(lse.data_ptr()), d.lse_sb = nh * T, d.lse_sh = T;
  d.seq = T;
  d.causal = mask.causal;
  d.window = mask.window;
  d.softcap = mask.softcap;
  d.kv_len = mask.kv_lengths.defined() ? static_cast<const int32_t*>(mask.kv_lengths.data_ptr()) : nullptr;
  return d;
}

void attention_fallback_forward(const AttnProblem& d, float scale, const AttentionDropout& drop, Stream s) {
  if (d.B * d.Tq * d.NH == 0) return;
  DeviceGuard guard(d.device);
  const int dev = d.device;
  const DType dt = d.dt;
  const size_t es = dtype_size(dt);
  const int64_t rep = d.NH / d.G, HD = d.HD, Dv = d.Dv;
  const int64_t gc_max = group_chunk(d, sizeof(float) + es);
  Scratch S(dev, sizeof(float) * gc_max * d.Tq * d.Tk, s), P(dev, es * gc_max * d.Tq * d.Tk, s);
  const cudaStream_t st = stream_of(s);
  for (int64_t b = 0; b < d.B; ++b) {
    for (int64_t g0 = 0; g0 < d.G; g0 += gc_max) {
      const int64_t gc = std::min(gc_max, d.G - g0);
      const MatOperand K{row0(d.k, b, g0, HD, es), d.Tk, HD, d.k.st, HD};
      const MatOperand V{row0(d.v, b, g0, Dv, es), d.Tk, Dv, d.v.st, Dv};
      for (int64_t r = 0; r < rep; ++r) {
        const int64_t h0 = g0 * rep + r;  // heads h0, h0 + rep, … (one per group of the chunk)
        const MatOperand Q{row0(d.q, b, h0, HD, es), d.Tq, HD, d.q.st, rep * HD};
        // S (gc, Tq, Tk) = scale · Q · Kᵀ
        strided_matmul(dev, s, dt, DType::F32, Q, false, K, true, S.get(), d.Tk, d.Tq * d.Tk, gc, scale, 0.0f);
        const int64_t rows = gc * d.Tq;
        const int grid = static_cast<int>((rows + kWarpsPerBlock - 1) / kWarpsPerBlock);
        MPT_DISPATCH_DEV_FLOAT(dt, "attention_forward", [&](auto tag) {
          using T = decltype(tag);
          MPT_LAUNCH(grid, 32 * kWarpsPerBlock, 0, st, masked_softmax_forward_kernel<T>)(
              S.get<float>(), P.get<T>(), d.lse + b * d.lse_sb + h0 * d.lse_sh, d.lse_sh, rows,
              static_cast<int>(d.Tq), static_cast<int>(d.Tk), static_cast<int>(rep), drop_rows(d, drop, b, h0),
              bias_rows(d, h0));
        });
        MPT_KERNEL_CHECK("attention_forward (softmax)");
        // O (gc heads, Tq, Dv) = P · V, written into out
        const MatOperand Pm{P.get(), d.Tq, d.Tk, d.Tk, d.Tq * d.Tk};
        strided_matmul(dev, s, dt, dt, Pm, false, V, false, row0(d.out, b, h0, Dv, es), d.out.st, rep * Dv, gc, 1.0f,
                       0.0f);
      }
    }
  }
}

void attention_fallback_backward(const AttnProblem& d, float scale, const AttentionDropout& drop, Stream s) {
  if (d.B * d.Tq * d.NH == 0) return;
  DeviceGuard guard(d.device);
  const int dev = d.device;
  const DType dt = d.dt;
  const size_t es = dtype_size(dt);
  const int64_t rep = d.NH / d.G, HD = d.HD, Dv = d.Dv;
  const int64_t gc_max = group_chunk(d, 2 * sizeof(float) + 2 * es);
  const size_t n_sq = static_cast<size_t>(gc_max * d.Tq * d.Tk);
  Scratch S(dev, sizeof(float) * n_sq, s), dP(dev, sizeof(float) * n_sq, s), P(dev, es * n_sq, s),
      dS(dev, es * n_sq, s);
  // GQA: f32 sums of dK (gc, Tk, HD) and dV (gc, Tk, Dv) over each group's heads.
  const size_t n_k = rep > 1 ? static_cast<size_t>(gc_max * d.Tk * HD) : 0;
  const size_t n_v = rep > 1 ? static_cast<size_t>(gc_max * d.Tk * Dv) : 0;
  Scratch dKf(dev, sizeof(float) * n_k, s), dVf(dev, sizeof(float) * n_v, s);
  const cudaStream_t st = stream_of(s);
  for (int64_t b = 0; b < d.B; ++b) {
    for (int64_t g0 = 0; g0 < d.G; g0 += gc_max) {
      const int64_t gc = std::min(gc_max, d.G - g0);
      const MatOperand K{row0(d.k, b, g0, HD, es), d.Tk, HD, d.k.st, HD};
      const MatOperand V{row0(d.v, b, g0, Dv, es), d.Tk, Dv, d.v.st, Dv};
      char* dk = row0(d.dk, b, g0, HD, es);
      char* dv = row0(d.dv, b, g0, Dv, es);
      for (int64_t r = 0; r < rep; ++r) {
        const int64_t h0 = g0 * rep + r;
        const MatOperand Q{row0(d.q, b, h0, HD, es), d.Tq, HD, d.q.st, rep * HD};
        const MatOperand dO{row0(d.dout, b, h0, Dv, es), d.Tq, Dv, d.dout.st, rep * Dv};
        // S = scale · Q · Kᵀ ;  dP = dO · Vᵀ   (gc, Tq, Tk) f32
        strided_matmul(dev, s, dt, DType::F32, Q, false, K, true, S.get(), d.Tk, d.Tq * d.Tk, gc, scale, 0.0f);
        strided_matmul(dev, s, dt, DType::F32, dO, false, V, true, dP.get(), d.Tk, d.Tq * d.Tk, gc, 1.0f, 0.0f);
        const int64_t rows = gc * d.Tq;
        const int grid = static_cast<int>((rows + kWarpsPerBlock - 1) / kWarpsPerBlock);
        MPT_DISPATCH_DEV_FLOAT(dt, "attention_backward", [&](auto tag) {
          using T = decltype(tag);
          MPT_LAUNCH(grid, 32 * kWarpsPerBlock, 0, st, masked_softmax_backward_kernel<T>)(
              S.get<float>(), dP.get<float>(), d.lse + b * d.lse_sb + h0 * d.lse_sh, d.lse_sh,
              reinterpret_cast<const T*>(row0(d.dout, b, h0, Dv, es)), d.dout.st,
              reinterpret_cast<const T*>(row0(d.out, b, h0, Dv, es)), d.out.st, P.get<T>(), dS.get<T>(), rows,
              static_cast<int>(d.Tq), static_cast<int>(d.Tk), static_cast<int>(Dv), static_cast<int>(rep),
              drop_rows(d, drop, b, h0), bias_rows(d, h0));
        });
        MPT_KERNEL_CHECK("attention_backward (softmax)");
        const MatOperand Pm{P.get(), d.Tq, d.Tk, d.Tk, d.Tq * d.Tk};
        const MatOperand dSm{dS.get(), d.Tq, d.Tk, d.Tk, d.Tq * d.Tk};
        // dQ = scale · dS · K   (one head per group)
        strided_matmul(dev, s, dt, dt, dSm, false, K, false, row0(d.dq, b, h0, HD, es), d.dq.st, rep * HD, gc, scale,
                       0.0f);
        if (rep == 1) {  // MHA: dV = Pᵀ · dO ;  dK = scale · dSᵀ · Q straight into the outputs
          strided_matmul(dev, s, dt, dt, Pm, true, dO, false, dv, d.dv.st, Dv, gc, 1.0f, 0.0f);
          strided_matmul(dev, s, dt, dt, dSm, true, Q, false, dk, d.dk.st, HD, gc, scale, 0.0f);
        } else {  // GQA: sum over the group's heads in f32
          const float beta = r == 0 ? 0.0f : 1.0f;
          strided_matmul(dev, s, dt, DType::F32, Pm, true, dO, false, dVf.get(), Dv, d.Tk * Dv, gc, 1.0f, beta);
          strided_matmul(dev, s, dt, DType::F32, dSm, true, Q, false, dKf.get(), HD, d.Tk * HD, gc, scale, beta);
        }
      }
      if (rep > 1) {
        const int64_t nk = gc * d.Tk * HD, nv = gc * d.Tk * Dv;
        MPT_DISPATCH_DEV_FLOAT(dt, "attention_backward", [&](auto tag) {
          using T = decltype(tag);
          MPT_LAUNCH(grid_for(nk, 256), 256, 0, st, store_group_grad_kernel<T>)(
              dKf.get<float>(), reinterpret_cast<T*>(dk), nk, static_cast<int>(d.Tk), static_cast<int>(HD), d.dk.st);
          MPT_LAUNCH(grid_for(nv, 256), 256, 0, st, store_group_grad_kernel<T>)(
              dVf.get<float>(), reinterpret_cast<T*>(dv), nv, static_cast<int>(d.Tk), static_cast<int>(Dv), d.dv.st);
        });
        MPT_KERNEL_CHECK("attention_backward (GQA dK/dV)");
      }
    }
  }
}

}  // namespace mpitron::cuda
