// tests/tensor/test_attention_mask.cpp — attention under an AttentionMask (attention.h):
// bidirectional (BERT) and causal, with a key padding mask kv_lengths (B) i32, and
// causal within a sliding window W (Mistral).
//
// Reference: a float64 attention written here. Row i of sample b sees keys
// i − W <= j < min(len_b, causal ? i + 1 : T) (no lower bound without a window); forward out and lse; backward in closed form
// (dV = (P∘M')ᵀ·dO, dP = dO·Vᵀ∘M', D = Σ P·dP, dS = P∘(dP − D), dQ = s·dS·K,
// dK = s·dSᵀ·Q, M' the dropout keep mask / (1 − p), all ones without dropout),
// itself checked against float64 central differences of the forward on small shapes.
// MHA (5-D qkv) and GQA (4-D, kv groups), every dtype, dropout p > 0 with the mask,
// random lengths (always including 1 and T). Also: the padded sample equals the op
// run on its unpadded prefix; the default mask is the causal op bit for bit; bad
// kv_lengths are rejected naming the op. On CUDA every call asserts its path
// (the fallback under the simulated device; cuDNN's padding mask on a GPU with cuDNN).
#include "tests/tensor/op_harness.h"

using namespace mpitron;
using namespace mpitron::test;

namespace {

// g = 0: MHA with qkv (B, T, 3, NH, HD); g > 0: GQA with qkv (B, T, NH + 2g, HD).
struct Dims {
  int64_t b, t, nh, hd, g = 0;
  int64_t groups() const { return g ? g : nh; }
};
Shape qkv_shape(const Dims& d) { return d.g ? Shape{d.b, d.t, d.nh + 2 * d.g, d.hd} : Shape{d.b, d.t, 3, d.nh, d.hd}; }
Shape out_shape(const Dims& d) { return {d.b, d.t, d.nh, d.hd}; }

// Element e of Q head h (which 0), or of the K (1) / V (2) group head h reads.
size_t qkv_at(const Dims& d, int64_t b, int64_t t, int which, int64_t h, int64_t e) {
  const int64_t g = d.groups(), grp = h / (d.nh / g);
  const int64_t col = which == 0 ? h : which == 1 ? d.nh + grp : d.nh + g + grp;
  return static_cast<size_t>(((b * d.t + t) * (d.nh + 2 * g) + col) * d.hd + e);
}
size_t out_at(const Dims& d, int64_t b, int64_t t, int64_t h, int64_t e) {
  return static_cast<size_t>(((b * d.t + t) * d.nh + h) * d.hd + e);
}

struct Case {
  Dims d;
  bool causal;
  std::vector<int64_t> lens;  // empty: no padding mask
  AttentionDropout drop;
  int64_t window = 0;  // > 0: row i sees keys j >= i − window
  int64_t lo(int64_t i) const { return window > 0 ? std::max<int64_t>(0, i - window) : 0; }
  int64_t hi(int64_t b, int64_t i) const {
    const int64_t len = lens.empty() ? d.t : lens[static_cast<size_t>(b)];
    return causal ? std::min(i + 1, len) : len;
  }
  // M/(1 − p) at (b, head h, i, j)
  double keep(int64_t b, int64_t h, int64_t i, int64_t j) const {
    if (drop.p == 0) return 1.0;
    return attention_keep(drop.seed, drop.offset, b, drop.first_head + h, i, j, d.t, drop.p) ? 1.0 / (1.0 - drop.p)
                                                                                            : 0.0;
  }
};

// Probabilities of row (b, h, i) over keys 0 … hi − 1 (0 for the keys before the window); lse of the row.
std::vector<double> row_probs(const Case& c, const std::vector<double>& x, int64_t b, int64_t h, int64_t i,
                              double scale, double* lse) {
  const Dims& d = c.d;
  const int64_t hi = c.hi(b, i), lo = std::min(c.lo(i), hi);
  std::vector<double> p(static_cast<size_t>(hi), 0.0);
  double mx = -INFINITY;
  for (int64_t j = lo; j < hi; ++j) {
    double s = 0;
    for (int64_t e = 0; e < d.hd; ++e) s += x[qkv_at(d, b, i, 0, h, e)] * x[qkv_at(d, b, j, 1, h, e)];
    p[j] = s * scale;
    mx = std::max(mx, p[j]);
  }
  double sum = 0;
  for (int64_t j = lo; j < hi; ++j) sum += (p[j] = std::exp(p[j] - mx));
  for (int64_t j = lo; j < hi; ++j) p[j] /= sum;
  if (lse) *lse = mx + std::log(sum);
  return p;
}

std::vector<double> ref_forward(const Case& c, const std::vector<double>& x, double scale,
                                std::vector<double>* lse = nullptr) {
  const Dims& d = c.d;
  std::vector<double> out(static_cast<size_t>(d.b * d.t * d.nh * d.hd), 0.0);
  if (lse) lse->assign(static_cast<size_t>(d.b * d.nh * d.t), 0.0);
  for (int64_t b = 0; b < d.b; ++b)
    for (int64_t h = 0; h < d.nh; ++h)
      for (int64_t i = 0; i < d.t; ++i) {
        double l = 0;
        const std::vector<double> p = row_probs(c, x, b, h, i, scale, &l);
        if (lse) (*lse)[static_cast<size_t>((b * d.nh + h) * d.t + i)] = l;
        for (int64_t j = 0; j < c.hi(b, i); ++j) {
          const double w = p[j] * c.keep(b, h, i, j);
          for (int64_t e = 0; e < d.hd; ++e) out[out_at(d, b, i, h, e)] += w * x[qkv_at(d, b, j, 2, h, e)];
        }
      }
  return out;
}

std::vector<double> ref_backward(const Case& c, const std::vector<double>& x, const std::vector<double>& dout,
                                 double scale) {
  const Dims& d = c.d;
  std::vector<double> g(x.size(), 0.0);
  for (int64_t b = 0; b < d.b; ++b)
    for (int64_t h = 0; h < d.nh; ++h)
      for (int64_t i = 0; i < d.t; ++i) {
        const std::vector<double> p = row_probs(c, x, b, h, i, scale, nullptr);
        const int64_t hi = c.hi(b, i);
        std::vector<double> dp(static_cast<size_t>(hi));
        double dsum = 0;
        for (int64_t j = 0; j < hi; ++j) {
          const double m = c.keep(b, h, i, j);
          double s = 0;
          for (int64_t e = 0; e < d.hd; ++e) {
            s += dout[out_at(d, b, i, h, e)] * x[qkv_at(d, b, j, 2, h, e)];
            g[qkv_at(d, b, j, 2, h, e)] += p[j] * m * dout[out_at(d, b, i, h, e)];  // dV
          }
          dp[j] = s * m;
          dsum += p[j] * dp[j];
        }
        for (int64_t j = 0; j < hi; ++j) {
          const double ds = p[j] * (dp[j] - dsum) * scale;
          for (int64_t e = 0; e < d.hd; ++e) {
            g[qkv_at(d, b, i, 0, h, e)] += ds * x[qkv_at(d, b, j, 1, h, e)];  // dQ
            g[qkv_at(d, b, j, 1, h, e)] += ds * x[qkv_at(d, b, i, 0, h, e)];  // dK
          }
        }
      }
  return g;
}

std::string case_str(const Case& c) {
  std::string l;
  for (int64_t v : c.lens) l += str(l.empty() ? "" : ",", v);
  return str("attention mask B=", c.d.b, " T=", c.d.t, " NH=", c.d.nh, " HD=", c.d.hd, c.d.g ? str(" G=", c.d.g) : "",
             c.causal ? " causal" : " bidirectional", c.lens.empty() ? std::string(" no padding") : " lens=" + l,
             c.drop.p > 0 ? str(" dropout p=", c.drop.p) : "", c.window > 0 ? str(" window=", c.window) : "");
}

// The CUDA path: cuDNN (causal or not, padded or not) under the conditions of
// test_attention.cpp's attention_path, and never with dropout; else the fallback.
std::string path_of(const std::string& op, DType dt, const Case& c) {
  const bool cudnn = cuda_attention_backend() == "cudnn" && dt != DType::F32 && outputs_aligned() && c.d.hd % 8 == 0 &&
                     c.d.hd <= 128 && c.drop.p == 0;
  return op + (cudnn ? ".cudnn" : ".fallback");
}

AttentionMask mask_of(const Case& c, Device dev) {
  AttentionMask m;
  m.causal = c.causal;
  m.window = c.window;
  if (!c.lens.empty()) m.kv_lengths = make_ints(c.lens, {c.d.b}, DType::I32, dev);
  return m;
}

struct Result {
  Tensor out, lse, dqkv;
};

// fd: also check the closed-form reference against central differences.
Result run(Device dev, DType dt, const Case& c, uint64_t seed, bool fd = false) {
  const Dims& d = c.d;
  Rng rng(seed);
  const Input qkv = rand_input(rng, qkv_shape(d), dt, dev, -1.5, 1.5);
  const Input dout = rand_input(rng, out_shape(d), dt, dev, -1, 1);
  const double scale = 1 / std::sqrt(double(d.hd));
  const AttentionMask mask = mask_of(c, dev);
  const std::string name = case_name(dev, dt, case_str(c));
  Out out = make_out(out_shape(d), dt, dev), lse = make_out({d.b, d.nh, d.t}, DType::F32, dev);
  const PathProbe fwd;
  attention_forward(qkv.t, out.t, lse.t, static_cast<float>(scale), c.drop, mask);
  check_path(dev, fwd, path_of("attention_forward", dt, c), name + " forward");
  std::vector<double> lref;
  const std::vector<double> oref = ref_forward(c, qkv.v, scale, &lref);
  check_out(name + " out", out, oref, tol(dt, Kind::Attention));
  check_out(name + " lse", lse, lref, tol(dt == DType::F32 ? dt : DType::F16, Kind::Attention));

  Out dqkv = make_out(qkv_shape(d), dt, dev);
  const PathProbe bwd;
  attention_backward(dout.t, qkv.t, out.t, lse.t, dqkv.t, static_cast<float>(scale), c.drop, mask);
  check_path(dev, bwd, path_of("attention_backward", dt, c), name + " backward");
  const std::vector<double> gref = ref_backward(c, qkv.v, dout.v, scale);
  check_out(name + " dqkv", dqkv, gref, tol(dt, Kind::Attention));
  if (fd) {  // the closed form itself, against central differences of the forward
    const std::vector<double> gfd =
        fd_grad(qkv.v, [&](const std::vector<double>& x) { return ref_forward(c, x, scale); }, dout.v);
    double worst = 0, mx = 0;
    for (size_t k = 0; k < gfd.size(); ++k) worst = std::max(worst, std::abs(gfd[k] - gref[k])), mx = std::max(mx, std::abs(gref[k]));
    CHECK_MESSAGE(worst <= 1e-6 * std::max(1.0, mx), name << ": closed-form reference vs finite differences " << worst);
  }
  return {out.t, lse.t, dqkv.t};
}

// Random lengths in [1, T] for B samples, the first T (no padding) and the last 1.
std::vector<int64_t> random_lens(Rng& rng, int64_t B, int64_t T) {
  std::vector<int64_t> l(static_cast<size_t>(B));
  for (auto& v : l) v = std::clamp<int64_t>(static_cast<int64_t>(rng.uniform(1, double(T) + 1)), 1, T);
  l.front() = T;
  if (B > 1) l.back() = 1;
  return l;
}

}  // namespace

