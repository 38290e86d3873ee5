// tests/tensor/test_moe_router.cpp — the MoE router's scores (tensor/moe_router.h) against a
// float64 reference written here, on every device:
//   forward: probs, indices (exactly: a stable descending sort of the selection scores,
//   ties to the lower expert), aux_sums and lse, for Softmax after top-k (Mixtral), Softmax
//   before top-k (Qwen2-MoE) and Sigmoid (DeepSeek-V3, k > 1 and k = 1), with and without an
//   expert bias (it moves the selection, never the probs), scaling factors != 1, rows of tied
//   logits, N not a multiple of any block or chunk, E = 8, 64, 160, k = 1, 2, 6, E;
//   backward: dlogits against the float64 derivative written from the Jacobians, and against
//   float64 central differences of L = Σ dprobs·probs + Σ_e aux_weight[e]·Σ_n a[n, e]
//   + z_weight·Σ_n lse[n]² with the selection held fixed (rows are drawn so that the
//   selection scores are well separated: float32 and float64 pick the same experts);
//   outputs left undefined are skipped; aux_sums do not depend on the CPU thread count;
//   bad arguments refused naming the op.
// Group-limited routing (DeepSeek-V3's n_group / topk_group): the reference scores each group
// by the float64 sum of its m largest selection scores, keeps the group_topk best (a stable
// sort: ties to the lower group) and sorts the kept experts; the same checks then run (the
// backward depends on the indices only). Rows are drawn so that the kept groups' boundary is
// well separated too. Hand-made rows show the limit (and m) changing the choice, with and
// without a bias, and the random problems are checked to choose differently from plain top-k.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>

#include "tests/tensor/op_harness.h"

using namespace mpitron;
using namespace mpitron::test;

