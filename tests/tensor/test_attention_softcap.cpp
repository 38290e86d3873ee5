// tests/tensor/test_attention_softcap.cpp — attention logit soft-capping (Gemma 2's
// attn_logit_softcapping: AttentionMask::softcap for attention.h, AttentionBlock::softcap for
// attention_block.h), alone and with GQA, MHA, causal / padding / sliding-window masks,
// attention dropout, and a block's score bias (added BEFORE the cap) with its gradient.
//
// Reference: a float64 attention written here over separate q (B, Tq, NH, HD) and k, v
// (B, Tk, G, HD): U = scale·q·k + bias on visible keys, S = c·tanh(U/c), lse = log Σ exp S,
// P = exp(S − lse), out = Σ_j P·M·v_j (M: attention_keep's mask / (1 − p)); backward from the
// stored out and lse: dS = P ∘ (dO·vᵀ ∘ M − D) ∘ (1 − tanh²(U/c)), D = dO·O, dq = scale·dS·k,
// dk = scale·dSᵀ·q, dv = (P∘M)ᵀ·dO, dbias = Σ_b dS. The reference backward is checked against
// float64 central differences of the reference forward (every element of q, k, v and bias),
// so the tanh² factor is not taken on trust. The op runs on every device, dtype and output
// placement; on CUDA it must take the fallback (cuDNN's SDPA has no soft-cap), even in 16 bits.
#include "tests/tensor/op_harness.h"

using namespace mpitron;
using namespace mpitron::test;

