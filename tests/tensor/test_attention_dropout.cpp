// tests/tensor/test_attention_dropout.cpp — attention dropout (attention.h's AttentionDropout).
//
// Reference: a float64 attention written here that applies the mask M drawn from
// attention_keep (the same pure Philox function, evaluated here for every
// (b, global head, i, j)): O = (P ∘ M/(1 − p))·V. Backward: float64 central
// differences of that forward with the mask fixed. Also: p = 0 is bit-for-bit the
// op without dropout; the keep rate is 1 − p; two half-head calls (first_head 0
// and NH/2, the TP = 2 split) equal one full call; the mask changes with the seed
// and the offset. On CUDA the fallback (the only dropout path) is asserted.
#include "tests/tensor/op_harness.h"

using namespace mpitron;
using namespace mpitron::test;

namespace {

struct Dims {
  int64_t b, t, nh, hd;
};
size_t qkv_at(const Dims& d, int64_t b, int64_t t, int which, int64_t h, int64_t e) {
  return static_cast<size_t>((((b * d.t + t) * 3 + which) * d.nh + h) * d.hd + e);
}
size_t out_at(const Dims& d, int64_t b, int64_t t, int64_t h, int64_t e) {
  return static_cast<size_t>(((b * d.t + t) * d.nh + h) * d.hd + e);
}

// out (B, T, NH, HD) of MHA qkv (B, T, 3, NH, HD) with dropout; lse optional.
std::vector<double> ref_dropped(const Dims& d, const std::vector<double>& qkv, double scale, const AttentionDropout& dr,
                                std::vector<double>* lse = nullptr) {
  std::vector<double> out(static_cast<size_t>(d.b * d.t * d.nh * d.hd), 0.0);
  if (lse) lse->assign(static_cast<size_t>(d.b * d.nh * d.t), 0.0);
  for (int64_t b = 0; b < d.b; ++b)
    for (int64_t h = 0; h < d.nh; ++h)
      for (int64_t i = 0; i < d.t; ++i) {
        std::vector<double> s(static_cast<size_t>(i + 1));
        double mx = -INFINITY;
        for (int64_t j = 0; j <= i; ++j) {
          double acc = 0;
          for (int64_t e = 0; e < d.hd; ++e) acc += qkv[qkv_at(d, b, i, 0, h, e)] * qkv[qkv_at(d, b, j, 1, h, e)];
          s[j] = acc * scale;
          mx = std::max(mx, s[j]);
        }
        double sum = 0;
        for (double& x : s) sum += (x = std::exp(x - mx));
        if (lse) (*lse)[static_cast<size_t>((b * d.nh + h) * d.t + i)] = mx + std::log(sum);
        for (int64_t j = 0; j <= i; ++j) {
          const bool keep = dr.p == 0 || attention_keep(dr.seed, dr.offset, b, dr.first_head + h, i, j, d.t, dr.p);
          const double w = keep ? s[j] / sum / (1.0 - dr.p) : 0.0;
          for (int64_t e = 0; e < d.hd; ++e) out[out_at(d, b, i, h, e)] += w * qkv[qkv_at(d, b, j, 2, h, e)];
        }
      }
  return out;
}

struct Result {
  Tensor out, lse, dqkv;
};

Result run(Device dev, DType dt, const Dims& d, const AttentionDropout& dr, uint64_t seed, bool check = true) {
  Rng rng(seed);
  const Input qkv = rand_input(rng, {d.b, d.t, 3, d.nh, d.hd}, dt, dev, -1.5, 1.5);
  const Input dout = rand_input(rng, {d.b, d.t, d.nh, d.hd}, dt, dev, -1, 1);
  const double scale = 1 / std::sqrt(double(d.hd));
  Out out = make_out({d.b, d.t, d.nh, d.hd}, dt, dev), lse = make_out({d.b, d.nh, d.t}, DType::F32, dev);
  const PathProbe fwd;
  attention_forward(qkv.t, out.t, lse.t, static_cast<float>(scale), dr);
  const std::string name = case_name(dev, dt, str("attention dropout p=", dr.p, " B=", d.b, " T=", d.t, " NH=", d.nh,
                                                  " HD=", d.hd, " first_head=", dr.first_head));
  if (dr.p > 0) check_path(dev, fwd, "attention_forward.fallback", name + " forward");
  Out dqkv = make_out({d.b, d.t, 3, d.nh, d.hd}, dt, dev);
  const PathProbe bwd;
  attention_backward(dout.t, qkv.t, out.t, lse.t, dqkv.t, static_cast<float>(scale), dr);
  if (dr.p > 0) check_path(dev, bwd, "attention_backward.fallback", name + " backward");
  if (check) {
    std::vector<double> lref;
    const std::vector<double> oref = ref_dropped(d, qkv.v, scale, dr, &lref);
    check_out(name + " out", out, oref, tol(dt, Kind::Attention));
    check_out(name + " lse", lse, lref, tol(dt == DType::F32 ? dt : DType::F16, Kind::Attention));
    const std::vector<double> gref =
        fd_grad(qkv.v, [&](const std::vector<double>& x) { return ref_dropped(d, x, scale, dr); }, dout.v);
    check_out(name + " dqkv", dqkv, gref, tol(dt, Kind::Attention));
  }
  return {out.t, lse.t, dqkv.t};
}

}  // namespace

