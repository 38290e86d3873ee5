// tests/tensor/test_gelu.cpp — GELU (tanh approximation) forward/backward conformance.
//
// Reference: the float64 formula 0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³))).
// Backward: float64 central differences of it (GELU is pointwise, so one
// difference per element). Also the documented aliasing: out = x, dx = dout.
#include "tests/tensor/op_harness.h"

using namespace mpitron;
using namespace mpitron::test;

namespace {

double ref_gelu(double x) {
  const double k = std::sqrt(2.0 / M_PI);
  return 0.5 * x * (1.0 + std::tanh(k * (x + 0.044715 * x * x * x)));
}

void run(Device dev, DType dt, int64_t n, bool in_place, uint64_t seed) {
  Rng rng(seed);
  const Shape shape = n % 3 == 0 ? Shape{3, n / 3} : Shape{n};
  const Input x = rand_input(rng, shape, dt, dev, -6, 6);
  const Input dout = rand_input(rng, shape, dt, dev, -1, 1);
  std::vector<double> ref(x.v.size()), gref(x.v.size());
  const double h = 1e-5;
  for (size_t i = 0; i < x.v.size(); ++i) {
    ref[i] = ref_gelu(x.v[i]);
    gref[i] = dout.v[i] * (ref_gelu(x.v[i] + h) - ref_gelu(x.v[i] - h)) / (2 * h);
  }
  const std::string name = case_name(dev, dt, str("gelu n=", n, in_place ? " in-place" : ""));
  if (in_place) {
    const Tensor xc = x.t.clone(), dc = dout.t.clone();
    gelu_backward(dc, xc, dc);  // dx aliases dout
    check_close(name + " backward", dc, gref, tol(dt, Kind::Pointwise));
    gelu_forward(xc, xc);  // out aliases x
    check_close(name + " forward", xc, ref, tol(dt, Kind::Pointwise));
    return;
  }
  Out out = make_out(shape, dt, dev);
  gelu_forward(x.t, out.t);
  check_out(name + " forward", out, ref, tol(dt, Kind::Pointwise));
  Out dx = make_out(shape, dt, dev);
  gelu_backward(dout.t, x.t, dx.t);
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

TEST_CASE("gelu: invalid arguments throw naming the op") {
  const Tensor x = Tensor::zeros({4, 6}, DType::F32);
  check_throws_naming("gelu_forward", [&] { gelu_forward(x, Tensor::zeros({4, 5}, DType::F32)); }, "shape");
  check_throws_naming("gelu_forward", [&] { gelu_forward(x, Tensor::zeros({4, 6}, DType::BF16)); }, "dtype");
  check_throws_naming("gelu_forward", [&] { gelu_forward(Tensor::zeros({3}, DType::I64), Tensor::zeros({3}, DType::I64)); },
                      "int");
  check_throws_naming("gelu_backward", [&] { gelu_backward(Tensor::zeros({4, 5}, DType::F32), x, x); }, "dout shape");
  check_throws_naming("gelu_forward", [&] { gelu_forward(x.transpose(0, 1), Tensor::zeros({6, 4}, DType::F32)); },
                      "non-contiguous");
}
