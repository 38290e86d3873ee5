// tests/tensor/test_attention_bias.cpp — the block form of attention with T5's extras
// (attention_block.h): an additive score bias (Tq, Tk, NH) shared by the samples, its
// gradient ADDED into bias_grad, and a per-sample key padding mask (kv_lengths),
// alone and combined with causal masks and attention dropout.
//
// Reference: a float64 attention written here, on the local indices of one block
// (query i at global q0 + i, key j at k0 + j):
//   S[b,h,i,j] = scale·q_i·k_j + bias[i,j,h] on visible keys (j < len_b, and with
//   causal k0 + j <= q0 + i), lse = log Σ exp S, P = exp(S − lse), out = Σ_j P·M·v_j;
//   backward with dS = P ∘ (dO·vᵀ ∘ M − D), D = dO·O: dq = scale·dS·k, dk = scale·dSᵀ·q,
//   dv = (P∘M)ᵀ·dO, dbias[i,j,h] = Σ_b dS[b,h,i,j] (M: attention_keep's mask / (1 − p)).
// The reference backward is itself checked against float64 central differences of the
// reference forward's L = Σ dout ⊙ out, so the formula is not taken on trust.
// Shapes: GQA NH = 4, G = 2, Tq = 5 != Tk = 7, B = 2 with one sample shorter, rows that
// see no key (out 0, lse −∞, no gradient). bias_grad starts at random values (the op
// adds). On CUDA the block must run the fallback whenever bias or kv_lengths is set.
#include "tests/tensor/op_harness.h"

using namespace mpitron;
using namespace mpitron::test;

namespace {

constexpr int64_t B = 2, NH = 4, G = 2, HD = 8, TQ = 5, TK = 7;

struct Case {
  const char* what;
  int64_t q0, k0, seq;
  bool causal;
  std::vector<int64_t> lens;  // empty: no kv_lengths
  bool bias, grad;            // bias defined; bias_grad defined (backward)
  float p;                    // attention dropout
  AttentionBlock block() const { return {q0, k0, seq, causal}; }
};

const std::vector<Case>& cases() {
  static const std::vector<Case> c{
      {"encoder/cross: bias + padding, full", 0, 0, 7, false, {7, 4}, true, true, 0.0f},
      {"decoder: bias + causal block + padding + dropout", 2, 0, 7, true, {7, 5}, true, true, 0.2f},
      {"bias + causal, rows 0-1 see no key, dropout", 0, 2, 9, true, {}, true, true, 0.25f},
      {"bias, full, dropout, no padding", 0, 0, 7, false, {}, true, true, 0.3f},
      {"padding only (a sample of 0 keys), bias_grad of a zero bias", 0, 0, 7, false, {3, 0}, false, true, 0.0f},
      {"bias without bias_grad, causal diagonal-ish, padding", 1, 0, 7, true, {6, 2}, true, false, 0.0f},
  };
  return c;
}

size_t qi(int64_t b, int64_t i, int64_t h, int64_t e) { return static_cast<size_t>(((b * TQ + i) * NH + h) * HD + e); }
size_t ki(int64_t b, int64_t j, int64_t g, int64_t e) { return static_cast<size_t>(((b * TK + j) * G + g) * HD + e); }
size_t bi(int64_t i, int64_t j, int64_t h) { return static_cast<size_t>((i * TK + j) * NH + h); }
size_t li(int64_t b, int64_t h, int64_t i) { return static_cast<size_t>((b * NH + h) * TQ + i); }

struct Inputs {
  std::vector<double> q, k, v, bias;  // bias all 0 when the case has none
};

bool seen(const Case& c, int64_t b, int64_t i, int64_t j) {
  if (!c.lens.empty() && j >= c.lens[static_cast<size_t>(b)]) return false;
  return !c.causal || c.k0 + j <= c.q0 + i;
}
double keep_w(const Case& c, const AttentionDropout& dr, int64_t b, int64_t h, int64_t i, int64_t j) {
  if (c.p == 0) return 1.0;
  return attention_keep(dr.seed, dr.offset, b, dr.first_head + h, c.q0 + i, c.k0 + j, c.seq, c.p) ? 1.0 / (1.0 - c.p)
                                                                                                   : 0.0;
}
double score(const Case&, const Inputs& x, double scale, int64_t b, int64_t h, int64_t i, int64_t j) {
  double a = 0;
  for (int64_t e = 0; e < HD; ++e) a += x.q[qi(b, i, h, e)] * x.k[ki(b, j, h / (NH / G), e)];
  return a * scale + x.bias[bi(i, j, h)];
}

// out (B, TQ, NH, HD) and lse (B, NH, TQ).
void ref_forward(const Case& c, const Inputs& x, double scale, const AttentionDropout& dr, std::vector<double>& out,
                 std::vector<double>& lse) {
  out.assign(static_cast<size_t>(B * TQ * NH * HD), 0.0);
  lse.assign(static_cast<size_t>(B * NH * TQ), -INFINITY);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < NH; ++h)
      for (int64_t i = 0; i < TQ; ++i) {
        double mx = -INFINITY;
        std::vector<double> s(TK, -INFINITY);
        for (int64_t j = 0; j < TK; ++j)
          if (seen(c, b, i, j)) mx = std::max(mx, s[static_cast<size_t>(j)] = score(c, x, scale, b, h, i, j));
        if (mx == -INFINITY) continue;
        double sum = 0;
        for (int64_t j = 0; j < TK; ++j)
          if (seen(c, b, i, j)) sum += std::exp(s[static_cast<size_t>(j)] - mx);
        const double l = mx + std::log(sum);
        lse[li(b, h, i)] = l;
        for (int64_t j = 0; j < TK; ++j) {
          if (!seen(c, b, i, j)) continue;
          const double w = std::exp(s[static_cast<size_t>(j)] - l) * keep_w(c, dr, b, h, i, j);
          for (int64_t e = 0; e < HD; ++e) out[qi(b, i, h, e)] += w * x.v[ki(b, j, h / (NH / G), e)];
        }
      }
}