TEST_CASE("attention dropout vs float64 reference with the same mask, finite-difference backward") {
  uint64_t seed = 7000;
  for (Device dev : test_devices())
    for (DType dt : float_dtypes()) {
      run(dev, dt, {1, 9, 2, 8}, {0.3f, 11, 5, 0}, ++seed);
      run(dev, dt, {2, 13, 3, 16}, {0.1f, 12, 0, 4}, ++seed);
      run(dev, dt, {1, 6, 1, 8}, {0.5f, 13, 1000, 7}, ++seed);
    }
}

TEST_CASE("attention dropout p = 0 is the op without dropout, bit for bit") {
  for (Device dev : test_devices())
    for (DType dt : float_dtypes()) {
      Rng rng(7100);
      const Dims d{2, 11, 2, 8};
      const Input qkv = rand_input(rng, {d.b, d.t, 3, d.nh, d.hd}, dt, dev, -1.5, 1.5);
      const Input dout = rand_input(rng, {d.b, d.t, d.nh, d.hd}, dt, dev, -1, 1);
      Tensor o1 = Tensor::zeros({d.b, d.t, d.nh, d.hd}, dt, dev), o2 = o1.clone();
      Tensor l1 = Tensor::zeros({d.b, d.nh, d.t}, DType::F32, dev), l2 = l1.clone();
      Tensor g1 = Tensor::zeros(qkv.t.shape(), dt, dev), g2 = g1.clone();
      attention_forward(qkv.t, o1, l1, 0.3f);
      attention_backward(dout.t, qkv.t, o1, l1, g1, 0.3f);
      attention_forward(qkv.t, o2, l2, 0.3f, AttentionDropout{0.0f, 99, 12345, 3});
      attention_backward(dout.t, qkv.t, o2, l2, g2, 0.3f, AttentionDropout{0.0f, 99, 12345, 3});
      CHECK(values(o1) == values(o2));
      CHECK(values(l1) == values(l2));
      CHECK(values(g1) == values(g2));
    }
}

TEST_CASE("attention dropout: keep rate 1 - p; the mask depends on seed, offset, batch and head") {
  const int64_t T = 256;
  for (float p : {0.1f, 0.5f}) {
    int64_t kept = 0, n = 0, diff_seed = 0, diff_off = 0, diff_b = 0, diff_h = 0;
    for (int64_t i = 0; i < T; ++i)
      for (int64_t j = 0; j <= i; ++j) {
        const bool k = attention_keep(1, 0, 0, 0, i, j, T, p);
        kept += k, ++n;
        diff_seed += k != attention_keep(2, 0, 0, 0, i, j, T, p);
        diff_off += k != attention_keep(1, 1u << 20, 0, 0, i, j, T, p);
        diff_b += k != attention_keep(1, 0, 1, 0, i, j, T, p);
        diff_h += k != attention_keep(1, 0, 0, 1, i, j, T, p);
      }
    const double rate = double(kept) / double(n), sd = std::sqrt(p * (1 - p) / double(n));
    CHECK_MESSAGE(std::abs(rate - (1 - p)) < 5 * sd, "p=" << p << " keep rate " << rate << " over " << n);
    // Independent masks differ in a fraction 2p(1 − p) of the elements.
    const double expect = 2 * p * (1 - p) * double(n);
    for (int64_t diff : {diff_seed, diff_off, diff_b, diff_h}) CHECK(std::abs(double(diff) - expect) < 0.1 * expect);
  }
  // Never the hidden dropout's stream (dropout.h: high counter word 0) at the same (seed, offset).
  int64_t same = 0;
  for (int64_t e = 0; e < 4096; ++e)
    same += attention_keep(5, 0, 0, 0, e / 64, e % 64, 64, 0.5f) == (philox_uniform(5, 0, static_cast<uint64_t>(e)) >= 0.5f);
  CHECK(std::abs(same - 2048) < 200);
}