namespace {

struct Case {
  MoeScore score;
  bool pre;
  int64_t N, E, k;
  bool bias;
  double scaling;
  bool ties;  // logits from {0, 1, 2, 3}: equal selection scores, picked by the lower expert
  int64_t ng = 0, gk = 0, gm = 0;  // group-limited routing: num_groups, group_topk, group_score_topk
};

std::string describe(const Case& c) {
  return str(c.score == MoeScore::Sigmoid ? "sigmoid" : c.pre ? "softmax pre" : "softmax post", " N=", c.N, " E=", c.E,
             " k=", c.k, c.bias ? " bias" : "", " s=", c.scaling, c.ties ? " ties" : "",
             c.ng > 0 ? str(" groups ", c.ng, " keep ", c.gk, " m ", c.gm) : std::string());
}

// ---- float64 reference of one row ------------------------------------------------------------
double sigm(double x) { return 1.0 / (1.0 + std::exp(-x)); }

double lse_of(const double* x, int64_t E) {
  const double m = *std::max_element(x, x + E);
  double s = 0;
  for (int64_t e = 0; e < E; ++e) s += std::exp(x[e] - m);
  return m + std::log(s);
}

std::vector<double> softmax_of(const double* x, int64_t E) {
  const double l = lse_of(x, E);
  std::vector<double> p(static_cast<size_t>(E));
  for (int64_t e = 0; e < E; ++e) p[static_cast<size_t>(e)] = std::exp(x[e] - l);
  return p;
}

// The scores the probs are made of: softmax (pre), sigmoid, or the logits themselves (post).
std::vector<double> raw_of(const double* x, int64_t E, const Case& c) {
  if (c.score == MoeScore::Sigmoid) {
    std::vector<double> r(static_cast<size_t>(E));
    for (int64_t e = 0; e < E; ++e) r[static_cast<size_t>(e)] = sigm(x[e]);
    return r;
  }
  if (c.pre) return softmax_of(x, E);
  return std::vector<double>(x, x + E);
}

// Experts in the order (key descending, expert ascending): a stable sort.
std::vector<int64_t> order_of(const std::vector<double>& key) {
  std::vector<int64_t> o(key.size());
  std::iota(o.begin(), o.end(), 0);
  std::stable_sort(o.begin(), o.end(), [&](int64_t a, int64_t b) { return key[static_cast<size_t>(a)] > key[static_cast<size_t>(b)]; });
  return o;
}

// probs of the row for a given selection (held fixed).
std::vector<double> probs_of(const double* x, int64_t E, const std::vector<int64_t>& idx, const Case& c) {
  const size_t k = idx.size();
  std::vector<double> p(k);
  if (c.score == MoeScore::Sigmoid) {
    double S = 0;
    for (size_t j = 0; j < k; ++j) S += p[j] = sigm(x[idx[j]]);
    for (size_t j = 0; j < k; ++j) p[j] = c.scaling * (k > 1 ? p[j] / (S + 1e-20) : p[j]);
  } else if (c.pre) {
    const std::vector<double> sm = softmax_of(x, E);
    for (size_t j = 0; j < k; ++j) p[j] = c.scaling * sm[static_cast<size_t>(idx[j])];
  } else {
    std::vector<double> z(k);
    for (size_t j = 0; j < k; ++j) z[j] = x[idx[j]];
    const std::vector<double> q = softmax_of(z.data(), static_cast<int64_t>(k));
    for (size_t j = 0; j < k; ++j) p[j] = c.scaling * q[j];
  }
  return p;
}

// The load-balancing scores a[n, :].
std::vector<double> aux_of(const double* x, int64_t E, const Case& c) {
  if (c.score == MoeScore::Softmax) return softmax_of(x, E);
  std::vector<double> a(static_cast<size_t>(E));
  double T = 0;
  for (int64_t e = 0; e < E; ++e) T += a[static_cast<size_t>(e)] = sigm(x[e]);
  for (auto& v : a) v /= T + 1e-20;
  return a;
}

// L_n = Σ_j g_j·probs_j + Σ_e w_e·a_e + zw·lse², the row's share of the scalar L.
double row_loss(const double* x, int64_t E, const std::vector<int64_t>& idx, const double* g, const double* w, double zw,
                const Case& c) {
  double L = 0;
  const std::vector<double> p = probs_of(x, E, idx, c);
  for (size_t j = 0; j < p.size(); ++j) L += g[j] * p[j];
  if (w) {
    const std::vector<double> a = aux_of(x, E, c);
    for (int64_t e = 0; e < E; ++e) L += w[e] * a[static_cast<size_t>(e)];
  }
  const double l = lse_of(x, E);
  return L + zw * l * l;
}

// dL_n/dx from the Jacobians, term by term (float64).
std::vector<double> row_grad(const double* x, int64_t E, const std::vector<int64_t>& idx, const double* g, const double* w,
                             double zw, const Case& c) {
  const size_t k = idx.size();
  const double s = c.scaling;
  std::vector<double> d(static_cast<size_t>(E), 0.0);
  const std::vector<double> sm = softmax_of(x, E);
  auto dsig = [&](int64_t e) { return sigm(x[e]) * (1 - sigm(x[e])); };
  if (c.score == MoeScore::Sigmoid) {
    // p_j = s·σ_j / (S + ε) (k > 1) or s·σ_j: ∂p_j/∂σ_m = s·(δ_jm / (S + ε) − σ_j / (S + ε)²)
    double S = 0;
    for (size_t j = 0; j < k; ++j) S += sigm(x[idx[j]]);
    for (size_t m = 0; m < k; ++m) {
      double dp = 0;  // ∂L/∂σ_{idx_m}
      for (size_t j = 0; j < k; ++j)
        dp += g[j] * (k > 1 ? s * ((j == m) / (S + 1e-20) - sigm(x[idx[j]]) / ((S + 1e-20) * (S + 1e-20)))
                            : s * (j == m));
      d[static_cast<size_t>(idx[m])] += dp * dsig(idx[m]);
    }
    if (w) {  // a_f = σ_f / (T + ε): ∂a_f/∂x_e = σ'_e·(δ_fe / (T + ε) − σ_f / (T + ε)²)
      double T = 0;
      for (int64_t e = 0; e < E; ++e) T += sigm(x[e]);
      for (int64_t e = 0; e < E; ++e)
        for (int64_t f = 0; f < E; ++f)
          d[static_cast<size_t>(e)] += w[f] * dsig(e) * ((f == e) / (T + 1e-20) - sigm(x[f]) / ((T + 1e-20) * (T + 1e-20)));
    }
  } else {
    if (c.pre) {  // p_j = s·sm_{idx_j}: ∂p_j/∂x_e = s·sm_{idx_j}·(δ − sm_e)
      for (size_t j = 0; j < k; ++j)
        for (int64_t e = 0; e < E; ++e)
          d[static_cast<size_t>(e)] += g[j] * s * sm[static_cast<size_t>(idx[j])] * ((idx[j] == e) - sm[static_cast<size_t>(e)]);
    } else {  // p = s·softmax(z): ∂p_j/∂z_m = s·q_j·(δ_jm − q_m), z_m = x_{idx_m}
      std::vector<double> z(k);
      for (size_t j = 0; j < k; ++j) z[j] = x[idx[j]];
      const std::vector<double> q = softmax_of(z.data(), static_cast<int64_t>(k));
      for (size_t j = 0; j < k; ++j)
        for (size_t m = 0; m < k; ++m) d[static_cast<size_t>(idx[m])] += g[j] * s * q[j] * ((j == m) - q[m]);
    }
    if (w)  // a = softmax(x): ∂a_f/∂x_e = sm_f·(δ_fe − sm_e)
      for (int64_t e = 0; e < E; ++e)
        for (int64_t f = 0; f < E; ++f)
          d[static_cast<size_t>(e)] += w[f] * sm[static_cast<size_t>(f)] * ((f == e) - sm[static_cast<size_t>(e)]);
  }
  const double l = lse_of(x, E);  // ∂(zw·lse²)/∂x_e = 2·zw·lse·sm_e
  for (int64_t e = 0; e < E; ++e) d[static_cast<size_t>(e)] += 2 * zw * l * sm[static_cast<size_t>(e)];
  return d;
}

// ---- inputs ---------------------------------------------------------------------------------------
// True when the first min(k + 1, E) experts in the order have selection scores apart by more
// than 2e-5 of their magnitude (raw + |bias|): float32's rounding cannot reorder them.
bool separated(const std::vector<double>& key, const std::vector<double>& raw, const std::vector<double>& bias,
               const std::vector<int64_t>& order, int64_t k) {
  const int64_t last = std::min<int64_t>(k, static_cast<int64_t>(key.size()) - 1);
  for (int64_t i = 0; i < last; ++i) {
    const size_t a = static_cast<size_t>(order[static_cast<size_t>(i)]), b = static_cast<size_t>(order[static_cast<size_t>(i + 1)]);
    const double scale = std::max(std::fabs(raw[a]) + std::fabs(bias[a]), std::fabs(raw[b]) + std::fabs(bias[b]));
    if (key[a] - key[b] <= 2e-5 * scale) return false;
  }
  return true;
}

// The group score's m: group_score_topk, or Megatron's topk / group_topk.
int64_t group_m(const Case& c) { return c.gm > 0 ? c.gm : c.k / c.gk; }

// Group-limited routing: the group scores (float64: the sum of each group's m largest keys).
std::vector<double> group_scores(const std::vector<double>& key, const Case& c) {
  const int64_t per = c.E / c.ng;
  std::vector<double> gs;
  for (int64_t g = 0; g < c.ng; ++g) {
    std::vector<double> v(key.begin() + g * per, key.begin() + (g + 1) * per);
    std::sort(v.begin(), v.end(), std::greater<double>());
    double sum = 0;
    for (int64_t j = 0; j < group_m(c); ++j) sum += v[static_cast<size_t>(j)];
    gs.push_back(sum);
  }
  return gs;
}

// The experts in the order top-k takes them: every expert (no groups), or the kept groups'
// experts only (the rest never chosen). *sep: float32 picks the same (the kept groups' boundary
// and the first k + 1 kept experts apart by more than 2e-5 of their magnitude).
std::vector<int64_t> selection_order(const std::vector<double>& key, const std::vector<double>& raw,
                                     const std::vector<double>& bias, const Case& c, bool* sep) {
  if (c.ng == 0) {
    const std::vector<int64_t> o = order_of(key);
    *sep = separated(key, raw, bias, o, c.k);
    return o;
  }
  const int64_t per = c.E / c.ng;
  const std::vector<double> gs = group_scores(key, c);
  const std::vector<int64_t> go = order_of(gs);
  double mag = 0;
  for (size_t e = 0; e < key.size(); ++e) mag = std::max(mag, std::fabs(raw[e]) + std::fabs(bias[e]));
  *sep = c.gk == c.ng || gs[static_cast<size_t>(go[static_cast<size_t>(c.gk - 1)])] -
                                 gs[static_cast<size_t>(go[static_cast<size_t>(c.gk)])] >
                             2e-5 * static_cast<double>(group_m(c)) * mag;
  std::vector<double> masked(key.size(), -INFINITY);  // the kept groups' keys; the others never taken
  for (int64_t j = 0; j < c.gk; ++j)
    for (int64_t e = go[static_cast<size_t>(j)] * per; e < (go[static_cast<size_t>(j)] + 1) * per; ++e)
      masked[static_cast<size_t>(e)] = key[static_cast<size_t>(e)];
  std::vector<int64_t> o = order_of(masked);
  o.resize(static_cast<size_t>(c.gk * per));
  *sep = *sep && separated(masked, raw, bias, o, std::min<int64_t>(c.k, static_cast<int64_t>(o.size()) - 1));
  return o;
}

struct Problem {
  Case c;
  std::vector<double> x, bias;           // (N, E) logits, (E) bias (zeros when none), as f32 values
  std::vector<int64_t> idx;              // (N, k) reference selection
  std::vector<double> probs, aux, lse;   // (N, k), (E), (N)
};

Problem make_problem(const Case& c, Rng& rng) {
  Problem p;
  p.c = c;
  const int64_t N = c.N, E = c.E, k = c.k;
  p.bias.assign(static_cast<size_t>(E), 0.0);
  if (c.bias)
    for (auto& b : p.bias) b = round_to(DType::F32, rng.uniform(-0.3, 0.3));
  p.x.resize(static_cast<size_t>(N * E));
  p.aux.assign(static_cast<size_t>(E), 0.0);
  for (int64_t n = 0; n < N; ++n) {
    double* xr = p.x.data() + n * E;
    std::vector<int64_t> order;
    for (int tries = 0;; ++tries) {
      REQUIRE_MESSAGE(tries < 20000, describe(c) << ": no row with separated selection scores");
      for (int64_t e = 0; e < E; ++e)
        xr[e] = c.ties ? static_cast<double>(rng.randint(0, 3)) : round_to(DType::F32, rng.uniform(-4, 4));
      const std::vector<double> raw = raw_of(xr, E, c);
      std::vector<double> key(static_cast<size_t>(E));
      for (int64_t e = 0; e < E; ++e) key[static_cast<size_t>(e)] = raw[static_cast<size_t>(e)] + p.bias[static_cast<size_t>(e)];
      bool sep = false;
      order = selection_order(key, raw, p.bias, c, &sep);
      if (c.ties || sep) break;
    }
    const std::vector<int64_t> sel(order.begin(), order.begin() + k);
    p.idx.insert(p.idx.end(), sel.begin(), sel.end());
    const std::vector<double> pr = probs_of(xr, E, sel, c), a = aux_of(xr, E, c);
    p.probs.insert(p.probs.end(), pr.begin(), pr.end());
    for (int64_t e = 0; e < E; ++e) p.aux[static_cast<size_t>(e)] += a[static_cast<size_t>(e)];
    p.lse.push_back(lse_of(xr, E));
  }
  return p;
}

MoeRouterArgs args_of(const Case& c, const Problem& p, Device dev) {
  MoeRouterArgs a;
  a.score = c.score;
  a.pre_softmax = c.pre;
  a.topk = c.k;
  a.scaling = static_cast<float>(c.scaling);
  if (c.bias) a.expert_bias = make_tensor(p.bias, {c.E}, DType::F32, dev);
  a.num_groups = c.ng, a.group_topk = c.gk, a.group_score_topk = c.gm;
  return a;
}

std::vector<int64_t> ints_of(const Tensor& t) {
  const Tensor h = t.to(Device::cpu());
  return std::vector<int64_t>(h.data<int32_t>(), h.data<int32_t>() + h.numel());
}

int64_t count_differences(const std::vector<int64_t>& a, const std::vector<int64_t>& b) {
  if (a.size() != b.size()) return static_cast<int64_t>(std::max(a.size(), b.size()));
  int64_t d = 0;
  for (size_t i = 0; i < a.size(); ++i) d += a[i] != b[i];
  return d;
}

// aux_sums: each element a sum of N terms in [0, 1] of relative error a few ulps: γ_N bound.
std::vector<double> aux_bound(const Problem& p) {
  std::vector<double> b;
  for (double v : p.aux) b.push_back((static_cast<double>(p.c.N) + 8) * std::ldexp(1.0, -23) * v);
  return b;
}

void run(Device dev, const Case& c, bool with_aux_weight, uint64_t seed) {
  Rng rng(seed);
  const std::string name = case_name(dev, DType::F32, describe(c));
  const Problem p = make_problem(c, rng);
  const int64_t N = c.N, E = c.E, k = c.k;
  const Tensor logits = make_tensor(p.x, {N, E}, DType::F32, dev);
  const MoeRouterArgs args = args_of(c, p, dev);

  // ---- forward: every output
  Out probs = make_out({N, k}, DType::F32, dev), ix = make_out({N, k}, DType::I32, dev);
  Out aux = make_out({E}, DType::F32, dev), lse = make_out({N}, DType::F32, dev);
  moe_router_forward(logits, args, probs.t, ix.t, aux.t, lse.t);
  CHECK_MESSAGE(ix.guards_ok(), name << " indices: write outside the output");
  const std::vector<int64_t> got_ix = ints_of(ix.t);
  const int64_t wrong = count_differences(got_ix, p.idx);
  CHECK_MESSAGE(wrong == 0, name << ": " << wrong << " indices differ from the reference's stable descending order");
  check_out(name + " probs", probs, p.probs, tol(DType::F32, Kind::Reduction));
  const std::vector<double> bound = aux_bound(p);
  check_out(name + " aux_sums", aux, p.aux, tol(DType::F32, Kind::Reduction), &bound);
  check_out(name + " lse", lse, p.lse, tol(DType::F32, Kind::Reduction));
  if (wrong) return;  // the backward's reference would differ in its selection

  // ---- backward, against the Jacobians and against central differences of L (selection fixed)
  const Input g = rand_input(rng, {N, k}, DType::F32, dev, -1, 1);
  const Input w = rand_input(rng, {E}, DType::F32, dev, -1, 1);
  const double zw = with_aux_weight ? 0.25 : 0.0;
  const double* wp = with_aux_weight ? w.v.data() : nullptr;
  std::vector<double> want, fd;
  for (int64_t n = 0; n < N; ++n) {
    std::vector<double> xr(p.x.begin() + n * E, p.x.begin() + (n + 1) * E);
    const std::vector<int64_t> sel(p.idx.begin() + n * k, p.idx.begin() + (n + 1) * k);
    const double* gr = g.v.data() + n * k;
    const std::vector<double> d = row_grad(xr.data(), E, sel, gr, wp, zw, c);
    want.insert(want.end(), d.begin(), d.end());
    const double h = 1e-5;
    for (int64_t e = 0; e < E; ++e) {
      const double x0 = xr[static_cast<size_t>(e)];
      xr[static_cast<size_t>(e)] = x0 + h;
      const double lp = row_loss(xr.data(), E, sel, gr, wp, zw, c);
      xr[static_cast<size_t>(e)] = x0 - h;
      const double lm = row_loss(xr.data(), E, sel, gr, wp, zw, c);
      xr[static_cast<size_t>(e)] = x0;
      fd.push_back((lp - lm) / (2 * h));
    }
  }
  // The reference's own check: its derivative is the derivative of its forward.
  check_close(name + " reference dlogits vs finite differences", want, fd, {1e-6, 1e-8, 1e-6});
  Out dl = make_out({N, E}, DType::F32, dev);
  moe_router_backward(g.t, logits, ix.t, args, with_aux_weight ? w.t : Tensor(), static_cast<float>(zw), dl.t);
  check_out(name + " dlogits", dl, want, tol(DType::F32, Kind::Reduction));
  check_close(name + " dlogits vs finite differences", dl.t, fd, tol(DType::F32, Kind::Reduction));
}

const std::vector<Case>& cases() {
  using S = MoeScore;
  static const std::vector<Case> v{
      // Softmax after top-k (Mixtral)
      {S::Softmax, false, 37, 8, 2, false, 1.0, false},
      {S::Softmax, false, 130, 64, 6, true, 2.5, false},
      {S::Softmax, false, 19, 160, 1, true, 1.0, false},
      {S::Softmax, false, 11, 8, 8, false, 1.0, false},
      {S::Softmax, false, 13, 160, 160, true, 0.5, false},
      {S::Softmax, false, 29, 64, 6, false, 1.0, true},
      // Softmax before top-k (Qwen2-MoE)
      {S::Softmax, true, 37, 8, 2, false, 1.0, false},
      {S::Softmax, true, 130, 64, 6, true, 1.5, false},
      {S::Softmax, true, 21, 160, 6, false, 1.0, false},
      {S::Softmax, true, 9, 8, 8, true, 1.0, false},
      {S::Softmax, true, 29, 8, 2, false, 1.0, true},
      // Sigmoid (DeepSeek-V3), k > 1 normalised, k = 1 not
      {S::Sigmoid, false, 37, 8, 2, true, 1.0, false},
      {S::Sigmoid, false, 130, 64, 6, true, 2.5, false},
      {S::Sigmoid, false, 45, 64, 1, false, 1.0, false},
      {S::Sigmoid, false, 13, 8, 1, true, 3.0, false},
      {S::Sigmoid, false, 23, 160, 6, true, 1.0, false},
      {S::Sigmoid, false, 10, 64, 64, false, 1.0, false},
      {S::Sigmoid, false, 29, 64, 6, false, 1.0, true},
      // large enough for the CPU's OpenMP rows and several 64-row aux chunks
      {S::Softmax, false, 1100, 64, 6, true, 1.0, false},
      {S::Sigmoid, false, 1100, 64, 6, true, 2.5, false},
  };
  return v;
}

// Group-limited routing: num_groups, group_topk, group_score_topk (0: topk / group_topk).
const std::vector<Case>& group_cases() {
  using S = MoeScore;
  static const std::vector<Case> v{
      // DeepSeek-V3: sigmoid + bias, 256 experts in 8 groups, 4 kept, top 8, m = 2 (transformers')
      {S::Sigmoid, false, 19, 256, 8, true, 2.5, false, 8, 4, 2},
      {S::Sigmoid, false, 37, 64, 6, true, 1.0, false, 8, 3, 0},   // Megatron's m = 6 / 3
      {S::Sigmoid, false, 23, 64, 6, false, 1.0, false, 8, 3, 0},  // no bias
      {S::Sigmoid, false, 13, 64, 1, true, 1.0, false, 4, 1, 3},   // k = 1, one group kept
      {S::Softmax, false, 37, 32, 4, true, 1.0, false, 4, 2, 0},   // softmax after top-k, bias
      {S::Softmax, false, 29, 32, 4, false, 1.0, false, 4, 2, 0},
      {S::Softmax, false, 29, 32, 4, false, 1.0, true, 8, 3, 2},   // tied logits: groups and experts to the lower
      {S::Softmax, true, 41, 48, 3, false, 1.5, false, 6, 2, 1},   // softmax before top-k
      {S::Softmax, true, 17, 48, 3, true, 1.0, false, 6, 2, 4},
      {S::Sigmoid, false, 21, 128, 6, true, 1.0, false, 64, 5, 1},  // 64 groups (lanes' second group)
      {S::Sigmoid, false, 11, 64, 16, true, 1.0, false, 8, 2, 8},  // every kept expert chosen, m = the group
      {S::Sigmoid, false, 300, 64, 6, true, 1.0, false, 8, 4, 2},  // the CPU's OpenMP rows
  };
  return v;
}

}  // namespace

