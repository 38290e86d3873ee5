// tensor/cuda/attention_fallback.cu — attention (causal, or bidirectional with a key
// padding mask) from cuBLASLt GEMMs and a masked softmax kernel: the path for f32, for shapes cuDNN rejects, for builds without
// cuDNN, and for tests (cuda_attention_force_fallback).
//
//   qkv (B, T, NH + 2G, HD) (or the 5-D MHA form, G = NH), out/dout (B, T, NH, HD),
//   lse (B, NH, T) f32, C = NH·HD, W = (NH + 2G)·HD, rep = NH/G. Head h = g·rep + r
//   (kv group g, r < rep) of Q is the T×HD matrix at qkv + b·T·W + h·HD with row
//   stride W; K of group g at column (NH + g)·HD, V at (NH + G + g)·HD; O of head h
//   at out + b·T·C + h·HD with row stride C. So no permute copies are needed.
//   For a fixed r, the heads g·rep + r of a chunk of groups are one strided batch
//   (Q batch stride rep·HD, K and V batch stride HD); MHA (rep = 1) is one batch
//   over the chunk's heads.
//
// Forward, per (b, chunk of groups, r):
//   S = scale·Q·Kᵀ            (hc, T, T) f32 scratch
//   P = exp(S − lse), masked   (hc, T, T) io dtype; lse = rowwise logsumexp of S (j < hi)
//   O = P·V
// Backward (P recomputed from S and lse, as flash attention does):
//   dP = dO·Vᵀ, D_i = Σ_d dO_id·O_id, dS = P ⊙ (dP − D)
//   dV = Pᵀ·dO,  dQ = scale·dS·K,  dK = scale·dSᵀ·Q
// With rep > 1, dK and dV of a group sum over its rep heads: they accumulate in f32
// scratch (GEMM beta = 1 after the first r) and are rounded into dqkv once.
// Scratch comes from the caching allocator; groups are processed in chunks so it
// stays under ~512 MiB whatever T is. P and dS are rounded to the io dtype before
// their GEMMs (as flash attention kernels do); all accumulation is f32.
// Attention dropout (attention.h): the kernels multiply P by M/(1 − p) before
// P·V (forward) and Pᵀ·dO (backward) and mask dP before dS, M from attention_keep
// for (b, first_head + local head, i, j) — the CPU path's mask exactly.
// Masking (attention.h's AttentionMask): row i of sample b sees keys j < hi =
// min(len_b, causal ? i + 1 : T), len_b read on the device from kv_lengths and
// clamped to [0, T]; the full T×T GEMMs run regardless and the kernels write P = dS
// = 0 beyond hi, so padded keys get dK = dV = 0; a row with hi = 0 gets out 0,
// lse −∞.
#include <algorithm>

#include "tensor/attention.h"
#include "tensor/cuda/common.cuh"
#include "tensor/cuda/internal.h"