namespace {

struct Geo {
  int64_t B, Tq, Tk, NH, G, HD;
};

// The problem as the reference sees it: who sees whom, the cap, the bias, the dropout.
struct Prob {
  Geo g;
  int64_t q0 = 0, k0 = 0, seq = 0;  // global positions (dropout keying, causal)
  bool causal = true;
  std::vector<int64_t> lens;  // empty: no padding
  int64_t window = 0;
  double cap = 0;
  bool bias = false;
  AttentionDropout drop;
  bool seen(int64_t b, int64_t i, int64_t j) const {
    if (!lens.empty() && j >= lens[static_cast<size_t>(b)]) return false;
    const int64_t qi = q0 + i, kj = k0 + j;
    if (causal && kj > qi) return false;
    return window == 0 || kj >= qi - window;
  }
  double keep(int64_t b, int64_t h, int64_t i, int64_t j) const {
    if (drop.p == 0) return 1.0;
    return attention_keep(drop.seed, drop.offset, b, drop.first_head + h, q0 + i, k0 + j, seq, drop.p)
               ? 1.0 / (1.0 - drop.p)
               : 0.0;
  }
};

struct Vals {
  std::vector<double> q, k, v, bias;  // bias (Tq, Tk, NH), zeros when none
};
size_t qi(const Geo& g, int64_t b, int64_t i, int64_t h, int64_t e) {
  return static_cast<size_t>(((b * g.Tq + i) * g.NH + h) * g.HD + e);
}
size_t ki(const Geo& g, int64_t b, int64_t j, int64_t c, int64_t e) {
  return static_cast<size_t>(((b * g.Tk + j) * g.G + c) * g.HD + e);
}
size_t bi(const Geo& g, int64_t i, int64_t j, int64_t h) { return static_cast<size_t>((i * g.Tk + j) * g.NH + h); }
size_t li(const Geo& g, int64_t b, int64_t h, int64_t i) { return static_cast<size_t>((b * g.NH + h) * g.Tq + i); }

// U (before the cap), S (after it) and dS/dU of (b, h, i, j).
struct Score {
  double u, s, ds_du;
};
Score score(const Prob& p, const Vals& x, double scale, int64_t b, int64_t h, int64_t i, int64_t j) {
  const Geo& g = p.g;
  double a = 0;
  for (int64_t e = 0; e < g.HD; ++e) a += x.q[qi(g, b, i, h, e)] * x.k[ki(g, b, j, h / (g.NH / g.G), e)];
  const double u = a * scale + x.bias[bi(g, i, j, h)];
  if (p.cap == 0) return {u, u, 1.0};
  const double t = std::tanh(u / p.cap);
  return {u, p.cap * t, 1.0 - t * t};
}

void ref_forward(const Prob& p, const Vals& x, double scale, std::vector<double>& out, std::vector<double>& lse) {
  const Geo& g = p.g;
  out.assign(static_cast<size_t>(g.B * g.Tq * g.NH * g.HD), 0.0);
  lse.assign(static_cast<size_t>(g.B * g.NH * g.Tq), -INFINITY);
  for (int64_t b = 0; b < g.B; ++b)
    for (int64_t h = 0; h < g.NH; ++h)
      for (int64_t i = 0; i < g.Tq; ++i) {
        std::vector<double> s(static_cast<size_t>(g.Tk), -INFINITY);
        double mx = -INFINITY;
        for (int64_t j = 0; j < g.Tk; ++j)
          if (p.seen(b, i, j)) mx = std::max(mx, s[static_cast<size_t>(j)] = score(p, x, scale, b, h, i, j).s);
        if (mx == -INFINITY) continue;
        double sum = 0;
        for (int64_t j = 0; j < g.Tk; ++j)
          if (p.seen(b, i, j)) sum += std::exp(s[static_cast<size_t>(j)] - mx);
        const double l = mx + std::log(sum);
        lse[li(g, b, h, i)] = l;
        for (int64_t j = 0; j < g.Tk; ++j) {
          if (!p.seen(b, i, j)) continue;
          const double w = std::exp(s[static_cast<size_t>(j)] - l) * p.keep(b, h, i, j);
          for (int64_t e = 0; e < g.HD; ++e) out[qi(g, b, i, h, e)] += w * x.v[ki(g, b, j, h / (g.NH / g.G), e)];
        }
      }
}

struct Grads {
  std::vector<double> dq, dk, dv, dbias;
};
Grads ref_backward(const Prob& p, const Vals& x, double scale, const std::vector<double>& dout,
                   const std::vector<double>& O, const std::vector<double>& L) {
  const Geo& g = p.g;
  Grads r{std::vector<double>(x.q.size()), std::vector<double>(x.k.size()), std::vector<double>(x.v.size()),
          std::vector<double>(x.bias.size())};
  for (int64_t b = 0; b < g.B; ++b)
    for (int64_t h = 0; h < g.NH; ++h)
      for (int64_t i = 0; i < g.Tq; ++i) {
        const int64_t c = h / (g.NH / g.G);
        double D = 0;
        for (int64_t e = 0; e < g.HD; ++e) D += dout[qi(g, b, i, h, e)] * O[qi(g, b, i, h, e)];
        for (int64_t j = 0; j < g.Tk; ++j) {
          if (!p.seen(b, i, j)) continue;
          double dp = 0;
          for (int64_t e = 0; e < g.HD; ++e) dp += dout[qi(g, b, i, h, e)] * x.v[ki(g, b, j, c, e)];
          const Score sc = score(p, x, scale, b, h, i, j);
          const double pr = std::exp(sc.s - L[li(g, b, h, i)]), m = p.keep(b, h, i, j);
          const double ds = pr * (dp * m - D) * sc.ds_du;
          r.dbias[bi(g, i, j, h)] += ds;
          for (int64_t e = 0; e < g.HD; ++e) {
            r.dq[qi(g, b, i, h, e)] += scale * ds * x.k[ki(g, b, j, c, e)];
            r.dk[ki(g, b, j, c, e)] += scale * ds * x.q[qi(g, b, i, h, e)];
            r.dv[ki(g, b, j, c, e)] += pr * m * dout[qi(g, b, i, h, e)];
          }
        }
      }
  return r;
}

Vals rand_vals(Rng& rng, const Prob& p, DType dt, double span) {
  const Geo& g = p.g;
  auto vec = [&](int64_t n, DType t, double lo, double hi) {
    std::vector<double> v(static_cast<size_t>(n));
    for (double& e : v) e = round_to(t, rng.uniform(lo, hi));
    return v;
  };
  Vals x{vec(g.B * g.Tq * g.NH * g.HD, dt, -span, span), vec(g.B * g.Tk * g.G * g.HD, dt, -span, span),
         vec(g.B * g.Tk * g.G * g.HD, dt, -1.5, 1.5), vec(g.Tq * g.Tk * g.NH, DType::F32, -2, 2)};
  if (!p.bias) std::fill(x.bias.begin(), x.bias.end(), 0.0);
  return x;
}

// The largest |U| / cap of the problem's visible scores: the cap must bite somewhere (tanh far from linear).
double max_capped(const Prob& p, const Vals& x, double scale) {
  double m = 0;
  for (int64_t b = 0; b < p.g.B; ++b)
    for (int64_t h = 0; h < p.g.NH; ++h)
      for (int64_t i = 0; i < p.g.Tq; ++i)
        for (int64_t j = 0; j < p.g.Tk; ++j)
          if (p.seen(b, i, j)) m = std::max(m, std::fabs(score(p, x, scale, b, h, i, j).u) / p.cap);
  return m;
}

// ---- the whole call (attention.h): packed qkv ------------------------------------------------
struct WholeCase {
  const char* what;
  int64_t B, T, NH, G, HD;
  bool mha5;  // the 5-D (B, T, 3, NH, HD) form (G = NH)
  bool causal;
  std::vector<int64_t> lens;
  int64_t window;
  float cap, p;
};

const std::vector<WholeCase>& whole_cases() {
  static const std::vector<WholeCase> c{
      {"GQA causal", 2, 9, 4, 2, 8, false, true, {}, 0, 2.0f, 0.0f},
      {"GQA bidirectional + padding", 2, 9, 4, 2, 8, false, false, {9, 5}, 0, 2.0f, 0.0f},
      {"GQA causal sliding window 3", 2, 9, 4, 1, 8, false, true, {}, 3, 1.5f, 0.0f},
      {"GQA causal + padding + dropout", 2, 9, 4, 2, 8, false, true, {9, 6}, 0, 2.0f, 0.2f},
      {"MHA 5-D causal + dropout", 1, 11, 2, 2, 16, true, true, {}, 0, 2.5f, 0.3f},
      {"MQA (G = 1) bidirectional", 2, 7, 3, 1, 8, false, false, {}, 0, 1.0f, 0.0f},
  };
  return c;
}

Prob whole_prob(const WholeCase& c) {
  Prob p;
  p.g = {c.B, c.T, c.T, c.NH, c.G, c.HD};
  p.seq = c.T;
  p.causal = c.causal;
  p.lens = c.lens;
  p.window = c.window;
  p.cap = c.cap;
  if (c.p > 0) p.drop = AttentionDropout{c.p, 77, 512, 1};
  return p;
}

// qkv (packed) from q, k, v and back: element of Q head h / K or V group c of token (b, t).
size_t packed_at(const WholeCase& c, int64_t b, int64_t t, int which, int64_t head, int64_t e) {
  const int64_t col = which == 0 ? head : which == 1 ? c.NH + head : c.NH + c.G + head;
  return static_cast<size_t>(((b * c.T + t) * (c.NH + 2 * c.G) + col) * c.HD + e);
}
std::vector<double> pack(const WholeCase& c, const Vals& x) {
  std::vector<double> v(static_cast<size_t>(c.B * c.T * (c.NH + 2 * c.G) * c.HD));
  const Geo g{c.B, c.T, c.T, c.NH, c.G, c.HD};
  for (int64_t b = 0; b < c.B; ++b)
    for (int64_t t = 0; t < c.T; ++t)
      for (int64_t e = 0; e < c.HD; ++e) {
        for (int64_t h = 0; h < c.NH; ++h) v[packed_at(c, b, t, 0, h, e)] = x.q[qi(g, b, t, h, e)];
        for (int64_t k = 0; k < c.G; ++k) {
          v[packed_at(c, b, t, 1, k, e)] = x.k[ki(g, b, t, k, e)];
          v[packed_at(c, b, t, 2, k, e)] = x.v[ki(g, b, t, k, e)];
        }
      }
  return v;
}
std::vector<double> pack_grads(const WholeCase& c, const Grads& r) {
  return pack(c, Vals{r.dq, r.dk, r.dv, {}});
}

void run_whole(Device dev, DType dt, const WholeCase& c, uint64_t seed) {
  Rng rng(seed);
  const Prob p = whole_prob(c);
  const double scale = 1 / std::sqrt(static_cast<double>(c.HD));
  const Vals x = rand_vals(rng, p, dt, 2.0);
  const double bite = max_capped(p, x, scale);
  REQUIRE_MESSAGE(bite > 1.0, std::string(c.what) << ": the cap does not bite (max |U|/cap " << bite << ")");
  const Shape qs = c.mha5 ? Shape{c.B, c.T, 3, c.NH, c.HD} : Shape{c.B, c.T, c.NH + 2 * c.G, c.HD};
  const Tensor qkv = make_tensor(pack(c, x), qs, dt, dev);
  const Shape os{c.B, c.T, c.NH, c.HD}, ls{c.B, c.NH, c.T};
  AttentionMask m{c.causal, c.lens.empty() ? Tensor() : make_ints(c.lens, {c.B}, DType::I32, dev), c.window, c.cap};
  const std::string name = case_name(dev, dt, str("attention softcap ", c.cap, ": ", c.what));
  Out out = make_out(os, dt, dev), lse = make_out(ls, DType::F32, dev);
  const PathProbe fp;
  attention_forward(qkv, out.t, lse.t, static_cast<float>(scale), p.drop, m);
  check_path(dev, fp, "attention_forward.fallback", name + " forward");
  std::vector<double> oref, lref;
  ref_forward(p, x, scale, oref, lref);
  check_out(name + " out", out, oref, tol(dt, Kind::Attention));
  check_out(name + " lse", lse, lref, tol(dt == DType::F32 ? dt : DType::F16, Kind::Attention));

  const Input dout = rand_input(rng, os, dt, dev, -1, 1);
  std::vector<double> Or(oref.size()), Lr(lref.size());
  for (size_t i = 0; i < Or.size(); ++i) Or[i] = round_to(dt, oref[i]);
  for (size_t i = 0; i < Lr.size(); ++i) Lr[i] = static_cast<float>(lref[i]);
  Out dqkv = make_out(qs, dt, dev);
  const PathProbe bp;
  attention_backward(dout.t, qkv, make_tensor(Or, os, dt, dev), make_tensor(Lr, ls, DType::F32, dev), dqkv.t,
                     static_cast<float>(scale), p.drop, m);
  check_path(dev, bp, "attention_backward.fallback", name + " backward");
  check_out(name + " dqkv", dqkv, pack_grads(c, ref_backward(p, x, scale, dout.v, Or, Lr)), tol(dt, Kind::Attention));
}

// ---- the block call (attention_block.h): a score bias before the cap -----------------------------
struct BlockCase {
  const char* what;
  int64_t q0, k0, seq;
  bool causal;
  std::vector<int64_t> lens;
  bool bias, grad;
  float cap, p;
};
constexpr Geo kBlock{2, 5, 7, 4, 2, 8};

const std::vector<BlockCase>& block_cases() {
  static const std::vector<BlockCase> c{
      {"bias + causal block + padding + dropout", 2, 0, 7, true, {7, 5}, true, true, 2.0f, 0.2f},
      {"bias, full, no padding", 0, 0, 7, false, {}, true, true, 1.5f, 0.0f},
      {"causal diagonal, rows 0-1 see no key", 0, 2, 9, true, {}, false, false, 3.0f, 0.0f},
      {"padding with a sample of 0 keys, bias_grad of a zero bias", 0, 0, 7, false, {3, 0}, false, true, 2.0f, 0.0f},
  };
  return c;
}

Prob block_prob(const BlockCase& c) {
  Prob p;
  p.g = kBlock;
  p.q0 = c.q0, p.k0 = c.k0, p.seq = c.seq;
  p.causal = c.causal;
  p.lens = c.lens;
  p.cap = c.cap;
  p.bias = c.bias;
  if (c.p > 0) p.drop = AttentionDropout{c.p, 31, 4096, 2};
  return p;
}

void run_block(Device dev, DType dt, const BlockCase& c, uint64_t seed) {
  Rng rng(seed);
  const Prob p = block_prob(c);
  const Geo& g = p.g;
  const double scale = 1 / std::sqrt(static_cast<double>(g.HD));
  const Vals x = rand_vals(rng, p, dt, 2.0);
  const Shape qs{g.B, g.Tq, g.NH, g.HD}, ks{g.B, g.Tk, g.G, g.HD}, ls{g.B, g.NH, g.Tq}, bs{g.Tq, g.Tk, g.NH};
  const Tensor q = make_tensor(x.q, qs, dt, dev), k = make_tensor(x.k, ks, dt, dev), v = make_tensor(x.v, ks, dt, dev);
  AttentionBlock blk{c.q0, c.k0, c.seq, c.causal};
  if (!c.lens.empty()) blk.kv_lengths = make_ints(c.lens, {g.B}, DType::I32, dev);
  if (c.bias) blk.bias = make_tensor(x.bias, bs, DType::F32, dev);
  blk.softcap = c.cap;
  const std::string name = case_name(dev, dt, str("attention block softcap ", c.cap, ": ", c.what));
  Out out = make_out(qs, dt, dev), lse = make_out(ls, DType::F32, dev);
  const PathProbe fp;
  attention_block_forward(q, k, v, out.t, lse.t, static_cast<float>(scale), blk, p.drop);
  check_path(dev, fp, "attention_block_forward.fallback", name + " forward");
  std::vector<double> oref, lref;
  ref_forward(p, x, scale, oref, lref);
  check_out(name + " out", out, oref, tol(dt, Kind::Attention));
  check_out(name + " lse", lse, lref, tol(dt == DType::F32 ? dt : DType::F16, Kind::Attention));

  const Input dout = rand_input(rng, qs, dt, dev, -1, 1);
  const Input g0 = rand_input(rng, bs, DType::F32, dev, -1, 1);  // bias_grad's prior contents (the op adds)
  std::vector<double> Or(oref.size()), Lr(lref.size());
  for (size_t i = 0; i < Or.size(); ++i) Or[i] = round_to(dt, oref[i]);
  for (size_t i = 0; i < Lr.size(); ++i) Lr[i] = static_cast<float>(lref[i]);
  Out dq = make_out(qs, dt, dev), dk = make_out(ks, dt, dev), dv = make_out(ks, dt, dev);
  Out bg = make_out(bs, DType::F32, dev, &g0.v);
  if (c.grad) blk.bias_grad = bg.t;
  const PathProbe bp;
  attention_block_backward(dout.t, q, k, v, make_tensor(Or, qs, dt, dev), make_tensor(Lr, ls, DType::F32, dev), dq.t,
                           dk.t, dv.t, static_cast<float>(scale), blk, p.drop);
  check_path(dev, bp, "attention_block_backward.fallback", name + " backward");
  Grads r = ref_backward(p, x, scale, dout.v, Or, Lr);
  const Tol t = tol(dt, Kind::Attention);
  check_out(name + " dq", dq, r.dq, t);
  check_out(name + " dk", dk, r.dk, t);
  check_out(name + " dv", dv, r.dv, t);
  if (c.grad) {
    double mx = 0;
    for (double d : r.dbias) mx = std::max(mx, std::fabs(d));
    for (size_t i = 0; i < r.dbias.size(); ++i) r.dbias[i] += g0.v[i];
    check_out(name + " bias_grad", bg, r.dbias, {0, t.atol + t.ntol * mx, 0});
  } else {
    check_out(name + " bias_grad untouched", bg, g0.v, {0, 0, 0});
  }
}

// Central differences of L = Σ dout ⊙ out (the reference forward) for every element of one input.
std::vector<double> fd_of(const Prob& p, Vals x, std::vector<double> Vals::*field, double scale,
                          const std::vector<double>& dout) {
  std::vector<double>& f = x.*field;
  std::vector<double> g(f.size());
  auto loss = [&] {
    std::vector<double> o, l;
    ref_forward(p, x, scale, o, l);
    double s = 0;
    for (size_t i = 0; i < o.size(); ++i) s += dout[i] * o[i];
    return s;
  };
  for (size_t i = 0; i < f.size(); ++i) {
    const double x0 = f[i], h = 1e-6;
    f[i] = x0 + h;
    const double lp = loss();
    f[i] = x0 - h;
    const double lm = loss();
    f[i] = x0;
    g[i] = (lp - lm) / (2 * h);
  }
  return g;
}

void check_fd(const std::string& name, const Prob& p, uint64_t seed) {
  Rng rng(seed);
  const double scale = 0.4;
  const Vals x = rand_vals(rng, p, DType::F32, 2.0);
  std::vector<double> dout(static_cast<size_t>(p.g.B * p.g.Tq * p.g.NH * p.g.HD));
  for (double& d : dout) d = rng.uniform(-1, 1);
  std::vector<double> O, L;
  ref_forward(p, x, scale, O, L);
  const Grads r = ref_backward(p, x, scale, dout, O, L);
  const std::pair<std::vector<double> Vals::*, const std::vector<double>*> fields[] = {
      {&Vals::q, &r.dq}, {&Vals::k, &r.dk}, {&Vals::v, &r.dv}, {&Vals::bias, &r.dbias}};
  const char* names[] = {"dq", "dk", "dv", "dbias"};
  for (int f = 0; f < 4; ++f) {
    if (f == 3 && !p.bias) continue;
    const std::vector<double> want = fd_of(p, x, fields[f].first, scale, dout);
    check_close(str(name, " reference ", names[f], " vs finite differences"), *fields[f].second, want,
                {1e-6, 1e-8, 0});
  }
}

}  // namespace

