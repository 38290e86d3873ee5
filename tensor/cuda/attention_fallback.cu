// tensor/cuda/attention_fallback.cu — causal attention from cuBLASLt GEMMs and a
// softmax kernel: the path for f32, for shapes cuDNN rejects, for builds without
// cuDNN, and for tests (cuda_attention_force_fallback).
//
//   qkv (B, T, 3, NH, HD), out/dout (B, T, NH, HD), lse (B, NH, T) f32, C = NH·HD.
//   Per batch entry b, heads are a strided batch: head h of Q is the T×HD matrix at
//   qkv + b·T·3C + h·HD with row stride 3C (K at +C, V at +2C); of O at
//   out + b·T·C + h·HD with row stride C. So no permute copies are needed.
//
// Forward, per (b, chunk of heads):
//   S = scale·Q·Kᵀ            (hc, T, T) f32 scratch
//   P = exp(S − lse), causal   (hc, T, T) io dtype; lse = rowwise logsumexp of S (j ≤ i)
//   O = P·V
// Backward (P recomputed from S and lse, as flash attention does):
//   dP = dO·Vᵀ, D_i = Σ_d dO_id·O_id, dS = P ⊙ (dP − D)
//   dV = Pᵀ·dO,  dQ = scale·dS·K,  dK = scale·dSᵀ·Q
// Scratch comes from the caching allocator; heads are processed in chunks so it
// stays under ~512 MiB whatever T is. P and dS are rounded to the io dtype before
// their GEMMs (as flash attention kernels do); all accumulation is f32.
#include <algorithm>

#include "tensor/cuda/common.cuh"
#include "tensor/cuda/internal.h"