struct Grads {
  std::vector<double> dq, dk, dv, dbias;
};
// Given the rows' stored output O and lse L (what the op reads).
Grads ref_backward(const Case& c, const Inputs& x, double scale, const AttentionDropout& dr,
                   const std::vector<double>& dout, const std::vector<double>& O, const std::vector<double>& L) {
  Grads g{std::vector<double>(x.q.size()), std::vector<double>(x.k.size()), std::vector<double>(x.v.size()),
          std::vector<double>(x.bias.size())};
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < NH; ++h)
      for (int64_t i = 0; i < TQ; ++i) {
        const int64_t grp = h / (NH / G);
        double D = 0;
        for (int64_t e = 0; e < HD; ++e) D += dout[qi(b, i, h, e)] * O[qi(b, i, h, e)];
        for (int64_t j = 0; j < TK; ++j) {
          if (!seen(c, b, i, j)) continue;
          double dp = 0;
          for (int64_t e = 0; e < HD; ++e) dp += dout[qi(b, i, h, e)] * x.v[ki(b, j, grp, e)];
          const double p = std::exp(score(c, x, scale, b, h, i, j) - L[li(b, h, i)]), m = keep_w(c, dr, b, h, i, j);
          const double ds = p * (dp * m - D);
          g.dbias[bi(i, j, h)] += ds;
          for (int64_t e = 0; e < HD; ++e) {
            g.dq[qi(b, i, h, e)] += scale * ds * x.k[ki(b, j, grp, e)];
            g.dk[ki(b, j, grp, e)] += scale * ds * x.q[qi(b, i, h, e)];
            g.dv[ki(b, j, grp, e)] += p * m * dout[qi(b, i, h, e)];
          }
        }
      }
  return g;
}

AttentionDropout dropout_of(const Case& c) { return c.p > 0 ? AttentionDropout{c.p, 31, 4096, 2} : AttentionDropout{}; }

Inputs rand_inputs(Rng& rng, DType dt, const Case& c, Device dev, Tensor& q, Tensor& k, Tensor& v, Tensor& bias) {
  Input iq = rand_input(rng, {B, TQ, NH, HD}, dt, dev, -1.5, 1.5), ik = rand_input(rng, {B, TK, G, HD}, dt, dev, -1.5, 1.5),
        iv = rand_input(rng, {B, TK, G, HD}, dt, dev, -1.5, 1.5), ib = rand_input(rng, {TQ, TK, NH}, DType::F32, dev, -2, 2);
  q = iq.t, k = ik.t, v = iv.t;
  if (c.bias) bias = ib.t;
  else std::fill(ib.v.begin(), ib.v.end(), 0.0);
  return {iq.v, ik.v, iv.v, ib.v};
}