TEST_CASE("attention softcap: the reference backward equals float64 finite differences of its forward") {
  uint64_t seed = 41000;
  for (const WholeCase& c : whole_cases()) {
    Prob p = whole_prob(c);
    p.g.B = 1;  // keep the O(n²) differences small
    if (!p.lens.empty()) p.lens.resize(1);
    check_fd(c.what, p, ++seed);
  }
  for (const BlockCase& c : block_cases()) {
    Prob p = block_prob(c);
    check_fd(c.what, p, ++seed);
  }
}

TEST_CASE("attention softcap (whole call) vs float64: GQA/MHA/MQA, masks, dropout; every dtype and device") {
  uint64_t seed = 41100;
  for (Device dev : test_devices())
    for (DType dt : float_dtypes())
      for (const WholeCase& c : whole_cases()) run_whole(dev, dt, c, ++seed);
}

TEST_CASE("attention block softcap vs float64: bias before the cap, bias_grad, padding, dropout; every dtype") {
  uint64_t seed = 41200;
  for (Device dev : test_devices())
    for (DType dt : float_dtypes())
      for (const BlockCase& c : block_cases()) run_block(dev, dt, c, ++seed);
}

TEST_CASE("attention softcap: a huge cap is the uncapped op; softcap 0 is the op without it bit for bit") {
  for (Device dev : test_devices()) {
    Rng rng(41300);
    const Input qkv = rand_input(rng, {2, 8, 8, 16}, DType::F32, dev, -1, 1);
    const Shape os{2, 8, 4, 16}, ls{2, 4, 8};
    auto run = [&](float cap) {
      const Tensor out = Tensor::empty(os, DType::F32, dev), lse = Tensor::empty(ls, DType::F32, dev);
      attention_forward(qkv.t, out, lse, 0.25f, {}, AttentionMask{true, Tensor(), 0, cap});
      return out.to_floats();
    };
    const std::vector<float> plain = run(0.0f), huge = run(1e6f);
    double worst = 0;
    for (size_t i = 0; i < plain.size(); ++i) worst = std::max(worst, static_cast<double>(std::fabs(plain[i] - huge[i])));
    CHECK_MESSAGE(worst < 1e-5, dev.name() << ": cap 1e6 differs from no cap by " << worst);
    const std::vector<float> again = run(0.0f);
    CHECK(std::memcmp(plain.data(), again.data(), plain.size() * 4) == 0);
  }
}

TEST_CASE("attention softcap: invalid caps throw naming the op") {
  const Tensor qkv = Tensor::zeros({1, 4, 6, 8}, DType::F32), out = Tensor::zeros({1, 4, 2, 8}, DType::F32),
               lse = Tensor::zeros({1, 2, 4}, DType::F32);
  for (float bad : {-1.0f, NAN, INFINITY}) {
    check_throws_naming("attention_forward", [&] { attention_forward(qkv, out, lse, 1, {}, AttentionMask{true, Tensor(), 0, bad}); },
                        str("softcap ", bad));
    check_throws_naming("attention_backward", [&] {
      attention_backward(out, qkv, out, lse, Tensor::zeros(qkv.shape(), DType::F32), 1, {}, AttentionMask{true, Tensor(), 0, bad});
    }, str("softcap ", bad));
    const Tensor q = Tensor::zeros({1, 4, 2, 8}, DType::F32), k = Tensor::zeros({1, 4, 2, 8}, DType::F32);
    AttentionBlock blk{0, 0, 4, true};
    blk.softcap = bad;
    check_throws_naming("attention_block_forward", [&] { attention_block_forward(q, k, k, out, lse, 1, blk); },
                        str("block softcap ", bad));
  }
}