namespace mpitron::cuda {

namespace {
constexpr int kWarpsPerBlock = 8;
constexpr size_t kScratchBudget = size_t(512) << 20;

struct AttnDims {
  int64_t B, T, NH, G, HD, C, W, rep;
};
AttnDims attn_dims(const Tensor& qkv, const Tensor& out) {
  const int64_t nh = out.dim(2), hd = out.dim(3);
  const int64_t heads = qkv.ndim() == 5 ? 3 * qkv.dim(3) : qkv.dim(2), g = (heads - nh) / 2;
  return {out.dim(0), out.dim(1), nh, g, hd, nh * hd, heads * hd, nh / g};
}

// Groups per chunk so that `bytes_per_elem`·gc·T² fits the budget.
int64_t group_chunk(const AttnDims& d, size_t bytes_per_elem) {
  const size_t per_group = bytes_per_elem * static_cast<size_t>(d.T) * static_cast<size_t>(d.T);
  return std::max<int64_t>(1, std::min<int64_t>(d.G, static_cast<int64_t>(kScratchBudget / std::max<size_t>(per_group, 1))));
}

// Row r = k·T + i of S (gc·T rows of length T; batch entry k is head h0 + k·head_step):
// lse and P for the causal row. lse points at head h0's row (B, NH, T) layout.
// Mask and dropout of one kernel launch: batch entry k of the launch is global head
// head0 + k·head_step of batch b.
struct DropRows {
  float p;  // 0: no dropout
  uint64_t seed, offset;
  int64_t b, head0;
  const int32_t* kv_len;  // (B) on the device, or null: every key
  bool causal;
  // Row i sees keys j < hi(i).
  __device__ int hi(int i, int t_len) const {
    int len = kv_len ? kv_len[b] : t_len;
    len = len < 0 ? 0 : len > t_len ? t_len : len;
    return causal && i + 1 < len ? i + 1 : len;
  }
  // M/(1 − p) at (k, i, j)
  __device__ float keep(int64_t k, int i, int j, int t_len, int head_step) const {
    if (p == 0.0f) return 1.0f;
    return attention_keep(seed, offset, b, head0 + k * head_step, i, j, t_len, p) ? 1.0f / (1.0f - p) : 0.0f;
  }
};

template <typename T>
__global__ void masked_softmax_forward_kernel(const float* S, T* P, float* lse, int64_t rows, int t_len,
                                              int head_step, DropRows dr) {
  const int lane = threadIdx.x & 31;
  const int64_t r = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + (threadIdx.x >> 5);
  if (r >= rows) return;
  const int i = static_cast<int>(r % t_len);
  const int hi = dr.hi(i, t_len);
  const float* sr = S + r * t_len;
  T* pr = P + r * t_len;
  float m = -INFINITY;
  for (int j = lane; j < hi; j += 32) m = fmaxf(m, sr[j]);
  m = warp_max(m);
  float sum = 0.0f;
  for (int j = lane; j < hi; j += 32) sum += expf(sr[j] - m);
  sum = warp_sum(sum);
  const float l = hi > 0 ? m + logf(sum) : -INFINITY;  // no visible key: P = 0, lse −∞
  const int64_t k = r / t_len;
  for (int j = lane; j < t_len; j += 32)
    pr[j] = from_float<T>(j < hi ? expf(sr[j] - l) * dr.keep(k, i, j, t_len, head_step) : 0.0f);
  if (lane == 0) lse[(r / t_len) * head_step * t_len + i] = l;
}

// Row r = k·T + i: P = exp(S − lse) (masked: 0 for j >= hi), dS = P ⊙ (dP·M/(1−p) − D_i), D_i = dO_i·O_i;
// the P written (for dV) is P·M/(1 − p).
// dout/out/lse point at head h0 of batch b; batch entry k is head h0 + k·head_step,
// whose row i is at (i·NH + k·head_step)·HD.
template <typename T>
__global__ void masked_softmax_backward_kernel(const float* S, const float* dP, const float* lse, const T* dout,
                                               const T* out, T* P, T* dS, int64_t rows, int t_len, int nh, int hd,
                                               int head_step, DropRows dr) {
  const int lane = threadIdx.x & 31;
  const int64_t r = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + (threadIdx.x >> 5);
  if (r >= rows) return;
  const int i = static_cast<int>(r % t_len);
  const int64_t h = (r / t_len) * head_step;
  const int64_t o_off = (static_cast<int64_t>(i) * nh + h) * hd;
  float dsum = 0.0f;
  for (int d = lane; d < hd; d += 32) dsum += to_float(dout[o_off + d]) * to_float(out[o_off + d]);
  dsum = warp_sum(dsum);
  const float l = lse[h * t_len + i];
  const float* sr = S + r * t_len;
  const float* dpr = dP + r * t_len;
  T* pr = P + r * t_len;
  T* dsr = dS + r * t_len;
  const int hi = dr.hi(i, t_len);
  for (int j = lane; j < t_len; j += 32) {
    const float p = j < hi ? expf(sr[j] - l) : 0.0f;
    const float m = j < hi ? dr.keep(r / t_len, i, j, t_len, head_step) : 0.0f;
    pr[j] = from_float<T>(p * m);
    dsr[j] = from_float<T>(p * (dpr[j] * m - dsum));
  }
}

// dst (T rows of stride W) ← src (gc, T, HD) f32: group k's rows land at column k·HD.
// Rounds the f32-accumulated dK or dV of a chunk of groups into dqkv.
template <typename T>
__global__ void store_group_grad_kernel(const float* src, T* dst, int64_t n, int t_len, int hd, int64_t w) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t e = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; e < n; e += stride) {
    const int64_t k = e / (static_cast<int64_t>(t_len) * hd), i = (e / hd) % t_len, c = e % hd;
    dst[i * w + k * hd + c] = from_float<T>(src[e]);
  }
}
}  // namespace

