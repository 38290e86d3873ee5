// tensor/cuda/moe_router.cu — the MoE router's scores (tensor/moe_router.h).
//   forward:  one warp per row (8 rows a block): the row's logsumexp, then k passes over
//             its E selection scores, each a warp arg-max over the elements after the
//             previous pick in the order (score descending, expert ascending) — the choice
//             of tensor/moe_topk.cu with no taken set. Choice j's value is written by lane
//             j % 32, which also normalises it afterwards (no lane reads another's writes).
//   aux_sums: a separate pair of kernels recomputes a[n, e] from logits and the row
//             statistic the forward left in scratch (lse, or 1 / (Σ sigmoid + ε)): one
//             thread per (64-row chunk, expert) sums its rows in order, then one thread per
//             expert sums the chunks in order. No atomics; the order depends on N only, so
//             every GPU gives the same bits.
//   backward: one warp per row recomputes the row's statistics from logits and the given
//             indices and writes its E gradients (lane e sums its choices in j order).
//   groups:   (group-limited routing, moe_router.h) before the k passes, lane l scores groups l
//             and l + 32 (at most kMoeMaxGroups = 64): m passes over the group's E/ng selection
//             scores, the picks added largest first (the CPU's adds in the CPU's order); then
//             group_topk warp arg-max passes over the group scores find the last kept group, each
//             lane marks its kept groups in a 64-bit mask and a warp OR gives every lane the
//             whole mask; the k passes skip experts outside it.
// A warp per row suits E of tens to a few hundred (E / 32 elements per lane, no shared
// memory); k passes cost k·E / 32 reads per lane, from L1.
#include "tensor/cuda/common.cuh"
#include "tensor/cuda/ops.h"

namespace mpitron::cuda {

namespace {
constexpr int kWarps = 8;         // rows per block (forward, backward)
constexpr int kAuxRows = 64;      // rows per aux partial: fixed, so the sums' order depends on N only
constexpr int kAuxThreads = 128;  // experts per aux block
constexpr float kSigEps = 1e-20f;

struct Params {
  bool sigmoid, pre_softmax;
  int k;
  float scaling;
  const float* bias;  // (E) or null
  int ng, group_topk, group_m;  // group-limited routing: groups (0: none), groups kept, experts per group score
};

__device__ __forceinline__ float sigmoid_f(float x) { return 1.0f / (1.0f + expf(-x)); }
// σ'(x) = σ(x)·σ(−x), without the cancellation of 1 − σ for large x.
__device__ __forceinline__ float sigmoid_grad_f(float x) {
  const float t = expf(-fabsf(x));
  return t / ((1.0f + t) * (1.0f + t));
}
__device__ __forceinline__ float sel_key(float v) { return v != v ? -INFINITY : v; }  // NaN ranks lowest

__device__ __forceinline__ float warp_lse(const float* x, int E, int lane) {
  float m = -INFINITY;
  for (int e = lane; e < E; e += 32) m = fmaxf(m, x[e]);
  m = warp_max(m);
  float s = 0.0f;
  for (int e = lane; e < E; e += 32) s += expf(x[e] - m);
  return m + logf(warp_sum(s));
}

// The larger (value, expert) of the warp in the order (value descending, expert ascending), to every lane.
__device__ __forceinline__ void warp_argmax(float& v, int& e) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const float v2 = __shfl_xor_sync(0xffffffffu, v, o);
    const int e2 = __shfl_xor_sync(0xffffffffu, e, o);
    if (v2 > v || (v2 == v && e2 < e)) v = v2, e = e2;
  }
}

// The order of the top-k passes: is (v, e) after the previous pick (last_v, last_e) — descending
// values, ascending indices among equals; last_e < 0: nothing picked yet.
__device__ __forceinline__ bool after(float v, int e, float last_v, int last_e) {
  return last_e < 0 || v < last_v || (v == last_v && e > last_e);
}