namespace mpitron::cuda {

namespace {
constexpr int kWarpsPerBlock = 8;
constexpr size_t kScratchBudget = size_t(512) << 20;

struct AttnDims {
  int64_t B, T, NH, HD, C;
};
AttnDims attn_dims(const Tensor& qkv) {
  const int64_t nh = qkv.dim(3), hd = qkv.dim(4);
  return {qkv.dim(0), qkv.dim(1), nh, hd, nh * hd};
}

// Heads per chunk so that `bytes_per_elem`·hc·T² fits the budget.
int64_t head_chunk(const AttnDims& d, size_t bytes_per_elem) {
  const size_t per_head = bytes_per_elem * static_cast<size_t>(d.T) * static_cast<size_t>(d.T);
  return std::max<int64_t>(1, std::min<int64_t>(d.NH, static_cast<int64_t>(kScratchBudget / std::max<size_t>(per_head, 1))));
}

// Row r = h·T + i of S (hc·T rows of length T): lse and P for the causal row.
template <typename T>
__global__ void causal_softmax_forward_kernel(const float* S, T* P, float* lse, int64_t rows, int t_len) {
  const int lane = threadIdx.x & 31;
  const int64_t r = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + (threadIdx.x >> 5);
  if (r >= rows) return;
  const int i = static_cast<int>(r % t_len);
  const float* sr = S + r * t_len;
  T* pr = P + r * t_len;
  float m = -INFINITY;
  for (int j = lane; j <= i; j += 32) m = fmaxf(m, sr[j]);
  m = warp_max(m);
  float sum = 0.0f;
  for (int j = lane; j <= i; j += 32) sum += expf(sr[j] - m);
  sum = warp_sum(sum);
  const float l = m + logf(sum);
  for (int j = lane; j < t_len; j += 32) pr[j] = from_float<T>(j <= i ? expf(sr[j] - l) : 0.0f);
  if (lane == 0) lse[r] = l;
}

// Row r = h·T + i: P = exp(S − lse) (causal), dS = P ⊙ (dP − D_i), D_i = dO_i·O_i.
// dout/out point at head h0 of batch b; head h's row i is at (i·NH + h)·HD.
template <typename T>
__global__ void causal_softmax_backward_kernel(const float* S, const float* dP, const float* lse, const T* dout,
                                               const T* out, T* P, T* dS, int64_t rows, int t_len, int nh, int hd) {
  const int lane = threadIdx.x & 31;
  const int64_t r = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + (threadIdx.x >> 5);
  if (r >= rows) return;
  const int i = static_cast<int>(r % t_len);
  const int64_t h = r / t_len;
  const int64_t o_off = (static_cast<int64_t>(i) * nh + h) * hd;
  float dsum = 0.0f;
  for (int d = lane; d < hd; d += 32) dsum += to_float(dout[o_off + d]) * to_float(out[o_off + d]);
  dsum = warp_sum(dsum);
  const float l = lse[r];
  const float* sr = S + r * t_len;
  const float* dpr = dP + r * t_len;
  T* pr = P + r * t_len;
  T* dsr = dS + r * t_len;
  for (int j = lane; j < t_len; j += 32) {
    const float p = j <= i ? expf(sr[j] - l) : 0.0f;
    pr[j] = from_float<T>(p);
    dsr[j] = from_float<T>(p * (dpr[j] - dsum));
  }
}
}  // namespace

void attention_forward_fallback(const Tensor& qkv, const Tensor& out, const Tensor& lse, float scale, Stream s) {
  DeviceGuard g(qkv);
  const AttnDims d = attn_dims(qkv);
  if (d.B * d.T * d.NH == 0) return;
  const int dev = qkv.device().index;
  const DType dt = qkv.dtype();
  const size_t es = dtype_size(dt);
  const int64_t hc_max = head_chunk(d, sizeof(float) + es);
  Scratch S(dev, sizeof(float) * hc_max * d.T * d.T, s), P(dev, es * hc_max * d.T * d.T, s);
  const cudaStream_t st = stream_of(s);
  const char* base = static_cast<const char*>(qkv.data_ptr());
  char* obase = static_cast<char*>(out.data_ptr());
  float* lse_p = static_cast<float*>(lse.data_ptr());
  for (int64_t b = 0; b < d.B; ++b) {
    for (int64_t h0 = 0; h0 < d.NH; h0 += hc_max) {
      const int64_t hc = std::min(hc_max, d.NH - h0);
      const char* q = base + ((b * d.T * 3 * d.C) + h0 * d.HD) * es;
      const MatOperand Q{q, d.T, d.HD, 3 * d.C, d.HD};
      const MatOperand K{q + d.C * es, d.T, d.HD, 3 * d.C, d.HD};
      const MatOperand V{q + 2 * d.C * es, d.T, d.HD, 3 * d.C, d.HD};
      // S (hc, T, T) = scale · Q · Kᵀ
      strided_matmul(dev, s, dt, DType::F32, Q, false, K, true, S.get(), d.T, d.T * d.T, hc, scale, 0.0f);
      const int64_t rows = hc * d.T;
      const int grid = static_cast<int>((rows + kWarpsPerBlock - 1) / kWarpsPerBlock);
      MPT_DISPATCH_DEV_FLOAT(dt, "attention_forward", [&](auto tag) {
        using T = decltype(tag);
        MPT_LAUNCH(grid, 32 * kWarpsPerBlock, 0, st, causal_softmax_forward_kernel<T>)(
            S.get<float>(), P.get<T>(), lse_p + (b * d.NH + h0) * d.T, rows, static_cast<int>(d.T));
      });
      MPT_KERNEL_CHECK("attention_forward (softmax)");
      // O (hc heads, T, HD) = P · V, written into out (B, T, NH, HD)
      const MatOperand Pm{P.get(), d.T, d.T, d.T, d.T * d.T};
      strided_matmul(dev, s, dt, dt, Pm, false, V, false, obase + (b * d.T * d.C + h0 * d.HD) * es, d.C, d.HD, hc,
                     1.0f, 0.0f);
    }
  }
}

void attention_backward_fallback(const Tensor& dout, const Tensor& qkv, const Tensor& out, const Tensor& lse,
                                 const Tensor& dqkv, float scale, Stream s) {
  DeviceGuard g(qkv);
  const AttnDims d = attn_dims(qkv);
  if (d.B * d.T * d.NH == 0) return;
  const int dev = qkv.device().index;
  const DType dt = qkv.dtype();
  const size_t es = dtype_size(dt);
  const int64_t hc_max = head_chunk(d, 2 * sizeof(float) + 2 * es);
  const size_t n_sq = static_cast<size_t>(hc_max * d.T * d.T);
  Scratch S(dev, sizeof(float) * n_sq, s), dP(dev, sizeof(float) * n_sq, s), P(dev, es * n_sq, s),
      dS(dev, es * n_sq, s);
  const cudaStream_t st = stream_of(s);
  const char* base = static_cast<const char*>(qkv.data_ptr());
  char* dbase = static_cast<char*>(dqkv.data_ptr());
  const char* do_base = static_cast<const char*>(dout.data_ptr());
  const char* o_base = static_cast<const char*>(out.data_ptr());
  const float* lse_p = static_cast<const float*>(lse.data_ptr());
  for (int64_t b = 0; b < d.B; ++b) {
    for (int64_t h0 = 0; h0 < d.NH; h0 += hc_max) {
      const int64_t hc = std::min(hc_max, d.NH - h0);
      const int64_t qoff = (b * d.T * 3 * d.C + h0 * d.HD) * es, ooff = (b * d.T * d.C + h0 * d.HD) * es;
      const char* q = base + qoff;
      const MatOperand Q{q, d.T, d.HD, 3 * d.C, d.HD};
      const MatOperand K{q + d.C * es, d.T, d.HD, 3 * d.C, d.HD};
      const MatOperand V{q + 2 * d.C * es, d.T, d.HD, 3 * d.C, d.HD};
      const MatOperand dO{do_base + ooff, d.T, d.HD, d.C, d.HD};
      char* dq = dbase + qoff;
      // S = scale · Q · Kᵀ ;  dP = dO · Vᵀ   (hc, T, T) f32
      strided_matmul(dev, s, dt, DType::F32, Q, false, K, true, S.get(), d.T, d.T * d.T, hc, scale, 0.0f);
      strided_matmul(dev, s, dt, DType::F32, dO, false, V, true, dP.get(), d.T, d.T * d.T, hc, 1.0f, 0.0f);
      const int64_t rows = hc * d.T;
      const int grid = static_cast<int>((rows + kWarpsPerBlock - 1) / kWarpsPerBlock);
      MPT_DISPATCH_DEV_FLOAT(dt, "attention_backward", [&](auto tag) {
        using T = decltype(tag);
        MPT_LAUNCH(grid, 32 * kWarpsPerBlock, 0, st, causal_softmax_backward_kernel<T>)(
            S.get<float>(), dP.get<float>(), lse_p + (b * d.NH + h0) * d.T,
            reinterpret_cast<const T*>(do_base + ooff), reinterpret_cast<const T*>(o_base + ooff), P.get<T>(),
            dS.get<T>(), rows, static_cast<int>(d.T), static_cast<int>(d.NH), static_cast<int>(d.HD));
      });
      MPT_KERNEL_CHECK("attention_backward (softmax)");
      const MatOperand Pm{P.get(), d.T, d.T, d.T, d.T * d.T};
      const MatOperand dSm{dS.get(), d.T, d.T, d.T, d.T * d.T};
      // dV = Pᵀ · dO ;  dQ = scale · dS · K ;  dK = scale · dSᵀ · Q   (into dqkv's layout)
      strided_matmul(dev, s, dt, dt, Pm, true, dO, false, dq + 2 * d.C * es, 3 * d.C, d.HD, hc, 1.0f, 0.0f);
      strided_matmul(dev, s, dt, dt, dSm, false, K, false, dq, 3 * d.C, d.HD, hc, scale, 0.0f);
      strided_matmul(dev, s, dt, dt, dSm, true, Q, false, dq + d.C * es, 3 * d.C, d.HD, hc, scale, 0.0f);
    }
  }
}

}  // namespace mpitron::cuda