void run_case(Device dev, DType dt, const Case& c, uint64_t seed) {
  Rng rng(seed);
  Tensor q, k, v, bias;
  const Inputs x = rand_inputs(rng, dt, c, dev, q, k, v, bias);
  const Input dout = rand_input(rng, {B, TQ, NH, HD}, dt, dev, -1, 1);
  const Input g0 = rand_input(rng, {TQ, TK, NH}, DType::F32, dev, -1, 1);  // bias_grad's prior contents
  const double scale = 1 / std::sqrt(static_cast<double>(HD));
  const AttentionDropout dr = dropout_of(c);
  const std::string name = case_name(dev, dt, str("attention block bias: ", c.what));
  AttentionBlock blk = c.block();
  if (!c.lens.empty()) blk.kv_lengths = make_ints(c.lens, {B}, DType::I32, dev);
  blk.bias = bias;

  Out out = make_out({B, TQ, NH, HD}, dt, dev), lse = make_out({B, NH, TQ}, DType::F32, dev);
  const PathProbe fp;
  attention_block_forward(q, k, v, out.t, lse.t, static_cast<float>(scale), blk, dr);
  check_path(dev, fp, "attention_block_forward.fallback", name + " forward");
  std::vector<double> oref, lref;
  ref_forward(c, x, scale, dr, oref, lref);
  check_out(name + " out", out, oref, tol(dt, Kind::Attention));
  check_out(name + " lse", lse, lref, tol(dt == DType::F32 ? dt : DType::F16, Kind::Attention));

  // Backward from the stored output (rounded to dt) and lse (f32), as a layer keeps them.
  std::vector<double> Or(oref.size()), Lr(lref.size());
  for (size_t i = 0; i < Or.size(); ++i) Or[i] = round_to(dt, oref[i]);
  for (size_t i = 0; i < Lr.size(); ++i) Lr[i] = static_cast<float>(lref[i]);
  const Tensor Ot = make_tensor(Or, {B, TQ, NH, HD}, dt, dev), Lt = make_tensor(Lr, {B, NH, TQ}, DType::F32, dev);
  Out dq = make_out({B, TQ, NH, HD}, dt, dev), dk = make_out({B, TK, G, HD}, dt, dev), dv = make_out({B, TK, G, HD}, dt, dev);
  Out bg = make_out({TQ, TK, NH}, DType::F32, dev, &g0.v);
  if (c.grad) blk.bias_grad = bg.t;
  const PathProbe bp;
  attention_block_backward(dout.t, q, k, v, Ot, Lt, dq.t, dk.t, dv.t, static_cast<float>(scale), blk, dr);
  check_path(dev, bp, "attention_block_backward.fallback", name + " backward");
  Grads gr = ref_backward(c, x, scale, dr, dout.v, Or, Lr);
  const Tol t = tol(dt, Kind::Attention);
  check_out(name + " dq", dq, gr.dq, t);
  check_out(name + " dk", dk, gr.dk, t);
  check_out(name + " dv", dv, gr.dv, t);
  if (c.grad) {
    // Added to the prior contents: the tolerance scales with the gradient, not the sum.
    double mx = 0;
    for (double d : gr.dbias) mx = std::max(mx, std::fabs(d));
    for (size_t i = 0; i < gr.dbias.size(); ++i) gr.dbias[i] += g0.v[i];
    check_out(name + " bias_grad", bg, gr.dbias, {0, t.atol + t.ntol * mx, 0});
  } else {
    check_out(name + " bias_grad untouched", bg, g0.v, {0, 0, 0});
  }
}

}  // namespace

TEST_CASE("attention block with score bias and key padding vs float64 reference; every dtype, GQA, Tq != Tk") {
  uint64_t seed = 31000;
  for (Device dev : test_devices())
    for (DType dt : float_dtypes())
      for (const Case& c : cases()) run_case(dev, dt, c, ++seed);
}