TEST_CASE("moe_router: probs, indices, aux_sums, lse and dlogits against float64") {
  uint64_t seed = 12800;
  for (Device dev : test_devices())
    for (const Case& c : cases()) {
      ++seed;
      run(dev, c, /*with_aux_weight=*/seed % 2 == 0, seed);
      run(dev, c, /*with_aux_weight=*/seed % 2 != 0, seed + 1000);
    }
}

TEST_CASE("moe_router group-limited: probs, indices, aux_sums, lse and dlogits against float64") {
  uint64_t seed = 13800;
  for (Device dev : test_devices())
    for (const Case& c : group_cases()) {
      ++seed;
      run(dev, c, /*with_aux_weight=*/seed % 2 == 0, seed);
    }
}

TEST_CASE("moe_router group-limited: the limit changes the choice (random rows and hand-made ones)") {
  // The random problems above: some rows must choose differently from plain top-k, or the
  // group limit was never exercised.
  uint64_t seed = 13900;
  for (const Case& c : group_cases()) {
    if (c.gk == c.ng || c.ties) continue;
    Rng rng(++seed);
    const Problem p = make_problem(c, rng);
    Case plain = c;
    plain.ng = plain.gk = plain.gm = 0;
    int64_t changed = 0;
    for (int64_t n = 0; n < c.N; ++n) {
      const double* xr = p.x.data() + n * c.E;
      const std::vector<double> raw = raw_of(xr, c.E, c);
      std::vector<double> key(raw.size());
      for (size_t e = 0; e < key.size(); ++e) key[e] = raw[e] + p.bias[e];
      bool sep = false;
      const std::vector<int64_t> o = selection_order(key, raw, p.bias, plain, &sep);
      changed += !std::equal(o.begin(), o.begin() + c.k, p.idx.begin() + n * c.k);
    }
    CHECK_MESSAGE(changed > 0, describe(c) << ": no row where the group limit changes the choice");
  }
  // One row, softmax after top-k (the keys are the logits + bias), E = 8 in 4 groups of 2, 2 kept, top 2:
  //   logits  (0.9, 0.0 | 0.5, 0.5 | 0.6, 0.45 | 0.1, 0.1)
  //   m = 2: group scores 0.9, 1.0, 1.05, 0.2 → groups 2, 1 → experts 4, then 2 (2 and 3 tie: the lower);
  //          plain top-2 would be 0, 4
  //   m = 1: group scores 0.9, 0.5, 0.6, 0.1 → groups 0, 2 → experts 0, 4 (= plain)
  //   m = 2 with a bias of +0.3 on expert 1: group 0 scores 1.2 → groups 0, 2 → experts 0, 4
  //   one group kept (group_topk 1, m = 2): group 2 → experts 4, 5
  // Sigmoid the same rows (sigmoid is monotone: the same order of the keys, other group sums):
  //   m = 2: σ sums 1.211, 1.245, 1.256, 1.050 → groups 2, 1 → experts 4, 2;
  //   m = 0 (Megatron's topk / group_topk = 1): σ maxima 0.711, 0.622, 0.646, 0.525 → groups 0, 2 → 0, 4.
  struct Hand {
    MoeScore score;
    int64_t gk, gm;
    bool bias;
    std::vector<int64_t> want;
  };
  const std::vector<Hand> hands{{MoeScore::Softmax, 2, 2, false, {4, 2}}, {MoeScore::Softmax, 2, 1, false, {0, 4}},
                                {MoeScore::Softmax, 2, 2, true, {0, 4}},  {MoeScore::Softmax, 1, 2, false, {4, 5}},
                                {MoeScore::Sigmoid, 2, 2, false, {4, 2}}, {MoeScore::Sigmoid, 2, 0, false, {0, 4}}};
  for (Device dev : test_devices()) {
    const Tensor logits = make_tensor({0.9, 0.0, 0.5, 0.5, 0.6, 0.45, 0.1, 0.1}, {1, 8}, DType::F32, dev);
    for (const Hand& h : hands) {
      MoeRouterArgs a;
      a.score = h.score;
      a.topk = 2;
      a.num_groups = 4, a.group_topk = h.gk, a.group_score_topk = h.gm;
      if (h.bias) a.expert_bias = make_tensor({0, 0.3, 0, 0, 0, 0, 0, 0}, {8}, DType::F32, dev);
      const Tensor pr = Tensor::empty({1, 2}, DType::F32, dev), ix = Tensor::empty({1, 2}, DType::I32, dev);
      moe_router_forward(logits, a, pr, ix, Tensor(), Tensor());
      const std::string name = case_name(dev, DType::F32, str(h.score == MoeScore::Sigmoid ? "sigmoid" : "softmax",
                                                              " keep ", h.gk, " m ", h.gm, h.bias ? " bias" : ""));
      CHECK_MESSAGE(ints_of(ix) == h.want, name << ": chose " << ints_of(ix)[0] << ", " << ints_of(ix)[1]);
      // The probs are those of the chosen experts' unbiased scores, as without groups.
      const double x0 = h.want[0] == 0 ? 0.9 : h.want[0] == 4 ? 0.6 : 0.5;
      const double x1 = h.want[1] == 2 ? 0.5 : h.want[1] == 4 ? 0.6 : 0.45;
      const double s0 = h.score == MoeScore::Softmax ? std::exp(x0) : sigm(x0);
      const double s1 = h.score == MoeScore::Softmax ? std::exp(x1) : sigm(x1);
      check_close(name + " probs", pr, {s0 / (s0 + s1), s1 / (s0 + s1)}, tol(DType::F32, Kind::Reduction));
    }
  }
}