TEST_CASE("masked attention vs float64: bidirectional and causal, random kv_lengths, MHA and GQA, every dtype") {
  uint64_t seed = 8000;
  for (Device dev : test_devices())
    for (DType dt : float_dtypes())
      for (bool causal : {false, true})
        for (const Dims& d : {Dims{3, 9, 2, 8}, Dims{3, 13, 4, 16, 2}, Dims{2, 7, 3, 8, 1}}) {
          Rng rng(++seed);
          run(dev, dt, {d, causal, random_lens(rng, d.b, d.t), {}}, ++seed, dev.is_cpu() && dt == DType::F32);
          if (!causal) run(dev, dt, {d, false, {}, {}}, ++seed);  // bidirectional, no padding
        }
}

TEST_CASE("masked attention: moderately large (T = 67, closed-form f64 backward)") {
  uint64_t seed = 8100;
  for (Device dev : test_devices())
    for (DType dt : float_dtypes()) {
      run(dev, dt, {{2, 67, 4, 32, 2}, false, {67, 40}, {}}, ++seed);
      run(dev, dt, {{2, 67, 4, 32}, true, {23, 67}, {}}, ++seed);
    }
}

TEST_CASE("masked attention with dropout: mask before the softmax, dropout after") {
  uint64_t seed = 8200;
  for (Device dev : test_devices())
    for (DType dt : float_dtypes()) {
      run(dev, dt, {{3, 9, 2, 8}, false, {9, 5, 1}, {0.3f, 11, 5, 0}}, ++seed, dev.is_cpu() && dt == DType::F32);
      run(dev, dt, {{2, 11, 4, 8, 2}, true, {6, 11}, {0.2f, 12, 40, 4}}, ++seed);
      run(dev, dt, {{2, 10, 2, 16}, false, {}, {0.5f, 13, 1000, 1}}, ++seed);
    }
}