void attention_forward_fallback(const Tensor& qkv, const Tensor& out, const Tensor& lse, float scale,
                                const AttentionDropout& drop, const AttentionMask& mask, Stream s) {
  DeviceGuard g(qkv);
  const AttnDims d = attn_dims(qkv, out);
  if (d.B * d.T * d.NH == 0) return;
  const int dev = qkv.device().index;
  const DType dt = qkv.dtype();
  const size_t es = dtype_size(dt);
  const int64_t gc_max = group_chunk(d, sizeof(float) + es);
  Scratch S(dev, sizeof(float) * gc_max * d.T * d.T, s), P(dev, es * gc_max * d.T * d.T, s);
  const cudaStream_t st = stream_of(s);
  const char* base = static_cast<const char*>(qkv.data_ptr());
  char* obase = static_cast<char*>(out.data_ptr());
  float* lse_p = static_cast<float*>(lse.data_ptr());
  const int32_t* kv_len = mask.kv_lengths.defined() ? static_cast<const int32_t*>(mask.kv_lengths.data_ptr()) : nullptr;
  for (int64_t b = 0; b < d.B; ++b) {
    for (int64_t g0 = 0; g0 < d.G; g0 += gc_max) {
      const int64_t gc = std::min(gc_max, d.G - g0);
      const char* qb = base + b * d.T * d.W * es;
      const MatOperand K{qb + (d.NH + g0) * d.HD * es, d.T, d.HD, d.W, d.HD};
      const MatOperand V{qb + (d.NH + d.G + g0) * d.HD * es, d.T, d.HD, d.W, d.HD};
      for (int64_t r = 0; r < d.rep; ++r) {
        const int64_t h0 = g0 * d.rep + r;  // heads h0, h0 + rep, … (one per group of the chunk)
        const MatOperand Q{qb + h0 * d.HD * es, d.T, d.HD, d.W, d.rep * d.HD};
        // S (gc, T, T) = scale · Q · Kᵀ
        strided_matmul(dev, s, dt, DType::F32, Q, false, K, true, S.get(), d.T, d.T * d.T, gc, scale, 0.0f);
        const int64_t rows = gc * d.T;
        const int grid = static_cast<int>((rows + kWarpsPerBlock - 1) / kWarpsPerBlock);
        MPT_DISPATCH_DEV_FLOAT(dt, "attention_forward", [&](auto tag) {
          using T = decltype(tag);
          MPT_LAUNCH(grid, 32 * kWarpsPerBlock, 0, st, masked_softmax_forward_kernel<T>)(
              S.get<float>(), P.get<T>(), lse_p + (b * d.NH + h0) * d.T, rows, static_cast<int>(d.T),
              static_cast<int>(d.rep), DropRows{drop.p, drop.seed, drop.offset, b, drop.first_head + h0, kv_len, mask.causal});
        });
        MPT_KERNEL_CHECK("attention_forward (softmax)");
        // O (gc heads, T, HD) = P · V, written into out (B, T, NH, HD)
        const MatOperand Pm{P.get(), d.T, d.T, d.T, d.T * d.T};
        strided_matmul(dev, s, dt, dt, Pm, false, V, false, obase + (b * d.T * d.C + h0 * d.HD) * es, d.C,
                       d.rep * d.HD, gc, 1.0f, 0.0f);
      }
    }
  }
}

