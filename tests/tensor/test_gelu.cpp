// tests/tensor/test_gelu.cpp — GELU forward/backward conformance: the tanh approximation
// (gelu_*) and the exact erf form (gelu_erf_*).
//
// Reference: the float64 formula 0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³))), and for
// the erf form 0.5·x·erfc(−x/√2) in float64.
// Backward: float64 central differences of it (GELU is pointwise, so one
// difference per element). Also the documented aliasing: out = x, dx = dout.
// The CUDA kernels' formula itself (tensor/cuda/gelu_math.h, __host__ __device__)
// is checked on the CPU against float64 with RELATIVE error over x in [-10, 10],
// where the textbook 0.5·x·(1 + tanh u) loses all precision below x ≈ −3.
#include "tensor/cuda/gelu_math.h"
#include "tests/tensor/op_harness.h"

using namespace mpitron;
using namespace mpitron::test;

namespace {

double ref_gelu(double x) {
  const double k = std::sqrt(2.0 / M_PI);
  return 0.5 * x * (1.0 + std::tanh(k * (x + 0.044715 * x * x * x)));
}

double ref_gelu_erf(double x) { return 0.5 * x * std::erfc(-x / std::sqrt(2.0)); }

void run(Device dev, DType dt, int64_t n, bool in_place, uint64_t seed, bool exact = false) {
  const auto ref_f = exact ? ref_gelu_erf : ref_gelu;
  const std::string fwd = exact ? "gelu_erf_forward" : "gelu_forward", bwd = exact ? "gelu_erf_backward" : "gelu_backward";
  Rng rng(seed);
  const Shape shape = n % 3 == 0 ? Shape{3, n / 3} : Shape{n};
  const Input x = rand_input(rng, shape, dt, dev, -6, 6);
  const Input dout = rand_input(rng, shape, dt, dev, -1, 1);
  std::vector<double> ref(x.v.size()), gref(x.v.size());
  const double h = 1e-5;
  for (size_t i = 0; i < x.v.size(); ++i) {
    ref[i] = ref_f(x.v[i]);
    gref[i] = dout.v[i] * (ref_f(x.v[i] + h) - ref_f(x.v[i] - h)) / (2 * h);
  }
  const std::string name = case_name(dev, dt, str(exact ? "gelu_erf" : "gelu", " n=", n, in_place ? " in-place" : ""));
  if (in_place) {
    const Tensor xc = x.t.clone(), dc = dout.t.clone();
    gelu_backward(dc, xc, dc, exact);  // dx aliases dout
    check_close(name + " backward", dc, gref, tol(dt, Kind::Pointwise));
    gelu_forward(xc, xc, exact);  // out aliases x
    check_close(name + " forward", xc, ref, tol(dt, Kind::Pointwise));
    return;
  }
  Out out = make_out(shape, dt, dev);
  const PathProbe fwd_path;
  gelu_forward(x.t, out.t, exact);
  check_path(dev, fwd_path, vec_path(fwd, true), name + " forward");  // any n: 8-wide with a scalar tail
  check_out(name + " forward", out, ref, tol(dt, Kind::Pointwise));
  Out dx = make_out(shape, dt, dev);
  const PathProbe bwd_path;
  gelu_backward(dout.t, x.t, dx.t, exact);
  check_path(dev, bwd_path, vec_path(bwd, true), name + " backward");
  // gelu' crosses zero near x = -0.75: an absolute floor of a few f32 ulps of the terms.
  Tol t = tol(dt, Kind::Pointwise);
  t.atol = std::max(t.atol, 4e-7);
  check_out(name + " backward", dx, gref, t);
}

}  // namespace

TEST_CASE("gelu forward/backward: awkward sizes, every dtype") {
  uint64_t seed = 2000;
  for (Device dev : test_devices())
    for (DType dt : float_dtypes())
      for (int64_t n : {1, 7, 13, 37, 127, 1019, 4096 + 3, 1 << 18}) run(dev, dt, n, false, ++seed);
}

TEST_CASE("gelu: out may alias x, dx may alias dout") {
  uint64_t seed = 2100;
  for (Device dev : test_devices())
    for (DType dt : float_dtypes()) run(dev, dt, 1031, true, ++seed);
}

TEST_CASE("gelu_erf (exact) forward/backward: awkward sizes, every dtype, aliasing") {
  uint64_t seed = 2200;
  for (Device dev : test_devices())
    for (DType dt : float_dtypes()) {
      for (int64_t n : {1, 7, 13, 37, 127, 1019, 4096 + 3, 1 << 18}) run(dev, dt, n, false, ++seed, true);
      run(dev, dt, 1031, true, ++seed, true);
    }
}

TEST_CASE("gelu_erf differs from the tanh approximation by more than fp32 noise (why BERT needs it)") {
  // max |gelu_erf − gelu_tanh| over x in [−6, 6] in float64: 4.73e-4 (at x ≈ −2.70),
  // ~5e5 f32 ulps of the value there (gelu(−2.7) ≈ −0.0094), so an HF BERT ("gelu") run with the tanh
  // form would differ from transformers' logits by 6e-4 (tests/apps/test_hf_bert.cpp), not by fp32 rounding.
  double worst = 0;
  for (int i = -600; i <= 600; ++i) worst = std::max(worst, std::fabs(ref_gelu_erf(i / 100.0) - ref_gelu(i / 100.0)));
  MESSAGE("max |gelu_erf - gelu_tanh| on [-6, 6]: ", worst);
  CHECK(worst > 1e-4);
  CHECK(worst < 1e-3);
}