TEST_CASE("attention block bias: the reference backward equals float64 finite differences of its forward") {
  uint64_t seed = 31100;
  for (const Case& c : cases()) {
    Rng rng(++seed);
    Tensor q, k, v, bias;
    Inputs x = rand_inputs(rng, DType::F32, c, Device::cpu(), q, k, v, bias);
    const Input dout = rand_input(rng, {B, TQ, NH, HD}, DType::F32, Device::cpu(), -1, 1);
    const double scale = 1 / std::sqrt(static_cast<double>(HD));
    const AttentionDropout dr = dropout_of(c);
    std::vector<double> O, L;
    ref_forward(c, x, scale, dr, O, L);
    const Grads g = ref_backward(c, x, scale, dr, dout.v, O, L);
    auto loss = [&](const Inputs& xs) {
      std::vector<double> o, l;
      ref_forward(c, xs, scale, dr, o, l);
      double s = 0;
      for (size_t i = 0; i < o.size(); ++i) s += dout.v[i] * o[i];
      return s;
    };
    auto fd = [&](std::vector<double> Inputs::*field, size_t idx) {
      const double h = 1e-6, x0 = (x.*field)[idx];
      (x.*field)[idx] = x0 + h;
      const double lp = loss(x);
      (x.*field)[idx] = x0 - h;
      const double lm = loss(x);
      (x.*field)[idx] = x0;
      return (lp - lm) / (2 * h);
    };
    const std::string name = str("finite differences: ", c.what);
    // bias entries: a visible one of several heads, row 4 (every case sees a key there), and a masked one.
    for (size_t idx : {bi(4, 0, 0), bi(4, 1, 3), bi(3, 2, 1), bi(2, 6, 2), bi(0, 6, 1)}) {
      const double want = fd(&Inputs::bias, idx);
      CHECK_MESSAGE(std::fabs(g.dbias[idx] - want) <= 1e-7 + 1e-6 * std::fabs(want),
                    name << " dbias[" << idx << "] " << g.dbias[idx] << " vs fd " << want);
    }
    for (size_t idx : {qi(1, 4, 3, 5), qi(0, 3, 0, 0)}) {
      const double want = fd(&Inputs::q, idx);
      CHECK_MESSAGE(std::fabs(g.dq[idx] - want) <= 1e-7 + 1e-6 * std::fabs(want), name << " dq[" << idx << "]");
    }
    for (size_t idx : {ki(1, 1, 1, 2), ki(0, 5, 0, 7)}) {
      const double wk = fd(&Inputs::k, idx), wv = fd(&Inputs::v, idx);
      CHECK_MESSAGE(std::fabs(g.dk[idx] - wk) <= 1e-7 + 1e-6 * std::fabs(wk), name << " dk[" << idx << "]");
      CHECK_MESSAGE(std::fabs(g.dv[idx] - wv) <= 1e-7 + 1e-6 * std::fabs(wv), name << " dv[" << idx << "]");
    }
    // Some bias gradient is nonzero (the check above is not vacuous) and masked entries get exactly 0.
    double mx = 0;
    for (double d : g.dbias) mx = std::max(mx, std::fabs(d));
    CHECK_MESSAGE(mx > 1e-3, name << ": the bias gradient is all ~0");
  }
}

TEST_CASE("attention block: masked keys get zero gradient and zero bias gradient, whatever the bias") {
  // Padding of sample 1 beyond 3 keys, a huge bias on the padded keys: out ignores them.
  const Case c{"padding with a huge bias on padded keys", 0, 0, 7, false, {7, 3}, true, true, 0.0f};
  Rng rng(31200);
  Tensor q, k, v, bias;
  rand_inputs(rng, DType::F32, c, Device::cpu(), q, k, v, bias);
  AttentionBlock blk = c.block();
  blk.kv_lengths = make_ints(c.lens, {B}, DType::I32, Device::cpu());
  blk.bias = bias;
  const Tensor out = Tensor::empty({B, TQ, NH, HD}, DType::F32), lse = Tensor::empty({B, NH, TQ}, DType::F32);
  attention_block_forward(q, k, v, out, lse, 0.3f, blk);
  // The same with the padded keys' bias raised by 1e4: identical results.
  Tensor bias2 = bias.clone();
  float* bp = bias2.data<float>();
  for (int64_t i = 0; i < TQ; ++i)
    for (int64_t j = 3; j < TK; ++j)
      for (int64_t h = 0; h < NH; ++h) bp[bi(i, j, h)] += 1e4f;
  AttentionBlock blk2 = blk;
  blk2.bias = bias2;
  const Tensor out2 = Tensor::empty(out.shape(), DType::F32), lse2 = Tensor::empty(lse.shape(), DType::F32);
  // Sample 0 sees every key: use sample 1's rows only.
  attention_block_forward(q, k, v, out2, lse2, 0.3f, blk2);
  const std::vector<float> a = out.to_floats(), b2 = out2.to_floats();
  bool changed_s0 = false, same_s1 = true;
  for (size_t i = 0; i < a.size(); ++i) {
    if (i < a.size() / 2) changed_s0 |= a[i] != b2[i];
    else same_s1 &= a[i] == b2[i];
  }
  CHECK_MESSAGE(changed_s0, "sample 0 sees every key: raising a bias must change its output");
  CHECK_MESSAGE(same_s1, "sample 1's padded keys are masked: their bias must not change its output");
  const Tensor dq = Tensor::empty(q.shape(), DType::F32), dk = Tensor::empty(k.shape(), DType::F32),
               dv = Tensor::empty(k.shape(), DType::F32);
  blk.bias_grad = Tensor::zeros({TQ, TK, NH}, DType::F32);
  const AttentionBlock only1 = [&] {  // sample 1 alone (B = 1) so bias_grad is its share
    AttentionBlock o = blk;
    o.kv_lengths = make_ints({3}, {1}, DType::I32, Device::cpu());
    return o;
  }();
  const Tensor q1 = q.slice(0, 1, 2), k1 = k.slice(0, 1, 2), v1 = v.slice(0, 1, 2);
  const Tensor o1 = out.slice(0, 1, 2), l1 = lse.slice(0, 1, 2), do1 = rand_input(rng, o1.shape(), DType::F32, Device::cpu(), -1, 1).t;
  attention_block_backward(do1, q1, k1, v1, o1, l1, dq.slice(0, 1, 2), dk.slice(0, 1, 2), dv.slice(0, 1, 2), 0.3f,
                           only1);
  const std::vector<float> gk = dk.slice(0, 1, 2).contiguous().to_floats(), gv = dv.slice(0, 1, 2).contiguous().to_floats(),
                           gb = only1.bias_grad.to_floats();
  for (int64_t j = 3; j < TK; ++j)
    for (int64_t e = 0; e < G * HD; ++e) {
      const size_t at = static_cast<size_t>(j * G * HD + e);
      CHECK_MESSAGE((gk[at] == 0.0f && gv[at] == 0.0f), "padded key " << j << " got a nonzero dK/dV");
    }
  for (int64_t i = 0; i < TQ; ++i)
    for (int64_t j = 3; j < TK; ++j)
      for (int64_t h = 0; h < NH; ++h) CHECK_MESSAGE(gb[bi(i, j, h)] == 0.0f, "padded key " << j << " got bias_grad");
}