// The kept groups of a row (bit g), to every lane; key(e): the selection score of expert e.
template <typename Key>
__device__ unsigned long long kept_groups(const Key& key, int E, const Params& p, int lane) {
  const int per = E / p.ng;
  float gs[2];  // the scores of groups lane and lane + 32 (−inf: no such group)
  for (int s = 0; s < 2; ++s) {
    const int g = lane + 32 * s;
    gs[s] = -INFINITY;
    if (g >= p.ng) continue;
    float sum = 0.0f, last_v = 0.0f;
    int last_e = -1;
    for (int j = 0; j < p.group_m; ++j) {  // the group's m largest, added largest first
      float bv = -INFINITY;
      int be = per;
      for (int e = 0; e < per; ++e) {
        const float v = key(g * per + e);
        if (after(v, e, last_v, last_e) && (v > bv || (v == bv && e < be))) bv = v, be = e;
      }
      last_v = bv, last_e = be;
      sum += bv;
    }
    gs[s] = sel_key(sum);
  }
  float tv = 0.0f;  // the group_topk-th best group (tv, te)
  int te = -1;
  for (int j = 0; j < p.group_topk; ++j) {
    float bv = -INFINITY;
    int be = p.ng;
    for (int s = 0; s < 2; ++s) {
      const int g = lane + 32 * s;
      if (g < p.ng && after(gs[s], g, tv, te) && (gs[s] > bv || (gs[s] == bv && g < be))) bv = gs[s], be = g;
    }
    warp_argmax(bv, be);
    tv = bv, te = be;
  }
  unsigned long long mask = 0;
  for (int s = 0; s < 2; ++s) {
    const int g = lane + 32 * s;
    if (g < p.ng && !after(gs[s], g, tv, te)) mask |= 1ull << g;
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) mask |= __shfl_xor_sync(0xffffffffu, mask, o);
  return mask;
}

__global__ void router_forward_kernel(const float* logits, int64_t N, int E, Params p, float* probs, int32_t* idx,
                                      float* lse_out, float* stat) {
  const int lane = threadIdx.x & 31;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kWarps + (threadIdx.x >> 5);
  if (row >= N) return;  // the whole warp
  const float* x = logits + row * E;
  const int k = p.k;
  const float lse = (!p.sigmoid || lse_out) ? warp_lse(x, E, lane) : 0.0f;
  if (lse_out && lane == 0) lse_out[row] = lse;
  if (stat) {  // what the aux kernels need of this row
    if (p.sigmoid) {
      float t = 0.0f;
      for (int e = lane; e < E; e += 32) t += sigmoid_f(x[e]);
      t = warp_sum(t);
      if (lane == 0) stat[row] = 1.0f / (t + kSigEps);
    } else if (lane == 0) {
      stat[row] = lse;
    }
  }
  if (!probs && !idx) return;
  auto raw = [&](int e) { return p.sigmoid ? sigmoid_f(x[e]) : p.pre_softmax ? expf(x[e] - lse) : x[e]; };
  auto key = [&](int e) { return sel_key(raw(e) + (p.bias ? p.bias[e] : 0.0f)); };
  const unsigned long long kept = p.ng > 0 ? kept_groups(key, E, p, lane) : ~0ull;
  const int per = p.ng > 0 ? E / p.ng : E;
  float* pr = probs ? probs + row * k : nullptr;
  float last_v = 0.0f, zm = -INFINITY, S = 0.0f;
  int last_e = -1;
  for (int j = 0; j < k; ++j) {
    float bv = -INFINITY;
    int be = E;
    for (int e = lane; e < E; e += 32) {
      if (!((kept >> (e / per)) & 1ull)) continue;  // outside the kept groups
      const float v = key(e);
      if (after(v, e, last_v, last_e) && (v > bv || (v == bv && e < be))) bv = v, be = e;
    }
    warp_argmax(bv, be);
    last_v = bv, last_e = be;
    const float r = raw(be);
    zm = fmaxf(zm, r);
    S += r;
    if (lane == (j & 31)) {
      if (idx) idx[row * k + j] = be;
      if (pr) pr[j] = r;  // finished below by this lane
    }
  }
  if (!pr) return;
  if (p.sigmoid || p.pre_softmax) {
    const float f = p.sigmoid && k > 1 ? p.scaling / (S + kSigEps) : p.scaling;
    for (int j = lane; j < k; j += 32) pr[j] *= f;
  } else {  // softmax over the selected logits
    float zs = 0.0f;
    for (int j = lane; j < k; j += 32) zs += expf(pr[j] - zm);
    const float f = p.scaling / warp_sum(zs);
    for (int j = lane; j < k; j += 32) pr[j] = expf(pr[j] - zm) * f;
  }
}

__global__ void router_aux_partials_kernel(const float* logits, const float* stat, int64_t N, int E, bool sigmoid,
                                           int64_t chunks, float* partial) {
  const int e = blockIdx.x * blockDim.x + threadIdx.x;
  if (e >= E) return;
  for (int64_t c = blockIdx.y; c < chunks; c += gridDim.y) {
    const int64_t n1 = (c + 1) * kAuxRows < N ? (c + 1) * kAuxRows : N;
    float acc = 0.0f;
    for (int64_t n = c * kAuxRows; n < n1; ++n) {
      const float x = logits[n * E + e];
      acc += sigmoid ? sigmoid_f(x) * stat[n] : expf(x - stat[n]);
    }
    partial[c * E + e] = acc;
  }
}