TEST_CASE("attention dropout: two half-head calls (first_head 0 and NH/2) equal one full call") {
  for (Device dev : test_devices()) {
    const DType dt = DType::F32;
    const Dims d{2, 10, 4, 8}, h{2, 10, 2, 8};
    Rng rng(7200);
    const Input qkv = rand_input(rng, {d.b, d.t, 3, d.nh, d.hd}, dt, dev, -1.5, 1.5);
    const Input dout = rand_input(rng, {d.b, d.t, d.nh, d.hd}, dt, dev, -1, 1);
    const AttentionDropout full{0.2f, 77, 40, 0};
    Tensor o = Tensor::zeros({d.b, d.t, d.nh, d.hd}, dt, dev), l = Tensor::zeros({d.b, d.nh, d.t}, DType::F32, dev);
    Tensor g = Tensor::zeros(qkv.t.shape(), dt, dev);
    attention_forward(qkv.t, o, l, 0.25f, full);
    attention_backward(dout.t, qkv.t, o, l, g, 0.25f, full);
    const std::vector<double> ov = values(o), gv = values(g);
    for (int64_t half = 0; half < 2; ++half) {
      // This half's heads, as a TP rank holds them: qkv (B, T, 3, NH/2, HD), dout (B, T, NH/2, HD).
      std::vector<double> q(static_cast<size_t>(h.b * h.t * 3 * h.nh * h.hd)), dov(static_cast<size_t>(h.b * h.t * h.nh * h.hd));
      for (int64_t b = 0; b < d.b; ++b)
        for (int64_t t = 0; t < d.t; ++t)
          for (int64_t hh = 0; hh < h.nh; ++hh)
            for (int64_t e = 0; e < d.hd; ++e) {
              for (int w = 0; w < 3; ++w) q[qkv_at(h, b, t, w, hh, e)] = qkv.v[qkv_at(d, b, t, w, half * 2 + hh, e)];
              dov[out_at(h, b, t, hh, e)] = dout.v[out_at(d, b, t, half * 2 + hh, e)];
            }
      const Tensor qt = make_tensor(q, {h.b, h.t, 3, h.nh, h.hd}, dt, dev);
      Tensor oh = Tensor::zeros({h.b, h.t, h.nh, h.hd}, dt, dev), lh = Tensor::zeros({h.b, h.nh, h.t}, DType::F32, dev);
      Tensor gh = Tensor::zeros(qt.shape(), dt, dev);
      const AttentionDropout part{full.p, full.seed, full.offset, half * h.nh};
      attention_forward(qt, oh, lh, 0.25f, part);
      attention_backward(make_tensor(dov, {h.b, h.t, h.nh, h.hd}, dt, dev), qt, oh, lh, gh, 0.25f, part);
      const std::vector<double> ohv = values(oh), ghv = values(gh);
      int64_t bad = 0;
      for (int64_t b = 0; b < d.b; ++b)
        for (int64_t t = 0; t < d.t; ++t)
          for (int64_t hh = 0; hh < h.nh; ++hh)
            for (int64_t e = 0; e < d.hd; ++e) {
              bad += ohv[out_at(h, b, t, hh, e)] != ov[out_at(d, b, t, half * 2 + hh, e)];
              for (int w = 0; w < 3; ++w) bad += ghv[qkv_at(h, b, t, w, hh, e)] != gv[qkv_at(d, b, t, w, half * 2 + hh, e)];
            }
      CHECK_MESSAGE(bad == 0, dev.name() << " half " << half << ": " << bad << " elements differ from the full call");
    }
    // And a wrong first_head gives a different mask (the check above can fail).
    Tensor o2 = Tensor::zeros({d.b, d.t, d.nh, d.hd}, dt, dev), l2 = Tensor::zeros({d.b, d.nh, d.t}, DType::F32, dev);
    attention_forward(qkv.t, o2, l2, 0.25f, AttentionDropout{full.p, full.seed, full.offset, 1});
    CHECK(values(o2) != ov);
  }
}

TEST_CASE("attention dropout: a bad probability is rejected naming the op") {
  const Tensor qkv = Tensor::zeros({1, 4, 3, 2, 8}, DType::F32), out = Tensor::zeros({1, 4, 2, 8}, DType::F32);
  const Tensor lse = Tensor::zeros({1, 2, 4}, DType::F32);
  check_throws_naming("attention_forward: dropout probability",
                      [&] { attention_forward(qkv, out, lse, 1, AttentionDropout{1.0f}); });
  check_throws_naming("attention_backward: dropout probability", [&] {
    attention_backward(out, qkv, out, lse, Tensor::zeros(qkv.shape(), DType::F32), 1, AttentionDropout{-0.1f});
  });
}