// The same function in float64 without the cancellation (even float64's 1 + tanh u
// is 0 at x = −10), through the identity (1 + tanh u)/2 = 1/(1 + e^(−2u)), and
// its derivative in closed form: d/dx [x·s] = s + x·2s(1 − s)·du/dx.
double ref_gelu_sig(double x, double* grad) {
  const double k = std::sqrt(2.0 / M_PI), u = k * (x + 0.044715 * x * x * x);
  const double s = 1.0 / (1.0 + std::exp(-2.0 * u));
  *grad = s + 2.0 * x * s * (1.0 - s) * k * (1.0 + 3.0 * 0.044715 * x * x);
  return x * s;
}

TEST_CASE("gelu: the CUDA kernels' formula keeps relative precision for negative x (float64, x in [-10, 10])") {
  // Every 1/64 step of x in f32: relative error of a few f32 roundings, amplified by
  // |2u| ≤ 88 through exp (≈ 88 · 2^-24 ≈ 5e-6); 1e-4 leaves room, the old form
  // is off by > 1e-3 at x = −4 and returns exactly 0 (relative error 1) from x ≈ −6.
  int checked = 0;
  double worst_f = 0, worst_g = 0;
  for (int i = -640; i <= 640; ++i) {
    const float x = static_cast<float>(i) / 64.0f;
    const double xd = x;
    double g;
    const double f = ref_gelu_sig(xd, &g);
    const double ef = std::fabs(gelu_math::gelu(x) - f), eg = std::fabs(gelu_math::gelu_grad(x) - g);
    // gelu is 0 only at x = 0; gelu' is 0 near x = −0.75, where an absolute floor applies.
    const double bf = 1e-4 * std::fabs(f) + 1e-45, bg = 1e-4 * std::fabs(g) + (x > -2.0f ? 1e-6 : 1e-45);
    worst_f = std::max(worst_f, ef / bf);
    worst_g = std::max(worst_g, eg / bg);
    CHECK_MESSAGE(ef <= bf, "gelu(" << x << ") = " << gelu_math::gelu(x) << ", float64 " << f);
    CHECK_MESSAGE(eg <= bg, "gelu'(" << x << ") = " << gelu_math::gelu_grad(x) << ", float64 " << g);
    ++checked;
  }
  MESSAGE("gelu_math: ", checked, " points, worst err/bound forward ", worst_f, ", backward ", worst_g);
  // The two float64 forms agree where the tanh form has not yet cancelled (a check of the reference).
  for (double x : {-3.0, -1.0, -0.5, 0.5, 2.0, 6.0}) {
    double g;
    CHECK(std::fabs(ref_gelu_sig(x, &g) - ref_gelu(x)) <= 1e-12 * std::max(1.0, std::fabs(x)));
  }
}

TEST_CASE("gelu_erf: the CUDA kernels' formula keeps relative precision (float64, x in [-10, 10])") {
  // erfc keeps Φ(x) to relative f32 precision in the lower tail (1 + erf would cancel);
  // gelu_erf' = Φ + x·φ crosses zero near x = −0.75 (absolute floor there).
  double worst_f = 0, worst_g = 0;
  for (int i = -640; i <= 640; ++i) {
    const float x = static_cast<float>(i) / 64.0f;
    const double xd = x, f = ref_gelu_erf(xd);
    const double g = 0.5 * std::erfc(-xd / std::sqrt(2.0)) + xd * std::exp(-0.5 * xd * xd) / std::sqrt(2 * M_PI);
    const double ef = std::fabs(gelu_math::gelu_erf(x) - f), eg = std::fabs(gelu_math::gelu_erf_grad(x) - g);
    const double bf = 1e-5 * std::fabs(f) + 1e-45, bg = 1e-5 * std::fabs(g) + (x > -2.0f ? 1e-6 : 1e-45);
    worst_f = std::max(worst_f, ef / bf);
    worst_g = std::max(worst_g, eg / bg);
    CHECK_MESSAGE(ef <= bf, "gelu_erf(" << x << ") = " << gelu_math::gelu_erf(x) << ", float64 " << f);
    CHECK_MESSAGE(eg <= bg, "gelu_erf'(" << x << ") = " << gelu_math::gelu_erf_grad(x) << ", float64 " << g);
  }
  MESSAGE("gelu_math erf: worst err/bound forward ", worst_f, ", backward ", worst_g);
}

TEST_CASE("gelu: invalid arguments throw naming the op") {
  check_throws_naming("gelu_erf_forward",
                      [&] { gelu_erf_forward(Tensor::zeros({4, 6}, DType::F32), Tensor::zeros({4, 5}, DType::F32)); },
                      "shape");
  check_throws_naming("gelu_erf_backward", [&] {
    gelu_erf_backward(Tensor::zeros({4, 5}, DType::F32), Tensor::zeros({4, 6}, DType::F32), Tensor::zeros({4, 6}, DType::F32));
  }, "dout shape");
  const Tensor x = Tensor::zeros({4, 6}, DType::F32);
  check_throws_naming("gelu_forward", [&] { gelu_forward(x, Tensor::zeros({4, 5}, DType::F32)); }, "shape");
  check_throws_naming("gelu_forward", [&] { gelu_forward(x, Tensor::zeros({4, 6}, DType::BF16)); }, "dtype");
  check_throws_naming("gelu_forward", [&] { gelu_forward(Tensor::zeros({3}, DType::I64), Tensor::zeros({3}, DType::I64)); },
                      "int");
  check_throws_naming("gelu_backward", [&] { gelu_backward(Tensor::zeros({4, 5}, DType::F32), x, x); }, "dout shape");
  check_throws_naming("gelu_forward", [&] { gelu_forward(x.transpose(0, 1), Tensor::zeros({6, 4}, DType::F32)); },
                      "non-contiguous");
}
