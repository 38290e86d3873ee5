// tests/tensor/test_relu.cpp — ReLU forward/backward conformance (relu.h), T5's
// DenseReluDense activation.
//
// Reference: float64 max(x, 0) and dout·[x > 0] (torch.relu's subgradient 0 at 0), on
// inputs that include exact zeros and values of both signs; also NaN propagation,
// the documented aliasing (out = x, dx = dout), the vectorised and scalar paths.
#include "tests/tensor/op_harness.h"

using namespace mpitron;
using namespace mpitron::test;

namespace {

void run(Device dev, DType dt, int64_t n, bool in_place, uint64_t seed) {
  Rng rng(seed);
  const Shape shape = n % 3 == 0 ? Shape{3, n / 3} : Shape{n};
  Input x = rand_input(rng, shape, dt, dev, -4, 4);
  for (size_t i = 0; i < x.v.size(); i += 5) x.v[i] = 0.0;  // exact zeros: relu'(0) = 0
  if (x.v.size() > 1) x.v[1] = round_to(dt, 1e-3);           // small of each sign
  if (x.v.size() > 2) x.v[2] = round_to(dt, -1e-3);
  x.t = make_tensor(x.v, shape, dt, dev);
  const Input dout = rand_input(rng, shape, dt, dev, -1, 1);
  std::vector<double> ref(x.v.size()), gref(x.v.size());
  for (size_t i = 0; i < x.v.size(); ++i) {
    ref[i] = std::max(x.v[i], 0.0);
    gref[i] = x.v[i] > 0 ? dout.v[i] : 0.0;
  }
  const std::string name = case_name(dev, dt, str("relu n=", n, in_place ? " in-place" : ""));
  const Tol t = tol(dt, Kind::Pointwise);
  if (in_place) {
    const Tensor xc = x.t.clone(), dc = dout.t.clone();
    relu_backward(dc, xc, dc);  // dx aliases dout
    check_close(name + " backward", dc, gref, t);
    relu_forward(xc, xc);  // out aliases x
    check_close(name + " forward", xc, ref, t);
    return;
  }
  Out out = make_out(shape, dt, dev);
  const PathProbe fwd_path;
  relu_forward(x.t, out.t);
  check_path(dev, fwd_path, vec_path("relu_forward", true), name + " forward");
  check_out(name + " forward", out, ref, t);
  Out dx = make_out(shape, dt, dev);
  const PathProbe bwd_path;
  relu_backward(dout.t, x.t, dx.t);
  check_path(dev, bwd_path, vec_path("relu_backward", true), name + " backward");
  check_out(name + " backward", dx, gref, t);
}

}  // namespace

TEST_CASE("relu forward/backward vs float64: awkward sizes, every dtype") {
  uint64_t seed = 2600;
  for (Device dev : test_devices())
    for (DType dt : float_dtypes())
      for (int64_t n : {1, 7, 13, 37, 127, 1019, 4096 + 3, 1 << 18}) run(dev, dt, n, false, ++seed);
}

TEST_CASE("relu: out may alias x, dx may alias dout") {
  uint64_t seed = 2700;
  for (Device dev : test_devices())
    for (DType dt : float_dtypes()) run(dev, dt, 1031, true, ++seed);
}

TEST_CASE("relu: NaN propagates forward (torch.relu), its gradient is 0") {
  for (Device dev : test_devices())
    for (DType dt : float_dtypes()) {
      const Tensor x = make_tensor({NAN, -1.0, 2.0, 0.0}, {4}, dt, dev), out = Tensor::empty({4}, dt, dev);
      relu_forward(x, out);
      const std::vector<float> o = out.to_floats();
      CHECK_MESSAGE((std::isnan(o[0]) && o[1] == 0.0f && o[2] == 2.0f && o[3] == 0.0f),
                    case_name(dev, dt, "relu NaN") << ": got " << o[0] << " " << o[1] << " " << o[2] << " " << o[3]);
      const Tensor dx = Tensor::empty({4}, dt, dev);
      relu_backward(make_tensor({5.0, 5.0, 5.0, 5.0}, {4}, dt, dev), x, dx);
      const std::vector<float> g = dx.to_floats();
      CHECK_MESSAGE((g[0] == 0.0f && g[1] == 0.0f && g[2] == 5.0f && g[3] == 0.0f), case_name(dev, dt, "relu' NaN"));
    }
}

TEST_CASE("relu: invalid arguments throw naming the op") {
  const Tensor x = Tensor::zeros({4, 6}, DType::F32);
  check_throws_naming("relu_forward", [&] { relu_forward(x, Tensor::zeros({4, 5}, DType::F32)); }, "shape");
  check_throws_naming("relu_forward", [&] { relu_forward(x, Tensor::zeros({4, 6}, DType::BF16)); }, "dtype");
  check_throws_naming("relu_forward", [&] { relu_forward(Tensor::zeros({3}, DType::I64), Tensor::zeros({3}, DType::I64)); },
                      "int");
  check_throws_naming("relu_forward", [&] { relu_forward(x.transpose(0, 1), Tensor::zeros({6, 4}, DType::F32)); },
                      "non-contiguous");
  check_throws_naming("relu_backward", [&] { relu_backward(Tensor::zeros({4, 5}, DType::F32), x, x); }, "dout shape");
  check_throws_naming("relu_backward", [&] { relu_backward(x, x, Tensor::zeros({4, 6}, DType::F16)); }, "dx dtype");
}