TEST_CASE("masked attention: a padded sample equals the op on its unpadded prefix; padding never leaks") {
  for (Device dev : test_devices())
    for (bool causal : {false, true}) {
      const DType dt = DType::F32;
      const Dims d{1, 12, 2, 8, 1};
      const int64_t L = 7;
      Rng rng(8300);
      const Input qkv = rand_input(rng, qkv_shape(d), dt, dev, -1.5, 1.5);
      Input dout = rand_input(rng, out_shape(d), dt, dev, -1, 1);
      // The loss ignores padded tokens (as BERT's loss mask does): dout 0 on rows >= L,
      // else their queries, which attend the real keys, add to the real dK/dV.
      for (size_t k = static_cast<size_t>(L * d.nh * d.hd); k < dout.v.size(); ++k) dout.v[k] = 0;
      dout.t = make_tensor(dout.v, out_shape(d), dt, dev);
      AttentionMask m{causal, make_ints({L}, {1}, DType::I32, dev)};
      Tensor o = Tensor::zeros(out_shape(d), dt, dev), l = Tensor::zeros({1, d.nh, d.t}, DType::F32, dev);
      Tensor g = Tensor::zeros(qkv_shape(d), dt, dev);
      attention_forward(qkv.t, o, l, 0.3f, {}, m);
      attention_backward(dout.t, qkv.t, o, l, g, 0.3f, {}, m);
      // The first L tokens alone, unmasked (T = L): the reference nobody here masked.
      const Dims p{1, L, d.nh, d.hd, 1};
      const int64_t w = (d.nh + 2) * d.hd;
      std::vector<double> qp(qkv.v.begin(), qkv.v.begin() + L * w);
      std::vector<double> dp(dout.v.begin(), dout.v.begin() + L * d.nh * d.hd);
      Tensor op = Tensor::zeros(out_shape(p), dt, dev), lp = Tensor::zeros({1, d.nh, L}, DType::F32, dev);
      Tensor gp = Tensor::zeros(qkv_shape(p), dt, dev);
      const Tensor qpt = make_tensor(qp, qkv_shape(p), dt, dev);
      attention_forward(qpt, op, lp, 0.3f, {}, AttentionMask{causal, Tensor()});
      attention_backward(make_tensor(dp, out_shape(p), dt, dev), qpt, op, lp, gp, 0.3f, {}, AttentionMask{causal, Tensor()});
      const std::vector<double> ov = values(o), opv = values(op), gv = values(g), gpv = values(gp), lv = values(l),
                                lpv = values(lp);
      const std::string name = case_name(dev, dt, causal ? "causal prefix" : "bidirectional prefix");
      const Tol t{1e-5, 1e-6, 1e-5};
      std::vector<double> got_o(ov.begin(), ov.begin() + L * d.nh * d.hd), got_g(gv.begin(), gv.begin() + L * w);
      check_close(name + " out of the real tokens", make_tensor(got_o, out_shape(p), DType::F32, Device::cpu()), opv, t);
      check_close(name + " dqkv of the real tokens", make_tensor(got_g, qkv_shape(p), DType::F32, Device::cpu()), gpv, t);
      for (int64_t h = 0; h < d.nh; ++h)
        for (int64_t i = 0; i < L; ++i) CHECK(std::abs(lv[h * d.t + i] - lpv[h * L + i]) < 1e-5);
      // Padded keys get no gradient; padded queries still attend the real keys (finite, nonzero rows).
      double kv_pad = 0, o_pad = 0;
      for (int64_t i = L; i < d.t; ++i) {
        for (int64_t e = d.nh * d.hd; e < w; ++e) kv_pad += std::abs(gv[i * w + e]);
        for (int64_t e = 0; e < d.nh * d.hd; ++e) o_pad += std::abs(ov[i * d.nh * d.hd + e]);
      }
      CHECK_MESSAGE(kv_pad == 0.0, name << ": padded keys/values got gradient " << kv_pad);
      CHECK_MESSAGE((std::isfinite(o_pad) && o_pad > 0.0), name << ": padded query rows " << o_pad);
    }
}