TEST_CASE("moe_router: the bias moves the selection, never the probs") {
  // Row (0, 1, 2, 3) top-2: without bias experts 3, 2; a bias of +5 on expert 0 selects 0, 3 and
  // the probs are those of the unbiased logits of 0 and 3.
  for (Device dev : test_devices()) {
    const Tensor logits = make_tensor({0, 1, 2, 3}, {1, 4}, DType::F32, dev);
    for (MoeScore sc : {MoeScore::Softmax, MoeScore::Sigmoid}) {
      MoeRouterArgs a;
      a.score = sc;
      a.topk = 2;
      a.expert_bias = make_tensor({5, 0, 0, 0}, {4}, DType::F32, dev);
      const Tensor p = Tensor::empty({1, 2}, DType::F32, dev), ix = Tensor::empty({1, 2}, DType::I32, dev);
      moe_router_forward(logits, a, p, ix, Tensor(), Tensor());
      CHECK(ints_of(ix) == std::vector<int64_t>{0, 3});
      const double s0 = sc == MoeScore::Softmax ? 1.0 : sigm(0), s3 = sc == MoeScore::Softmax ? std::exp(3.0) : sigm(3);
      check_close(case_name(dev, DType::F32, "bias moves the choice"), p, {s0 / (s0 + s3), s3 / (s0 + s3)},
                  tol(DType::F32, Kind::Reduction));
    }
  }
}

