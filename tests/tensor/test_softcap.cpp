// tests/tensor/test_softcap.cpp — logit soft-capping forward/backward conformance (softcap.h),
// Gemma 2's final_logit_softcapping.
//
// Reference: float64 cap·tanh(x/cap) on inputs spanning ±4·cap (linear, bending and saturated
// regions; exact zeros), and for the backward dout·(1 − (out/cap)²) from the output AS STORED
// (what the op reads); in f32 also the float64 central differences of the forward (the
// derivative itself). Every dtype, awkward sizes, both output placements (vectorised and
// scalar paths asserted on CUDA), out = x and dx = dout aliasing, invalid arguments.
#include "tests/tensor/op_harness.h"

using namespace mpitron;
using namespace mpitron::test;

namespace {

void run(Device dev, DType dt, int64_t n, float cap, bool in_place, uint64_t seed) {
  Rng rng(seed);
  const Shape shape = n % 5 == 0 ? Shape{5, n / 5} : Shape{n};
  Input x = rand_input(rng, shape, dt, dev, -4.0 * cap, 4.0 * cap);
  for (size_t i = 0; i < x.v.size(); i += 7) x.v[i] = 0.0;
  x.t = make_tensor(x.v, shape, dt, dev);
  const Input dout = rand_input(rng, shape, dt, dev, -1, 1);
  std::vector<double> ref(x.v.size());
  for (size_t i = 0; i < x.v.size(); ++i) ref[i] = cap * std::tanh(x.v[i] / cap);
  const std::string name = case_name(dev, dt, str("softcap cap=", cap, " n=", n, in_place ? " in place" : ""));
  // |out| <= cap: an f32 ulp of tanh is an absolute 2^-24·cap, below the pointwise atol only for cap <= 16.
  Tol t = tol(dt, Kind::Pointwise);
  t.atol = std::max(t.atol, 2e-7 * cap);
  Tensor out_t;
  if (in_place) {
    out_t = x.t.clone();
    softcap_forward(out_t, out_t, cap);
    check_close(name + " forward", out_t, ref, t);
  } else {
    Out out = make_out(shape, dt, dev);
    const PathProbe p;
    softcap_forward(x.t, out.t, cap);
    check_path(dev, p, vec_path("softcap_forward", true), name + " forward");
    check_out(name + " forward", out, ref, t);
    out_t = out.t;
  }
  const std::vector<double> stored = values(out_t);  // what the backward reads
  std::vector<double> gref(stored.size());
  for (size_t i = 0; i < stored.size(); ++i) gref[i] = dout.v[i] * (1.0 - (stored[i] / cap) * (stored[i] / cap));
  // f32: 1 − t² with t = out·(1/cap) rounded twice cancels near |t| = 1: absolute ~4·2^-24·|dout|.
  Tol tb = tol(dt, Kind::Pointwise);
  tb.atol = std::max(tb.atol, 1e-6);
  if (in_place) {
    const Tensor d = dout.t.clone();
    softcap_backward(d, out_t, d, cap);
    check_close(name + " backward", d, gref, tb);
  } else {
    Out dx = make_out(shape, dt, dev);
    const PathProbe p;
    softcap_backward(dout.t, out_t, dx.t, cap);
    check_path(dev, p, vec_path("softcap_backward", true), name + " backward");
    check_out(name + " backward", dx, gref, tb);
  }
  if (dt == DType::F32 && n <= 2000) {  // the derivative itself: central differences of the float64 forward
    std::vector<double> fd(x.v.size());
    for (size_t i = 0; i < x.v.size(); ++i) {
      const double h = 1e-5 * cap;
      fd[i] = dout.v[i] * (std::tanh((x.v[i] + h) / cap) - std::tanh((x.v[i] - h) / cap)) * cap / (2 * h);
    }
    check_close(name + " backward vs finite differences", gref, fd, {1e-5, 1e-6, 0});
  }
}

}  // namespace

TEST_CASE("softcap forward/backward vs float64: awkward sizes, every dtype, Gemma 2's caps") {
  uint64_t seed = 4400;
  for (Device dev : test_devices())
    for (DType dt : float_dtypes())
      for (float cap : {30.0f, 50.0f, 1.0f})
        for (int64_t n : {1, 7, 13, 127, 1019, 4096 + 3, 1 << 17}) run(dev, dt, n, cap, false, ++seed);
}

TEST_CASE("softcap: out may alias x, dx may alias dout") {
  uint64_t seed = 4500;
  for (Device dev : test_devices())
    for (DType dt : float_dtypes()) run(dev, dt, 1031, 30.0f, true, ++seed);
}

TEST_CASE("softcap: saturates at ±cap with zero gradient, is odd, passes 0") {
  for (Device dev : test_devices())
    for (DType dt : float_dtypes()) {
      const Tensor x = make_tensor({1e6, -1e6, 0.0, 3.0, -3.0}, {5}, dt, dev), out = Tensor::empty({5}, dt, dev);
      softcap_forward(x, out, 30.0f);
      const std::vector<float> o = out.to_floats();
      CHECK_MESSAGE((o[0] == 30.0f && o[1] == -30.0f && o[2] == 0.0f && o[3] == -o[4] && o[3] > 2.9f && o[3] < 3.0f),
                    case_name(dev, dt, "softcap saturation") << ": " << o[0] << " " << o[1] << " " << o[2] << " " << o[3]);
      const Tensor dx = Tensor::empty({5}, dt, dev);
      softcap_backward(make_tensor({2.0, 2.0, 2.0, 2.0, 2.0}, {5}, dt, dev), out, dx, 30.0f);
      const std::vector<float> g = dx.to_floats();
      CHECK_MESSAGE((std::fabs(g[0]) < 1e-6f && std::fabs(g[1]) < 1e-6f && g[2] == 2.0f),
                    case_name(dev, dt, "softcap' saturation") << ": " << g[0] << " " << g[1] << " " << g[2]);
    }
}

TEST_CASE("softcap: invalid arguments throw naming the op") {
  const Tensor x = Tensor::zeros({4, 6}, DType::F32), out = Tensor::zeros({4, 6}, DType::F32);
  for (float bad : {0.0f, -30.0f, NAN, INFINITY})
    check_throws_naming("softcap_forward", [&] { softcap_forward(x, out, bad); }, str("cap ", bad));
  check_throws_naming("softcap_forward", [&] { softcap_forward(x, Tensor::zeros({4, 5}, DType::F32), 30); }, "out shape");
  check_throws_naming("softcap_forward", [&] { softcap_forward(x, Tensor::zeros({4, 6}, DType::BF16), 30); }, "out dtype");
  check_throws_naming("softcap_forward", [&] { softcap_forward(Tensor::zeros({4, 6}, DType::I32), out, 30); }, "int x");
  check_throws_naming("softcap_forward", [&] { softcap_forward(Tensor::zeros({6, 4}, DType::F32).transpose(0, 1), out, 30); },
                      "strided x");
  check_throws_naming("softcap_backward", [&] { softcap_backward(x, out, Tensor::zeros({24}, DType::F32), 30); }, "dx shape");
  check_throws_naming("softcap_backward", [&] { softcap_backward(Tensor::zeros({4, 6}, DType::F16), out, out, 30); },
                      "dout dtype");
  check_throws_naming("softcap_backward", [&] { softcap_backward(x, out, out, 0.0f); }, "cap 0");
}