__global__ void router_aux_finalize_kernel(const float* partial, int64_t chunks, int E, float* out) {
  const int e = blockIdx.x * blockDim.x + threadIdx.x;
  if (e >= E) return;
  float acc = 0.0f;
  for (int64_t c = 0; c < chunks; ++c) acc += partial[c * E + e];
  out[e] = acc;
}

__global__ void router_backward_kernel(const float* dprobs, const float* logits, const int32_t* idx, int64_t N, int E,
                                       Params p, const float* w, float zw, float* dlogits) {
  const int lane = threadIdx.x & 31;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kWarps + (threadIdx.x >> 5);
  if (row >= N) return;
  const int k = p.k;
  const float s = p.scaling;
  const float* x = logits + row * E;
  const float* g = dprobs + row * k;
  const int32_t* ix = idx + row * k;
  float* dx = dlogits + row * E;
  const float lse = (!p.sigmoid || zw != 0.0f) ? warp_lse(x, E, lane) : 0.0f;
  auto ok = [&](int j) { return ix[j] >= 0 && ix[j] < E; };
  if (p.sigmoid) {
    // p_j = s·σ_j / (S + ε): ∂/∂σ_j = s·(g_j / (S + ε) − Σ_i g_i σ_i / (S + ε)²); k = 1: s·g_j.
    float S = 0.0f, Gs = 0.0f;
    for (int j = lane; j < k; j += 32)
      if (ok(j)) {
        const float sj = sigmoid_f(x[ix[j]]);
        S += sj, Gs += g[j] * sj;
      }
    S = warp_sum(S), Gs = warp_sum(Gs);
    const float inv = 1.0f / (S + kSigEps);
    // a_e = σ_e / (T + ε): ∂/∂σ_e = w_e / (T + ε) − Σ_f w_f σ_f / (T + ε)².
    float T = 0.0f, Wt = 0.0f;
    if (w) {
      for (int e = lane; e < E; e += 32) {
        const float se = sigmoid_f(x[e]);
        T += se, Wt += w[e] * se;
      }
      T = warp_sum(T), Wt = warp_sum(Wt);
    }
    const float tinv = 1.0f / (T + kSigEps);
    for (int e = lane; e < E; e += 32) {
      float sel = 0.0f;
      for (int j = 0; j < k; ++j)
        if (ix[j] == e) sel += k > 1 ? s * (g[j] * inv - Gs * inv * inv) : s * g[j];
      const float ds = sel + (w ? w[e] * tinv - Wt * tinv * tinv : 0.0f);
      dx[e] = ds * sigmoid_grad_f(x[e]) + (zw != 0.0f ? 2.0f * zw * lse * expf(x[e] - lse) : 0.0f);
    }
    return;
  }
  // Softmax: sm = softmax(x); aux: sm_e·(w_e − Σ_f w_f sm_f); z: 2·zw·lse·sm_e.
  float Wbar = 0.0f;
  if (w) {
    for (int e = lane; e < E; e += 32) Wbar += w[e] * expf(x[e] - lse);
    Wbar = warp_sum(Wbar);
  }
  if (p.pre_softmax) {
    // p_j = s·sm[ix_j]: with G_e = s·Σ_{j: ix_j = e} g_j + w_e, dx_e = sm_e·(G_e − Σ_f G_f sm_f).
    float D = 0.0f;
    for (int j = lane; j < k; j += 32)
      if (ok(j)) D += s * g[j] * expf(x[ix[j]] - lse);
    D = warp_sum(D);
    for (int e = lane; e < E; e += 32) {
      float sel = 0.0f;
      for (int j = 0; j < k; ++j)
        if (ix[j] == e) sel += s * g[j];
      const float sm = expf(x[e] - lse);
      dx[e] = sm * (sel + (w ? w[e] : 0.0f) - (D + Wbar) + 2.0f * zw * lse);
    }
    return;
  }
  // p = s·softmax(z), z_j = x[ix_j]: ∂/∂z_j = s·q_j·(g_j − Σ_i g_i q_i), q = softmax(z).
  float zm = -INFINITY;
  for (int j = lane; j < k; j += 32)
    if (ok(j)) zm = fmaxf(zm, x[ix[j]]);
  zm = warp_max(zm);
  float zs = 0.0f;
  for (int j = lane; j < k; j += 32)
    if (ok(j)) zs += expf(x[ix[j]] - zm);
  zs = warp_sum(zs);
  float D = 0.0f;
  for (int j = lane; j < k; j += 32)
    if (ok(j)) D += g[j] * (expf(x[ix[j]] - zm) / zs);
  D = warp_sum(D);
  for (int e = lane; e < E; e += 32) {
    float sel = 0.0f;
    for (int j = 0; j < k; ++j)
      if (ix[j] == e) sel += s * (expf(x[e] - zm) / zs) * (g[j] - D);
    const float sm = expf(x[e] - lse);
    dx[e] = sel + sm * ((w ? w[e] : 0.0f) - Wbar + 2.0f * zw * lse);
  }
}

