// tensor/cpu/moe_router.cpp — the MoE router's scores (tensor/moe_router.h), row by row.
// Forward: the row's logsumexp and selection scores, then k passes over them, each taking the
// largest after the previous pick in the order (score descending, expert ascending): the
// choice of tensor/moe_topk.h without a taken set. Group-limited routing first scores each
// group (m such passes over its E/ng scores, the picks added largest first), picks the kept
// groups by the same passes over the group scores, and the k passes skip the other groups'
// experts; the CUDA kernel does the same adds in the same order, so both choose alike.
// aux_sums: a[n, e] is kept per row and each column summed over n = 0..N-1 in order
// (parallel over columns only), so the sums do not depend on the thread count. Backward: the
// row's forward recomputed from logits and the given indices, then the analytic derivative
// (see the formulas at each mode).
#include <algorithm>
#include <cmath>
#include <vector>

#include "tensor/cpu/ops.h"

namespace mpitron::cpu {

namespace {
constexpr float kSigEps = 1e-20f;  // Megatron's guard on the sigmoid normalisations

float sigmoid(float x) { return 1.0f / (1.0f + std::exp(-x)); }
// σ'(x) = σ(x)·σ(−x), without the cancellation of 1 − σ for large x.
float sigmoid_grad(float x) {
  const float t = std::exp(-std::fabs(x));
  return t / ((1.0f + t) * (1.0f + t));
}
float sel_key(float v) { return std::isnan(v) ? -INFINITY : v; }  // NaN ranks lowest

// The order of the top-k passes: is (v, e) after the previous pick (last_v, last_e) — descending
// values, ascending indices among equals; last_e < 0: nothing picked yet.
bool after(float v, int64_t e, float last_v, int64_t last_e) {
  return last_e < 0 || v < last_v || (v == last_v && e > last_e);
}

// Group-limited routing (moe_router.h): kept[g] for the ng groups of E/ng experts of the
// selection scores `key`. gs: ng floats of scratch.
void kept_groups(const float* key, int64_t E, const MoeRouterArgs& a, std::vector<float>& gs, std::vector<char>& kept) {
  const int64_t ng = a.num_groups, per = E / ng, m = moe_group_score_topk(a);
  for (int64_t g = 0; g < ng; ++g) {  // the sum of the group's m largest keys, largest first
    const float* c = key + g * per;
    float sum = 0.0f, last_v = 0.0f;
    int64_t last_e = -1;
    for (int64_t j = 0; j < m; ++j) {
      float bv = -INFINITY;
      int64_t be = per;
      for (int64_t e = 0; e < per; ++e)
        if (after(c[e], e, last_v, last_e) && (c[e] > bv || (c[e] == bv && e < be))) bv = c[e], be = e;
      last_v = bv, last_e = be;
      sum += bv;
    }
    gs[static_cast<size_t>(g)] = sel_key(sum);
  }
  // The group_topk-th best group (tv, te) in the same order: kept iff at or before it.
  float tv = 0.0f;
  int64_t te = -1;
  for (int64_t j = 0; j < a.group_topk; ++j) {
    float bv = -INFINITY;
    int64_t be = ng;
    for (int64_t g = 0; g < ng; ++g) {
      const float v = gs[static_cast<size_t>(g)];
      if (after(v, g, tv, te) && (v > bv || (v == bv && g < be))) bv = v, be = g;
    }
    tv = bv, te = be;
  }
  for (int64_t g = 0; g < ng; ++g) kept[static_cast<size_t>(g)] = !after(gs[static_cast<size_t>(g)], g, tv, te);
}

float row_lse(const float* x, int64_t E) {
  float m = -INFINITY;
  for (int64_t e = 0; e < E; ++e) m = std::max(m, x[e]);
  float s = 0.0f;
  for (int64_t e = 0; e < E; ++e) s += std::exp(x[e] - m);
  return m + std::log(s);
}

// One row's forward. r: the scores probs are made of (sigmoid, softmax, or the logits);
// key: the selection scores r + bias (both E floats of scratch, computed once per row).
// gs, kept: num_groups of scratch (group-limited routing).
void forward_row(const float* x, int64_t E, const MoeRouterArgs& a, const float* bias, float* probs, int32_t* idx,
                 float* aux_row, float* lse_out, std::vector<float>& r, std::vector<float>& key,
                 std::vector<float>& val, std::vector<float>& gs, std::vector<char>& kept) {
  const int64_t k = a.topk;
  const bool sig = a.score == MoeScore::Sigmoid;
  const bool select = probs || idx;
  const float lse = !sig || lse_out ? row_lse(x, E) : 0.0f;
  if (lse_out) *lse_out = lse;
  if (sig && (select || aux_row))
    for (int64_t e = 0; e < E; ++e) r[static_cast<size_t>(e)] = sigmoid(x[e]);
  if (aux_row) {
    if (sig) {
      float t = 0.0f;
      for (int64_t e = 0; e < E; ++e) t += r[static_cast<size_t>(e)];
      const float inv = 1.0f / (t + kSigEps);
      for (int64_t e = 0; e < E; ++e) aux_row[e] = r[static_cast<size_t>(e)] * inv;
    } else {
      for (int64_t e = 0; e < E; ++e) aux_row[e] = std::exp(x[e] - lse);
    }
  }
  if (!select) return;
  if (!sig)
    for (int64_t e = 0; e < E; ++e) r[static_cast<size_t>(e)] = a.pre_softmax ? std::exp(x[e] - lse) : x[e];
  for (int64_t e = 0; e < E; ++e) key[static_cast<size_t>(e)] = sel_key(r[static_cast<size_t>(e)] + (bias ? bias[e] : 0.0f));
  const int64_t per = a.num_groups > 0 ? E / a.num_groups : E;
  if (a.num_groups > 0) kept_groups(key.data(), E, a, gs, kept);
  float last_v = 0.0f;
  int64_t last_e = -1;
  for (int64_t j = 0; j < k; ++j) {
    float bv = -INFINITY;
    int64_t be = E;
    for (int64_t e = 0; e < E; ++e) {
      if (a.num_groups > 0 && !kept[static_cast<size_t>(e / per)]) continue;  // outside the kept groups
      const float v = key[static_cast<size_t>(e)];
      if (after(v, e, last_v, last_e) && (v > bv || (v == bv && e < be))) bv = v, be = e;
    }
    last_v = bv, last_e = be;
    if (idx) idx[j] = static_cast<int32_t>(be);
    val[static_cast<size_t>(j)] = r[static_cast<size_t>(be)];
  }
  if (!probs) return;
  const float s = a.scaling;
  if (sig) {
    float sum = 0.0f;
    for (int64_t j = 0; j < k; ++j) sum += val[static_cast<size_t>(j)];
    const float inv = k > 1 ? s / (sum + kSigEps) : s;
    for (int64_t j = 0; j < k; ++j) probs[j] = val[static_cast<size_t>(j)] * inv;
  } else if (a.pre_softmax) {
    for (int64_t j = 0; j < k; ++j) probs[j] = s * val[static_cast<size_t>(j)];
  } else {  // softmax over the selected logits
    float zm = -INFINITY, zs = 0.0f;
    for (int64_t j = 0; j < k; ++j) zm = std::max(zm, val[static_cast<size_t>(j)]);
    for (int64_t j = 0; j < k; ++j) zs += std::exp(val[static_cast<size_t>(j)] - zm);
    const float inv = s / zs;
    for (int64_t j = 0; j < k; ++j) probs[j] = std::exp(val[static_cast<size_t>(j)] - zm) * inv;
  }
}

// One row's dlogits. g = dprobs (k), ix = indices (k), w = aux_weight (E) or null.
void backward_row(const float* x, const float* g, const int32_t* ix, int64_t E, int64_t k, const MoeRouterArgs& a,
                  const float* w, float zw, float* dx, std::vector<float>& sel) {
  const bool sig = a.score == MoeScore::Sigmoid;
  const float s = a.scaling;
  const bool need_lse = !sig || zw != 0.0f;
  const float lse = need_lse ? row_lse(x, E) : 0.0f;
  auto ok = [&](int64_t j) { return ix[j] >= 0 && ix[j] < E; };
  // sel[e] = Σ_{j: ix_j = e} (the selected path's derivative wrt the score of choice j)
  std::fill(sel.begin(), sel.end(), 0.0f);
  if (sig) {
    // p_j = s·σ_j / (S + ε): ∂/∂σ_j = s·(g_j / (S + ε) − Σ_i g_i σ_i / (S + ε)²); k = 1: s·g_j.
    float S = 0.0f, Gs = 0.0f;
    for (int64_t j = 0; j < k; ++j)
      if (ok(j)) {
        const float sj = sigmoid(x[ix[j]]);
        S += sj, Gs += g[j] * sj;
      }
    const float inv = 1.0f / (S + kSigEps);
    for (int64_t j = 0; j < k; ++j)
      if (ok(j)) sel[static_cast<size_t>(ix[j])] += k > 1 ? s * (g[j] * inv - Gs * inv * inv) : s * g[j];
    // a_e = σ_e / (T + ε): ∂/∂σ_e = w_e / (T + ε) − Σ_f w_f σ_f / (T + ε)².
    float T = 0.0f, Wt = 0.0f;
    if (w)
      for (int64_t e = 0; e < E; ++e) {
        const float se = sigmoid(x[e]);
        T += se, Wt += w[e] * se;
      }
    const float tinv = 1.0f / (T + kSigEps);
    for (int64_t e = 0; e < E; ++e) {
      const float ds = sel[static_cast<size_t>(e)] + (w ? w[e] * tinv - Wt * tinv * tinv : 0.0f);
      dx[e] = ds * sigmoid_grad(x[e]) + (zw != 0.0f ? 2.0f * zw * lse * std::exp(x[e] - lse) : 0.0f);
    }
    return;
  }
  // Softmax: sm = softmax(x); aux: sm_e·(w_e − Σ_f w_f sm_f); z: 2·zw·lse·sm_e.
  float Wbar = 0.0f;
  if (w)
    for (int64_t e = 0; e < E; ++e) Wbar += w[e] * std::exp(x[e] - lse);
  if (a.pre_softmax) {
    // p_j = s·sm[ix_j]: with G_e = s·Σ_{j: ix_j = e} g_j + w_e, dx_e = sm_e·(G_e − Σ_f G_f sm_f).
    float D = 0.0f;
    for (int64_t j = 0; j < k; ++j)
      if (ok(j)) {
        sel[static_cast<size_t>(ix[j])] += s * g[j];
        D += s * g[j] * std::exp(x[ix[j]] - lse);
      }
    for (int64_t e = 0; e < E; ++e) {
      const float sm = std::exp(x[e] - lse);
      dx[e] = sm * (sel[static_cast<size_t>(e)] + (w ? w[e] : 0.0f) - (D + Wbar) + 2.0f * zw * lse);
    }
    return;
  }
  // p = s·softmax(z), z_j = x[ix_j]: ∂/∂z_j = s·q_j·(g_j − Σ_i g_i q_i), q = softmax(z).
  float zm = -INFINITY, zs = 0.0f, D = 0.0f;
  for (int64_t j = 0; j < k; ++j)
    if (ok(j)) zm = std::max(zm, x[ix[j]]);
  for (int64_t j = 0; j < k; ++j)
    if (ok(j)) zs += std::exp(x[ix[j]] - zm);
  for (int64_t j = 0; j < k; ++j)
    if (ok(j)) D += g[j] * (std::exp(x[ix[j]] - zm) / zs);
  for (int64_t j = 0; j < k; ++j)
    if (ok(j)) sel[static_cast<size_t>(ix[j])] += s * (std::exp(x[ix[j]] - zm) / zs) * (g[j] - D);
  for (int64_t e = 0; e < E; ++e) {
    const float sm = std::exp(x[e] - lse);
    dx[e] = sel[static_cast<size_t>(e)] + sm * ((w ? w[e] : 0.0f) - Wbar + 2.0f * zw * lse);
  }
}
}  // namespace

void moe_router_forward(const Tensor& logits, const MoeRouterArgs& args, const Tensor& probs, const Tensor& indices,
                        const Tensor& aux_sums, const Tensor& lse, Stream) {
  const int64_t N = logits.dim(0), E = logits.dim(1), k = args.topk;
  const float* x = logits.data<float>();
  const float* bias = args.expert_bias.defined() ? args.expert_bias.data<float>() : nullptr;
  float* p = probs.defined() ? probs.data<float>() : nullptr;
  int32_t* ix = indices.defined() ? indices.data<int32_t>() : nullptr;
  float* l = lse.defined() ? lse.data<float>() : nullptr;
  std::vector<float> a(aux_sums.defined() ? static_cast<size_t>(N * E) : 0);  // a[n, e]
#pragma omp parallel if (N * E > 65536)
  {
    std::vector<float> r(static_cast<size_t>(E)), key(static_cast<size_t>(E)), val(static_cast<size_t>(k));
    std::vector<float> gs(static_cast<size_t>(args.num_groups));
    std::vector<char> kept(static_cast<size_t>(args.num_groups));
#pragma omp for schedule(static)
    for (int64_t n = 0; n < N; ++n)
      forward_row(x + n * E, E, args, bias, p ? p + n * k : nullptr, ix ? ix + n * k : nullptr,
                  a.empty() ? nullptr : a.data() + n * E, l ? l + n : nullptr, r, key, val, gs, kept);
  }
  if (!aux_sums.defined()) return;
  float* out = aux_sums.data<float>();
  // Column e over n = 0..N-1 in order; threads split the columns (16 at a time), never the rows.
  constexpr int64_t kCols = 16;
#pragma omp parallel for schedule(static) if (N * E > 65536)
  for (int64_t e0 = 0; e0 < E; e0 += kCols) {
    const int64_t e1 = std::min(E, e0 + kCols);
    float acc[kCols] = {};
    for (int64_t n = 0; n < N; ++n)
      for (int64_t e = e0; e < e1; ++e) acc[e - e0] += a[static_cast<size_t>(n * E + e)];
    for (int64_t e = e0; e < e1; ++e) out[e] = acc[e - e0];
  }
}

void moe_router_backward(const Tensor& dprobs, const Tensor& logits, const Tensor& indices, const MoeRouterArgs& args,
                         const Tensor& aux_weight, float z_weight, const Tensor& dlogits, Stream) {
  const int64_t N = logits.dim(0), E = logits.dim(1), k = args.topk;
  const float* x = logits.data<float>();
  const float* g = dprobs.data<float>();
  const int32_t* ix = indices.data<int32_t>();
  const float* w = aux_weight.defined() ? aux_weight.data<float>() : nullptr;
  float* dx = dlogits.data<float>();
#pragma omp parallel if (N * E > 65536)
  {
    std::vector<float> sel(static_cast<size_t>(E));
#pragma omp for schedule(static)
    for (int64_t n = 0; n < N; ++n) backward_row(x + n * E, g + n * k, ix + n * k, E, k, args, w, z_weight, dx + n * E, sel);
  }
}

}  // namespace mpitron::cpu