void attention_backward_fallback(const Tensor& dout, const Tensor& qkv, const Tensor& out, const Tensor& lse,
                                 const Tensor& dqkv, float scale, const AttentionDropout& drop,
                                 const AttentionMask& mask, Stream s) {
  DeviceGuard g(qkv);
  const AttnDims d = attn_dims(qkv, out);
  if (d.B * d.T * d.NH == 0) return;
  const int dev = qkv.device().index;
  const DType dt = qkv.dtype();
  const size_t es = dtype_size(dt);
  const int64_t gc_max = group_chunk(d, 2 * sizeof(float) + 2 * es);
  const size_t n_sq = static_cast<size_t>(gc_max * d.T * d.T);
  Scratch S(dev, sizeof(float) * n_sq, s), dP(dev, sizeof(float) * n_sq, s), P(dev, es * n_sq, s),
      dS(dev, es * n_sq, s);
  // GQA: f32 sums of dK and dV over each group's heads (gc, T, HD).
  const size_t n_kv = d.rep > 1 ? static_cast<size_t>(gc_max * d.T * d.HD) : 0;
  Scratch dKf(dev, sizeof(float) * n_kv, s), dVf(dev, sizeof(float) * n_kv, s);
  const cudaStream_t st = stream_of(s);
  const char* base = static_cast<const char*>(qkv.data_ptr());
  char* dbase = static_cast<char*>(dqkv.data_ptr());
  const char* do_base = static_cast<const char*>(dout.data_ptr());
  const char* o_base = static_cast<const char*>(out.data_ptr());
  const float* lse_p = static_cast<const float*>(lse.data_ptr());
  const int32_t* kv_len = mask.kv_lengths.defined() ? static_cast<const int32_t*>(mask.kv_lengths.data_ptr()) : nullptr;
  for (int64_t b = 0; b < d.B; ++b) {
    for (int64_t g0 = 0; g0 < d.G; g0 += gc_max) {
      const int64_t gc = std::min(gc_max, d.G - g0);
      const char* qb = base + b * d.T * d.W * es;
      char* db = dbase + b * d.T * d.W * es;
      const int64_t koff = (d.NH + g0) * d.HD * es, voff = (d.NH + d.G + g0) * d.HD * es;
      const MatOperand K{qb + koff, d.T, d.HD, d.W, d.HD};
      const MatOperand V{qb + voff, d.T, d.HD, d.W, d.HD};
      for (int64_t r = 0; r < d.rep; ++r) {
        const int64_t h0 = g0 * d.rep + r;
        const int64_t ooff = (b * d.T * d.C + h0 * d.HD) * es;
        const MatOperand Q{qb + h0 * d.HD * es, d.T, d.HD, d.W, d.rep * d.HD};
        const MatOperand dO{do_base + ooff, d.T, d.HD, d.C, d.rep * d.HD};
        // S = scale · Q · Kᵀ ;  dP = dO · Vᵀ   (gc, T, T) f32
        strided_matmul(dev, s, dt, DType::F32, Q, false, K, true, S.get(), d.T, d.T * d.T, gc, scale, 0.0f);
        strided_matmul(dev, s, dt, DType::F32, dO, false, V, true, dP.get(), d.T, d.T * d.T, gc, 1.0f, 0.0f);
        const int64_t rows = gc * d.T;
        const int grid = static_cast<int>((rows + kWarpsPerBlock - 1) / kWarpsPerBlock);
        MPT_DISPATCH_DEV_FLOAT(dt, "attention_backward", [&](auto tag) {
          using T = decltype(tag);
          MPT_LAUNCH(grid, 32 * kWarpsPerBlock, 0, st, masked_softmax_backward_kernel<T>)(
              S.get<float>(), dP.get<float>(), lse_p + (b * d.NH + h0) * d.T,
              reinterpret_cast<const T*>(do_base + ooff), reinterpret_cast<const T*>(o_base + ooff), P.get<T>(),
              dS.get<T>(), rows, static_cast<int>(d.T), static_cast<int>(d.NH), static_cast<int>(d.HD),
              static_cast<int>(d.rep), DropRows{drop.p, drop.seed, drop.offset, b, drop.first_head + h0, kv_len, mask.causal});
        });
        MPT_KERNEL_CHECK("attention_backward (softmax)");
        const MatOperand Pm{P.get(), d.T, d.T, d.T, d.T * d.T};
        const MatOperand dSm{dS.get(), d.T, d.T, d.T, d.T * d.T};
        // dQ = scale · dS · K   (into dqkv's layout, one head per group)
        strided_matmul(dev, s, dt, dt, dSm, false, K, false, db + h0 * d.HD * es, d.W, d.rep * d.HD, gc, scale, 0.0f);
        if (d.rep == 1) {  // MHA: dV = Pᵀ · dO ;  dK = scale · dSᵀ · Q straight into dqkv
          strided_matmul(dev, s, dt, dt, Pm, true, dO, false, db + voff, d.W, d.HD, gc, 1.0f, 0.0f);
          strided_matmul(dev, s, dt, dt, dSm, true, Q, false, db + koff, d.W, d.HD, gc, scale, 0.0f);
        } else {  // GQA: sum over the group's heads in f32
          const float beta = r == 0 ? 0.0f : 1.0f;
          strided_matmul(dev, s, dt, DType::F32, Pm, true, dO, false, dVf.get(), d.HD, d.T * d.HD, gc, 1.0f, beta);
          strided_matmul(dev, s, dt, DType::F32, dSm, true, Q, false, dKf.get(), d.HD, d.T * d.HD, gc, scale, beta);
        }
      }
      if (d.rep > 1) {
        const int64_t n = gc * d.T * d.HD;
        MPT_DISPATCH_DEV_FLOAT(dt, "attention_backward", [&](auto tag) {
          using T = decltype(tag);
          MPT_LAUNCH(grid_for(n, 256), 256, 0, st, store_group_grad_kernel<T>)(
              dKf.get<float>(), reinterpret_cast<T*>(db + koff), n, static_cast<int>(d.T), static_cast<int>(d.HD), d.W);
          MPT_LAUNCH(grid_for(n, 256), 256, 0, st, store_group_grad_kernel<T>)(
              dVf.get<float>(), reinterpret_cast<T*>(db + voff), n, static_cast<int>(d.T), static_cast<int>(d.HD), d.W);
        });
        MPT_KERNEL_CHECK("attention_backward (GQA dK/dV)");
      }
    }
  }
}

}  // namespace mpitron::cuda
