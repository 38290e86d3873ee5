// tests/autograd/test_llama_functions.cpp — the Llama autograd functions (rmsnorm, swiglu,
// rope, grouped-query causal_attention, attention under a BERT mask) record nodes whose backward accumulates the right
// gradients.
//
// rmsnorm → swiglu: compared with float64 central differences of the composed function
// written here. rope → GQA attention: compared with the tensor ops called directly
// (those are conformance-tested in tests/tensor/), so this checks the tape's wiring:
// shapes, views, kv-group count, accumulation (+=) into existing grads.
#include "autograd/functions.h"
#include "tests/tensor/op_harness.h"

using namespace mpitron;
using namespace mpitron::test;

namespace {

// y (n, c/2) = swiglu(rmsnorm(x) · w), float64.
std::vector<double> ref_rms_swiglu(const std::vector<double>& x, const std::vector<double>& w, int64_t n, int64_t c,
                                   double eps) {
  const int64_t f = c / 2;
  std::vector<double> y(static_cast<size_t>(n * f));
  for (int64_t r = 0; r < n; ++r) {
    double ms = 0;
    for (int64_t j = 0; j < c; ++j) ms += x[r * c + j] * x[r * c + j];
    const double rs = 1 / std::sqrt(ms / c + eps);
    for (int64_t j = 0; j < f; ++j) {
      const double a = x[r * c + j] * rs * w[j], b = x[r * c + f + j] * rs * w[f + j];
      y[r * f + j] = a / (1 + std::exp(-a)) * b;
    }
  }
  return y;
}

}  // namespace

TEST_CASE("ag::rmsnorm then ag::swiglu: gradients match float64 finite differences and accumulate") {
  for (Device dev : test_devices()) {
    const int64_t n = 5, c = 12;
    Rng rng(77);
    const Input x = rand_input(rng, {n, c}, DType::F32, dev, -2, 2), w = rand_input(rng, {c}, DType::F32, dev, 0.5, 1.5);
    const Input dy = rand_input(rng, {n, c / 2}, DType::F32, dev, -1, 1);
    const Input gx0 = rand_input(rng, {n, c}, DType::F32, dev, -1, 1), gw0 = rand_input(rng, {c}, DType::F32, dev, -1, 1);
    Tape tape;
    Var xv(x.t, true), wv(w.t, true);
    xv.set_grad(gx0.t.clone());  // existing gradients: the tape must add to them
    wv.set_grad(gw0.t.clone());
    const Var y = ag::swiglu(tape, ag::rmsnorm(tape, xv, wv, 1e-5f));
    CHECK(tape.size() == 2);
    const std::string name = case_name(dev, DType::F32, "ag rmsnorm→swiglu");
    check_close(name + " y", y.value(), ref_rms_swiglu(x.v, w.v, n, c, 1e-5), tol(DType::F32, Kind::Reduction));
    tape.backward(y, dy.t);
    std::vector<double> gx = fd_grad(x.v, [&](const std::vector<double>& v) { return ref_rms_swiglu(v, w.v, n, c, 1e-5); },
                                     dy.v, 1e-6);
    std::vector<double> gw = fd_grad(w.v, [&](const std::vector<double>& v) { return ref_rms_swiglu(x.v, v, n, c, 1e-5); },
                                     dy.v, 1e-6);
    for (size_t i = 0; i < gx.size(); ++i) gx[i] += gx0.v[i];
    for (size_t i = 0; i < gw.size(); ++i) gw[i] += gw0.v[i];
    const Tol t{1e-5, 1e-6, 1e-5};
    check_close(name + " dx", xv.grad(), gx, t);
    check_close(name + " dw", wv.grad(), gw, t);
  }
}

