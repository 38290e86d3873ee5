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
};

std::string describe(const Case& c) {
  return str(c.score == MoeScore::Sigmoid ? "sigmoid" : c.pre ? "softmax pre" : "softmax post", " N=", c.N, " E=", c.E,
             " k=", c.k, c.bias ? " bias" : "", " s=", c.scaling, c.ties ? " ties" : "");
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
      order = order_of(key);
      if (c.ties || separated(key, raw, p.bias, order, k)) break;
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