TEST_CASE("moe_router: outputs left undefined are skipped, the others still right") {
  const Case c{MoeScore::Softmax, false, 21, 64, 6, true, 1.0, false};
  for (Device dev : test_devices()) {
    Rng rng(777);
    const Problem p = make_problem(c, rng);
    const Tensor logits = make_tensor(p.x, {c.N, c.E}, DType::F32, dev);
    const MoeRouterArgs args = args_of(c, p, dev);
    const std::string name = case_name(dev, DType::F32, "one output");
    Out probs = make_out({c.N, c.k}, DType::F32, dev);
    moe_router_forward(logits, args, probs.t, Tensor(), Tensor(), Tensor());
    check_out(name + " probs only", probs, p.probs, tol(DType::F32, Kind::Reduction));
    Out ix = make_out({c.N, c.k}, DType::I32, dev);
    moe_router_forward(logits, args, Tensor(), ix.t, Tensor(), Tensor());
    CHECK_MESSAGE((ints_of(ix.t) == p.idx && ix.guards_ok()), name << " indices only");
    Out aux = make_out({c.E}, DType::F32, dev);
    const std::vector<double> bound = aux_bound(p);
    moe_router_forward(logits, args, Tensor(), Tensor(), aux.t, Tensor());
    check_out(name + " aux_sums only", aux, p.aux, tol(DType::F32, Kind::Reduction), &bound);
    Out lse = make_out({c.N}, DType::F32, dev);
    moe_router_forward(logits, args, Tensor(), Tensor(), Tensor(), lse.t);
    check_out(name + " lse only", lse, p.lse, tol(DType::F32, Kind::Reduction));
  }
}