TEST_CASE("masked attention: the default mask is the causal op, bit for bit; all lengths T is no padding") {
  for (Device dev : test_devices())
    for (DType dt : float_dtypes()) {
      const Dims d{2, 11, 2, 8};
      Rng rng(8400);
      const Input qkv = rand_input(rng, qkv_shape(d), dt, dev, -1.5, 1.5);
      const Input dout = rand_input(rng, out_shape(d), dt, dev, -1, 1);
      auto call = [&](const AttentionMask& m) {
        Tensor o = Tensor::zeros(out_shape(d), dt, dev), l = Tensor::zeros({d.b, d.nh, d.t}, DType::F32, dev);
        Tensor g = Tensor::zeros(qkv_shape(d), dt, dev);
        attention_forward(qkv.t, o, l, 0.3f, {}, m);
        attention_backward(dout.t, qkv.t, o, l, g, 0.3f, {}, m);
        return std::vector<std::vector<double>>{values(o), values(l), values(g)};
      };
      Tensor o = Tensor::zeros(out_shape(d), dt, dev), l = Tensor::zeros({d.b, d.nh, d.t}, DType::F32, dev);
      Tensor g = Tensor::zeros(qkv_shape(d), dt, dev);
      attention_forward(qkv.t, o, l, 0.3f);
      attention_backward(dout.t, qkv.t, o, l, g, 0.3f);
      const auto plain = std::vector<std::vector<double>>{values(o), values(l), values(g)};
      CHECK(call(AttentionMask{}) == plain);
      const Tensor full = make_ints({d.t, d.t}, {d.b}, DType::I32, dev);
      const auto bidir = call(AttentionMask{false, Tensor()});
      const auto bidir_full = call(AttentionMask{false, full});
      const auto causal_full = call(AttentionMask{true, full});
      const Tol t = tol(dt, Kind::Attention);
      const std::string name = case_name(dev, dt, "lengths all T");
      for (int k = 0; k < 3; ++k) {
        check_close(name + " bidirectional", make_tensor(bidir_full[k], {int64_t(bidir[k].size())}, DType::F32, Device::cpu()), bidir[k], t);
        check_close(name + " causal", make_tensor(causal_full[k], {int64_t(plain[k].size())}, DType::F32, Device::cpu()), plain[k], t);
      }
      CHECK(bidir[0] != plain[0]);  // the two masks differ (the checks above can fail)
    }
}