TEST_CASE("ag::rope then ag::causal_attention with kv groups: same as the tensor ops") {
  for (Device dev : test_devices()) {
    const int64_t b = 2, t = 5, nh = 4, g = 2, hd = 8, heads = nh + 2 * g;
    Rng rng(91);
    const Input qkv = rand_input(rng, {b * t, heads * hd}, DType::F32, dev, -1.5, 1.5);
    const Input dy = rand_input(rng, {b * t, nh * hd}, DType::F32, dev, -1, 1);
    RopeArgs ra;
    ra.base = 500000;
    Tape tape;
    Var x(qkv.t, true);
    const Var y = ag::causal_attention(tape, ag::rope(tape, x, b, t, heads, nh + g, ra), b, t, nh, g);
    tape.backward(y, dy.t);

    // The same computation from the tensor ops.
    const Shape s4{b, t, heads, hd};
    const Tensor r = Tensor::empty(s4, DType::F32, dev), out = Tensor::empty({b, t, nh, hd}, DType::F32, dev);
    const Tensor lse = Tensor::empty({b, nh, t}, DType::F32, dev), dr = Tensor::empty(s4, DType::F32, dev);
    rope_forward(qkv.t.view(s4), r, nh + g, ra);
    const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
    attention_forward(r, out, lse, scale);
    attention_backward(dy.t.view({b, t, nh, hd}), r, out, lse, dr, scale);
    rope_backward(dr, dr, nh + g, ra);
    const std::string name = case_name(dev, DType::F32, "ag rope→GQA attention");
    check_close(name + " y", y.value(), values(out), Tol{1e-6, 1e-7, 0});
    check_close(name + " dqkv", x.grad(), values(dr), Tol{1e-6, 1e-7, 0});
  }
}

TEST_CASE("ag::causal_attention: a width that does not split into heads + 2·groups throws") {
  Tape tape;
  const Var x(Tensor::zeros({4, 50}, DType::F32), true);
  CHECK_THROWS_AS(ag::causal_attention(tape, x, 1, 4, 4, 2), Error);  // 50 is not 8 × HD
}

TEST_CASE("ag::attention with a BERT mask (bidirectional, kv_lengths): same as the tensor ops, grads accumulate") {
  for (Device dev : test_devices()) {
    const int64_t b = 3, t = 6, nh = 2, hd = 8;
    Rng rng(92);
    const Input qkv = rand_input(rng, {b * t, 3 * nh * hd}, DType::F32, dev, -1.5, 1.5);
    const Input dy = rand_input(rng, {b * t, nh * hd}, DType::F32, dev, -1, 1);
    const AttentionMask mask{false, make_ints({6, 2, 4}, {b}, DType::I32, dev)};
    Tape tape;
    Var x(qkv.t, true);
    const Var y = ag::attention(tape, x, b, t, nh, 0, mask);
    tape.backward(y, dy.t);

    const Shape s5{b, t, 3, nh, hd};
    const Tensor out = Tensor::empty({b, t, nh, hd}, DType::F32, dev), lse = Tensor::empty({b, nh, t}, DType::F32, dev);
    const Tensor dq = Tensor::empty(s5, DType::F32, dev);
    const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
    attention_forward(qkv.t.view(s5), out, lse, scale, {}, mask);
    attention_backward(dy.t.view({b, t, nh, hd}), qkv.t.view(s5), out, lse, dq, scale, {}, mask);
    const std::string name = case_name(dev, DType::F32, "ag attention BERT mask");
    check_close(name + " y", y.value(), values(out), Tol{1e-6, 1e-7, 0});
    check_close(name + " dqkv", x.grad(), values(dq), Tol{1e-6, 1e-7, 0});
    // The mask reached the op: the causal op gives a different output.
    Tape t2;
    CHECK(values(ag::causal_attention(t2, x, b, t, nh).value()) != values(out));
    // A second pass accumulates (+=) into the existing gradient.
    Tape t3;
    t3.backward(ag::attention(t3, x, b, t, nh, 0, mask), dy.t);
    std::vector<double> twice = values(dq);
    for (double& v : twice) v *= 2;
    check_close(name + " dqkv after two passes", x.grad(), twice, Tol{1e-6, 1e-7, 0});
  }
}