TEST_CASE("moe_router: aux_sums are the same bits for any CPU thread count and every call") {
  const Case c{MoeScore::Sigmoid, false, 3000, 64, 6, false, 1.0, false};
  Rng rng(4242);
  const Problem p = make_problem(c, rng);
  for (Device dev : test_devices()) {
    const Tensor logits = make_tensor(p.x, {c.N, c.E}, DType::F32, dev);
    const MoeRouterArgs args = args_of(c, p, dev);
    std::vector<std::vector<float>> runs;
    const int threads = omp_get_max_threads();
    for (int t : {1, 3, threads}) {
      omp_set_num_threads(t);
      const Tensor aux = Tensor::empty({c.E}, DType::F32, dev);
      moe_router_forward(logits, args, Tensor(), Tensor(), aux, Tensor());
      runs.push_back(aux.to_floats());
    }
    omp_set_num_threads(threads);
    for (size_t r = 1; r < runs.size(); ++r)
      CHECK_MESSAGE(std::memcmp(runs[r].data(), runs[0].data(), runs[0].size() * sizeof(float)) == 0,
                    dev.name() << ": aux_sums changed between calls / thread counts");
  }
}

TEST_CASE("moe_router: bad arguments are refused naming the op") {
  const Tensor x = Tensor::zeros({3, 4}, DType::F32);
  const Tensor p2 = Tensor::zeros({3, 2}, DType::F32), i2 = Tensor::zeros({3, 2}, DType::I32);
  auto fwd = [&](const MoeRouterArgs& a, const Tensor& logits, const Tensor& p, const Tensor& i, const Tensor& aux,
                 const Tensor& l) { moe_router_forward(logits, a, p, i, aux, l); };
  MoeRouterArgs ok;
  const char* f = "moe_router_forward";
  {
    MoeRouterArgs a = ok;
    a.topk = 5;
    check_throws_naming(f, [&] { fwd(a, x, Tensor(), Tensor(), Tensor(), Tensor()); }, "k above E");
    a.topk = 0;
    check_throws_naming(f, [&] { fwd(a, x, Tensor(), Tensor(), Tensor(), Tensor()); }, "k = 0");
  }
  {
    MoeRouterArgs a = ok;
    a.scaling = 0.0f;
    check_throws_naming(f, [&] { fwd(a, x, p2, i2, Tensor(), Tensor()); }, "scaling 0");
    a.scaling = -1.0f;
    check_throws_naming(f, [&] { fwd(a, x, p2, i2, Tensor(), Tensor()); }, "negative scaling");
  }
  {
    MoeRouterArgs a = ok;
    a.score = MoeScore::Sigmoid;
    a.pre_softmax = true;
    check_throws_naming(f, [&] { fwd(a, x, p2, i2, Tensor(), Tensor()); }, "pre_softmax with Sigmoid");
  }
  {
    MoeRouterArgs a = ok;
    a.expert_bias = Tensor::zeros({5}, DType::F32);
    check_throws_naming(f, [&] { fwd(a, x, p2, i2, Tensor(), Tensor()); }, "bias of the wrong length");
    a.expert_bias = Tensor::zeros({4}, DType::BF16);
    check_throws_naming(f, [&] { fwd(a, x, p2, i2, Tensor(), Tensor()); }, "bf16 bias");
  }
  check_throws_naming(f, [&] { fwd(ok, Tensor::zeros({3, 4}, DType::BF16), p2, i2, Tensor(), Tensor()); }, "bf16 logits");
  check_throws_naming(f, [&] { fwd(ok, Tensor::zeros({12}, DType::F32), p2, i2, Tensor(), Tensor()); }, "1-D logits");
  check_throws_naming(f, [&] { fwd(ok, x, Tensor::zeros({3, 3}, DType::F32), i2, Tensor(), Tensor()); }, "probs (N, 3)");
  check_throws_naming(f, [&] { fwd(ok, x, p2, Tensor::zeros({3, 2}, DType::I64), Tensor(), Tensor()); }, "i64 indices");
  check_throws_naming(f, [&] { fwd(ok, x, p2, i2, Tensor::zeros({3}, DType::F32), Tensor()); }, "aux_sums (3)");
  check_throws_naming(f, [&] { fwd(ok, x, p2, i2, Tensor(), Tensor::zeros({4}, DType::F32)); }, "lse (4)");
  check_throws_naming(f, [&] { fwd(ok, x, Tensor::zeros({2, 3}, DType::F32).transpose(0, 1), i2, Tensor(), Tensor()); },
                      "non-contiguous probs");
  if (cuda_available())
    check_throws_naming(f, [&] { fwd(ok, x, p2.to(Device::cuda(0)), i2, Tensor(), Tensor()); }, "probs on another device");

  const char* b = "moe_router_backward";
  const Tensor dl = Tensor::zeros({3, 4}, DType::F32);
  check_throws_naming(b, [&] { moe_router_backward(p2, x, i2, ok, Tensor::zeros({3}, DType::F32), 0.0f, dl); },
                      "aux_weight (3)");
  check_throws_naming(b, [&] { moe_router_backward(p2, x, i2, ok, Tensor(), 0.0f, Tensor::zeros({3, 4}, DType::BF16)); },
                      "bf16 dlogits");
  check_throws_naming(b, [&] { moe_router_backward(p2, x, Tensor(), ok, Tensor(), 0.0f, dl); }, "no indices");
  check_throws_naming(b, [&] { moe_router_backward(Tensor::zeros({3, 1}, DType::F32), x, i2, ok, Tensor(), 0.0f, dl); },
                      "dprobs (3, 1)");
  check_throws_naming(b, [&] { moe_router_backward(p2, x, i2, ok, Tensor(), NAN, dl); }, "NaN z_weight");
  MoeRouterArgs big = ok;
  big.topk = 6;
  check_throws_naming(b, [&] { moe_router_backward(p2, x, i2, big, Tensor(), 0.0f, dl); }, "k above E");
}