TEST_CASE("masked attention: bad kv_lengths are rejected naming the op") {
  const Tensor qkv = Tensor::zeros({2, 4, 3, 2, 8}, DType::F32), out = Tensor::zeros({2, 4, 2, 8}, DType::F32);
  const Tensor lse = Tensor::zeros({2, 2, 4}, DType::F32), dqkv = Tensor::zeros(qkv.shape(), DType::F32);
  auto fwd = [&](const Tensor& l) { attention_forward(qkv, out, lse, 1, {}, AttentionMask{false, l}); };
  check_throws_naming("attention_forward: mask kv_lengths must be i32", [&] { fwd(make_ints({4, 4}, {2}, DType::I64, Device::cpu())); });
  check_throws_naming("attention_forward", [&] { fwd(make_ints({4, 4, 4}, {3}, DType::I32, Device::cpu())); }, "shape (3)");
  check_throws_naming("attention_forward: mask kv_lengths[1] = 0", [&] { fwd(make_ints({4, 0}, {2}, DType::I32, Device::cpu())); });
  check_throws_naming("attention_forward: mask kv_lengths[0] = 5", [&] { fwd(make_ints({5, 1}, {2}, DType::I32, Device::cpu())); });
  check_throws_naming("attention_backward: mask kv_lengths[0] = -1", [&] {
    attention_backward(out, qkv, out, lse, dqkv, 1, {}, AttentionMask{true, make_ints({-1, 2}, {2}, DType::I32, Device::cpu())});
  });
}