TEST_CASE("attention block bias / kv_lengths: invalid arguments throw naming the op") {
  const Tensor q = Tensor::zeros({B, TQ, NH, HD}, DType::F32), k = Tensor::zeros({B, TK, G, HD}, DType::F32);
  const Tensor out = Tensor::zeros({B, TQ, NH, HD}, DType::F32), lse = Tensor::zeros({B, NH, TQ}, DType::F32);
  const char* f = "attention_block_forward";
  auto fwd = [&](const AttentionBlock& blk) { attention_block_forward(q, k, k, out, lse, 1, blk); };
  auto with = [](auto set) {
    AttentionBlock b{0, 0, 7, false};
    set(b);
    return b;
  };
  check_throws_naming(f, [&] { fwd(with([](AttentionBlock& b) { b.bias = Tensor::zeros({TQ, TK}, DType::F32); })); },
                      "bias 2-D");
  check_throws_naming(f, [&] { fwd(with([](AttentionBlock& b) { b.bias = Tensor::zeros({TK, TQ, NH}, DType::F32); })); },
                      "bias (Tk, Tq, NH)");
  check_throws_naming(f, [&] { fwd(with([](AttentionBlock& b) { b.bias = Tensor::zeros({TQ, TK, NH}, DType::BF16); })); },
                      "bias bf16");
  check_throws_naming(f, [&] {
    fwd(with([](AttentionBlock& b) { b.bias = Tensor::zeros({TQ, NH, TK}, DType::F32).transpose(1, 2); }));
  }, "bias not contiguous");
  check_throws_naming(f, [&] { fwd(with([](AttentionBlock& b) { b.kv_lengths = make_ints({7, 4}, {B}, DType::I64, Device::cpu()); })); },
                      "kv_lengths i64");
  check_throws_naming(f, [&] { fwd(with([](AttentionBlock& b) { b.kv_lengths = make_ints({7}, {1}, DType::I32, Device::cpu()); })); },
                      "kv_lengths (1) for B = 2");
  check_throws_naming(f, [&] { fwd(with([](AttentionBlock& b) { b.kv_lengths = make_ints({8, 4}, {B}, DType::I32, Device::cpu()); })); },
                      "kv_lengths > Tk");
  check_throws_naming(f, [&] { fwd(with([](AttentionBlock& b) { b.kv_lengths = make_ints({-1, 4}, {B}, DType::I32, Device::cpu()); })); },
                      "kv_lengths < 0");
  // Forward ignores bias_grad; backward checks it.
  fwd(with([](AttentionBlock& b) { b.bias_grad = Tensor::zeros({1}, DType::F32); }));
  check_throws_naming("attention_block_backward", [&] {
    const AttentionBlock blk = with([](AttentionBlock& b) { b.bias_grad = Tensor::zeros({TQ, TK, NH + 1}, DType::F32); });
    attention_block_backward(out, q, k, k, out, lse, Tensor::zeros(q.shape(), DType::F32),
                             Tensor::zeros(k.shape(), DType::F32), Tensor::zeros(k.shape(), DType::F32), 1, blk);
  }, "bias_grad shape");
}