TEST_CASE("moe_router group-limited: bad group arguments are refused naming the op and the flag") {
  const Tensor x = Tensor::zeros({3, 8}, DType::F32);
  const Tensor p2 = Tensor::zeros({3, 2}, DType::F32), i2 = Tensor::zeros({3, 2}, DType::I32);
  auto with = [](int64_t ng, int64_t gk, int64_t gm, int64_t k = 2) {
    MoeRouterArgs a;
    a.topk = k;
    a.num_groups = ng, a.group_topk = gk, a.group_score_topk = gm;
    return a;
  };
  auto refused = [&](const MoeRouterArgs& a, const char* flag, const std::string& what) {
    const Tensor p = Tensor::zeros({3, a.topk}, DType::F32), i = Tensor::zeros({3, a.topk}, DType::I32);
    bool threw = false;
    try {
      moe_router_forward(x, a, p, i, Tensor(), Tensor());
    } catch (const Error& e) {
      threw = true;
      const std::string m = e.what();
      CHECK_MESSAGE(m.find("moe_router_forward") != std::string::npos, what << ": " << m);
      CHECK_MESSAGE(m.find(flag) != std::string::npos, what << ": the error does not name " << flag << ": " << m);
    }
    CHECK_MESSAGE(threw, what << ": accepted");
  };
  moe_router_forward(x, with(4, 2, 0), p2, i2, Tensor(), Tensor());  // 4 groups of 2, 2 kept, m = 1: fits
  refused(with(3, 1, 0), "--moe-router-num-groups", "3 groups of 8 experts");
  refused(with(-1, 0, 0), "num_groups", "negative groups");
  refused(with(0, 2, 0), "--moe-router-num-groups", "group_topk without groups");
  refused(with(0, 0, 2), "--moe-router-num-groups", "group_score_topk without groups");
  refused(with(4, 0, 1), "--moe-router-group-topk", "no group kept");
  refused(with(4, 5, 1), "--moe-router-group-topk", "more groups kept than there are");
  refused(with(4, 1, 1, 3), "--moe-router-group-topk", "top 3 from one group of 2");
  refused(with(4, 2, 3), "group_score_topk", "m above the group's 2 experts");
  refused(with(2, 2, 0, 1), "group_score_topk", "Megatron's m = 1 / 2 = 0");
  const Tensor x128 = Tensor::zeros({1, 256}, DType::F32);
  MoeRouterArgs many = with(128, 2, 1);
  check_throws_naming("moe_router_forward", [&] {
    moe_router_forward(x128, many, Tensor::zeros({1, 2}, DType::F32), Tensor::zeros({1, 2}, DType::I32), Tensor(), Tensor());
  }, "128 groups (above the 64 of the CUDA kernel)");
  check_throws_naming("moe_router_backward", [&] {
    moe_router_backward(p2, x, i2, with(3, 1, 0), Tensor(), 0.0f, Tensor::zeros({3, 8}, DType::F32));
  }, "backward checks the groups too");
}