TEST_CASE("sliding-window attention vs float64: windows 1, 3, 6, with padding and dropout, MHA and GQA, every dtype") {
  uint64_t seed = 8600;
  for (Device dev : test_devices())
    for (DType dt : float_dtypes())
      for (int64_t w : {1, 3, 6})
        for (const Dims& d : {Dims{3, 9, 2, 8}, Dims{2, 13, 4, 16, 2}}) {
          Case c{d, true, {}, {}, w};
          run(dev, dt, c, ++seed, dev.is_cpu() && dt == DType::F32);
          Rng rng(++seed);
          c.lens = random_lens(rng, d.b, d.t);
          run(dev, dt, c, ++seed);
          c.drop = {0.25f, 21, 7, 1};
          run(dev, dt, c, ++seed, dev.is_cpu() && dt == DType::F32);
        }
}

TEST_CASE("sliding-window attention: T = 300 > the CPU's 256-row tile (later tiles start inside the sequence)") {
  uint64_t seed = 8700;
  for (Device dev : test_devices())
    for (DType dt : float_dtypes()) {
      run(dev, dt, {{1, 300, 2, 8, 1}, true, {}, {}, 20}, ++seed);
      run(dev, dt, {{1, 300, 2, 8}, true, {}, {0.1f, 3, 9, 0}, 255}, ++seed);
    }
}

TEST_CASE("sliding-window attention: a window of T − 1 or more is the causal op, bit for bit; bad windows refused") {
  for (Device dev : test_devices()) {
    const Dims d{2, 11, 4, 16, 2};
    const Result causal = run(dev, DType::F32, {d, true, {}, {}}, 8800);
    for (int64_t w : {10, 11, 500}) {
      const Result wide = run(dev, DType::F32, {d, true, {}, {}, w}, 8800);
      CHECK(wide.out.to_floats() == causal.out.to_floats());
      CHECK(wide.lse.to_floats() == causal.lse.to_floats());
      CHECK(wide.dqkv.to_floats() == causal.dqkv.to_floats());
    }
    const Tensor qkv = Tensor::zeros(qkv_shape(d), DType::F32, dev), out = Tensor::zeros(out_shape(d), DType::F32, dev);
    const Tensor lse = Tensor::zeros({d.b, d.nh, d.t}, DType::F32, dev);
    AttentionMask m;
    m.window = -1;
    check_throws_naming("attention_forward: mask window must be >= 0", [&] { attention_forward(qkv, out, lse, 0.25f, {}, m); });
    m.window = 3;
    m.causal = false;
    check_throws_naming("needs causal attention", [&] { attention_forward(qkv, out, lse, 0.25f, {}, m); });
  }
}
