// tests/tensor/test_softmax.cpp — softmax over the last dim, forward/backward conformance.
//
// Reference: float64 max-subtracted softmax. Backward: float64 central
// differences per row (rows are independent) for C <= 127, the closed form
// y ⊙ (dout − Σ dout·y) in float64 beyond. Backward is fed the op's own forward
// output, as in training.
#include "tests/tensor/op_harness.h"

using namespace mpitron;
using namespace mpitron::test;

namespace {

std::vector<double> ref_softmax_row(const std::vector<double>& x) {
  double mx = -INFINITY;
  for (double v : x) mx = std::max(mx, v);
  std::vector<double> y(x.size());
  double s = 0;
  for (size_t i = 0; i < x.size(); ++i) s += (y[i] = std::exp(x[i] - mx));
  for (double& v : y) v /= s;
  return y;
}

void run(Device dev, DType dt, int64_t n, int64_t c, double offset, uint64_t seed) {
  Rng rng(seed);
  std::vector<double> xv(static_cast<size_t>(n * c));
  for (auto& v : xv) v = round_to(dt, offset + rng.uniform(-8, 8));
  const Shape shape = n % 2 == 0 ? Shape{2, n / 2, c} : Shape{n, c};
  const Tensor x = make_tensor(xv, shape, dt, dev);
  const Input dout = rand_input(rng, shape, dt, dev, -1, 1);
  std::vector<double> ref, gref;
  for (int64_t i = 0; i < n; ++i) {
    const std::vector<double> xr(xv.begin() + i * c, xv.begin() + (i + 1) * c);
    const std::vector<double> dr(dout.v.begin() + i * c, dout.v.begin() + (i + 1) * c);
    const std::vector<double> y = ref_softmax_row(xr);
    ref.insert(ref.end(), y.begin(), y.end());
    if (c <= 127) {
      const std::vector<double> g = fd_grad(xr, ref_softmax_row, dr);
      gref.insert(gref.end(), g.begin(), g.end());
    } else {
      double dot = 0;
      for (int64_t j = 0; j < c; ++j) dot += dr[j] * y[j];
      for (int64_t j = 0; j < c; ++j) gref.push_back(y[j] * (dr[j] - dot));
    }
  }
  const std::string name = case_name(dev, dt, str("softmax N=", n, " C=", c, " offset=", offset));
  Out out = make_out(shape, dt, dev);
  const PathProbe fwd_path;
  softmax_forward(x, out.t);
  check_path(dev, fwd_path, vec_path("softmax_forward", c % 8 == 0), name + " forward");
  check_out(name + " forward", out, ref, tol(dt, Kind::Reduction));
  Out dx = make_out(shape, dt, dev);
  const PathProbe bwd_path;
  softmax_backward(dout.t, out.t, dx.t);
  check_path(dev, bwd_path, vec_path("softmax_backward", c % 8 == 0), name + " backward");
  check_out(name + " backward", dx, gref, tol(dt, Kind::Reduction));
}

}  // namespace

TEST_CASE("softmax forward/backward: awkward shapes, every dtype") {
  uint64_t seed = 3000;
  for (Device dev : test_devices())
    for (DType dt : float_dtypes()) {
      run(dev, dt, 1, 1, 0, ++seed);
      run(dev, dt, 7, 13, 0, ++seed);
      run(dev, dt, 4, 37, 0, ++seed);
      run(dev, dt, 3, 127, 0, ++seed);
      run(dev, dt, 37, 1000, 0, ++seed);
      run(dev, dt, 64, 4099, 0, ++seed);
    }
}

TEST_CASE("softmax: large logits do not overflow (max subtraction)") {
  uint64_t seed = 3100;
  for (Device dev : test_devices()) {
    run(dev, DType::F32, 5, 37, 1000, ++seed);
    run(dev, DType::F32, 5, 37, -1000, ++seed);
    run(dev, DType::BF16, 5, 37, 3000, ++seed);  // exp(3000) is Inf even in f32
  }
}

TEST_CASE("softmax: invalid arguments throw naming the op") {
  const Tensor x = Tensor::zeros({4, 6}, DType::F32);
  check_throws_naming("softmax_forward", [&] { softmax_forward(x, Tensor::zeros({4, 5}, DType::F32)); }, "shape");
  check_throws_naming("softmax_forward", [&] { softmax_forward(x, Tensor::zeros({4, 6}, DType::F16)); }, "dtype");
  check_throws_naming("softmax_backward", [&] { softmax_backward(x, x, Tensor::zeros({6, 4}, DType::F32)); }, "dx");
}