Params params_of(const MoeRouterArgs& a) {
  return {a.score == MoeScore::Sigmoid, a.pre_softmax, static_cast<int>(a.topk), a.scaling,
          a.expert_bias.defined() ? a.expert_bias.data<float>() : nullptr, static_cast<int>(a.num_groups),
          static_cast<int>(a.group_topk), static_cast<int>(moe_group_score_topk(a))};
}
}  // namespace

void moe_router_forward(const Tensor& logits, const MoeRouterArgs& args, const Tensor& probs, const Tensor& indices,
                        const Tensor& aux_sums, const Tensor& lse, Stream s) {
  DeviceGuard g(logits);
  const int64_t N = logits.dim(0);
  const int E = static_cast<int>(logits.dim(1));
  const cudaStream_t st = stream_of(s);
  if (N == 0) {
    if (aux_sums.defined()) MPT_CUDA_CHECK(cudaMemsetAsync(aux_sums.data_ptr(), 0, aux_sums.nbytes(), st));
    return;
  }
  const int dev = logits.device().index;
  Scratch stat(dev, aux_sums.defined() ? sizeof(float) * N : 0, s);  // per row: lse, or 1 / (Σ sigmoid + ε)
  const int grid = static_cast<int>((N + kWarps - 1) / kWarps);
  MPT_LAUNCH(grid, 32 * kWarps, 0, st, router_forward_kernel)(
      logits.data<float>(), N, E, params_of(args), probs.defined() ? probs.data<float>() : nullptr,
      indices.defined() ? indices.data<int32_t>() : nullptr, lse.defined() ? lse.data<float>() : nullptr,
      stat.get<float>());
  MPT_KERNEL_CHECK("moe_router_forward");
  if (!aux_sums.defined()) return;
  const int64_t chunks = (N + kAuxRows - 1) / kAuxRows;
  Scratch partial(dev, sizeof(float) * chunks * E, s);
  const unsigned gx = static_cast<unsigned>((E + kAuxThreads - 1) / kAuxThreads);
  const unsigned gy = static_cast<unsigned>(chunks < 65535 ? chunks : 65535);
  MPT_LAUNCH(dim3(gx, gy), kAuxThreads, 0, st, router_aux_partials_kernel)(
      logits.data<float>(), stat.get<float>(), N, E, args.score == MoeScore::Sigmoid, chunks, partial.get<float>());
  MPT_KERNEL_CHECK("moe_router_forward (aux partials)");
  MPT_LAUNCH(gx, kAuxThreads, 0, st, router_aux_finalize_kernel)(partial.get<float>(), chunks, E,
                                                                 aux_sums.data<float>());
  MPT_KERNEL_CHECK("moe_router_forward (aux sums)");
}

void moe_router_backward(const Tensor& dprobs, const Tensor& logits, const Tensor& indices, const MoeRouterArgs& args,
                         const Tensor& aux_weight, float z_weight, const Tensor& dlogits, Stream s) {
  DeviceGuard g(logits);
  const int64_t N = logits.dim(0);
  if (N == 0) return;
  const int grid = static_cast<int>((N + kWarps - 1) / kWarps);
  MPT_LAUNCH(grid, 32 * kWarps, 0, stream_of(s), router_backward_kernel)(
      dprobs.data<float>(), logits.data<float>(), indices.data<int32_t>(), N, static_cast<int>(logits.dim(1)),
      params_of(args), aux_weight.defined() ? aux_weight.data<float>() : nullptr, z_weight, dlogits.data<float>());
  MPT_KERNEL_CHECK("moe_router_backward");
}

}  // namespace mpitron::cuda
