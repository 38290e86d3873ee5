// tests/tensor/test_swiglu.cpp — SwiGLU and GeGLU forward/backward conformance.
//
// Reference: float64 out = silu(a)·b (SwiGLU) or gelu(a)·b with the tanh GELU
// 0.5·a·(1 + tanh(√(2/π)(a + 0.044715a³))) (GeGLU, torch's gelu(approximate="tanh")) over
// the halves x = [a | b] of the last dim (Megatron's torch.chunk(x, 2, -1)), written here
// with std::exp / std::tanh in double.
// Backward: float64 central differences of that forward on small shapes, the
// closed-form derivative on large ones.
#include "tests/tensor/op_harness.h"

using namespace mpitron;
using namespace mpitron::test;

namespace {

double sigmoid(double a) { return 1.0 / (1.0 + std::exp(-a)); }

bool geglu = false;  // the activation the cases below run (set per test case)

double act(double a) {
  if (!geglu) return a * sigmoid(a);
  return 0.5 * a * (1 + std::tanh(std::sqrt(2 / M_PI) * (a + 0.044715 * a * a * a)));
}

double act_grad(double a) {
  if (!geglu) {
    const double s = sigmoid(a);
    return s + a * s * (1 - s);
  }
  const double k = std::sqrt(2 / M_PI), t = std::tanh(k * (a + 0.044715 * a * a * a));
  return 0.5 * (1 + t) + 0.5 * a * (1 - t * t) * k * (1 + 3 * 0.044715 * a * a);
}

void op_forward(const Tensor& x, const Tensor& out) { geglu ? geglu_forward(x, out) : swiglu_forward(x, out); }
void op_backward(const Tensor& dout, const Tensor& x, const Tensor& dx) {
  geglu ? geglu_backward(dout, x, dx) : swiglu_backward(dout, x, dx);
}
const char* op_name() { return geglu ? "geglu" : "swiglu"; }

std::vector<double> ref_swiglu(const std::vector<double>& x, int64_t n, int64_t f) {
  std::vector<double> out(static_cast<size_t>(n * f));
  for (int64_t r = 0; r < n; ++r)
    for (int64_t j = 0; j < f; ++j) {
      const double a = x[static_cast<size_t>(r * 2 * f + j)], b = x[static_cast<size_t>(r * 2 * f + f + j)];
      out[static_cast<size_t>(r * f + j)] = act(a) * b;
    }
  return out;
}

std::vector<double> ref_swiglu_backward(const std::vector<double>& dout, const std::vector<double>& x, int64_t n,
                                        int64_t f) {
  std::vector<double> dx(x.size());
  for (int64_t r = 0; r < n; ++r)
    for (int64_t j = 0; j < f; ++j) {
      const size_t ia = static_cast<size_t>(r * 2 * f + j), ib = ia + static_cast<size_t>(f);
      const double a = x[ia], b = x[ib], d = dout[static_cast<size_t>(r * f + j)];
      dx[ia] = d * b * act_grad(a);
      dx[ib] = d * act(a);
    }
  return dx;
}

// Leading dims: (n) or (2, n/2) so that flattening is exercised.
Shape lead(int64_t n, int64_t last) { return n % 2 == 0 && n > 1 ? Shape{2, n / 2, last} : Shape{n, last}; }

void run(Device dev, DType dt, int64_t n, int64_t f, double range, uint64_t seed) {
  Rng rng(seed);
  const Input x = rand_input(rng, lead(n, 2 * f), dt, dev, -range, range);
  Out out = make_out(lead(n, f), dt, dev);
  op_forward(x.t, out.t);
  const std::string name = case_name(dev, dt, str(op_name(), " N=", n, " F=", f, " |x|<", range));
  check_out(name + " out", out, ref_swiglu(x.v, n, f), tol(dt, Kind::Pointwise));

  const Input dout = rand_input(rng, lead(n, f), dt, dev, -1, 1);
  Out dx = make_out(lead(n, 2 * f), dt, dev);
  op_backward(dout.t, x.t, dx.t);
  const std::vector<double> g =
      n * f <= 400 ? fd_grad(x.v, [&](const std::vector<double>& v) { return ref_swiglu(v, n, f); }, dout.v, 1e-6)
                   : ref_swiglu_backward(dout.v, x.v, n, f);
  // Finite differences carry ~1e-10 absolute noise; the closed form is exact.
  Tol t = tol(dt, Kind::Pointwise);
  if (n * f <= 400) t.atol = std::max(t.atol, 1e-8);
  check_out(name + " dx", dx, g, t);
}

}  // namespace

TEST_CASE("swiglu and geglu forward and backward: awkward shapes, every dtype") {
  uint64_t seed = 8000;
  for (const bool g : {false, true})
  for (Device dev : test_devices())
    for (DType dt : float_dtypes()) {
      geglu = g;
      run(dev, dt, 1, 1, 3, ++seed);
      run(dev, dt, 3, 7, 3, ++seed);
      run(dev, dt, 4, 16, 3, ++seed);   // 16-byte chunks on CUDA
      run(dev, dt, 5, 13, 6, ++seed);
      run(dev, dt, 2, 24, 8, ++seed);   // both sigmoid tails
    }
}

TEST_CASE("swiglu and geglu: moderately large, and the far tails in f32") {
  uint64_t seed = 8100;
  for (const bool g : {false, true})
  for (Device dev : test_devices()) {
    geglu = g;
    for (DType dt : float_dtypes()) {
      run(dev, dt, 129, 344, 4, ++seed);
      run(dev, dt, 64, 1001, 4, ++seed);
    }
    run(dev, DType::F32, 16, 40, 120, ++seed);  // exp(−a) overflows for a < −88: σ must be 0, not NaN
  }
}

TEST_CASE("swiglu and geglu backward: dx may alias x") {
  for (const bool g : {false, true})
  for (Device dev : test_devices())
    for (DType dt : float_dtypes()) {
      geglu = g;
      Rng rng(31);
      const int64_t n = 6, f = 24;
      const Input x = rand_input(rng, {n, 2 * f}, dt, dev, -4, 4);
      const Input dout = rand_input(rng, {n, f}, dt, dev, -1, 1);
      op_backward(dout.t, x.t, x.t);  // in place: x now holds dx
      check_close(case_name(dev, dt, str(op_name(), "_backward in place")), x.t, ref_swiglu_backward(dout.v, x.v, n, f),
                  tol(dt, Kind::Pointwise));
    }
}

TEST_CASE("swiglu: invalid arguments throw naming the op") {
  const Tensor x = Tensor::zeros({4, 6}, DType::F32), out = Tensor::zeros({4, 3}, DType::F32);
  check_throws_naming("swiglu_forward", [&] { swiglu_forward(Tensor::zeros({4, 5}, DType::F32), out); }, "odd width");
  check_throws_naming("swiglu_forward", [&] { swiglu_forward(x, Tensor::zeros({4, 6}, DType::F32)); }, "out width");
  check_throws_naming("swiglu_forward", [&] { swiglu_forward(x, Tensor::zeros({2, 2, 3}, DType::F32)); },
                      "out leading dims");
  check_throws_naming("swiglu_forward", [&] { swiglu_forward(x, Tensor::zeros({4, 3}, DType::BF16)); }, "out dtype");
  check_throws_naming("swiglu_forward", [&] { swiglu_forward(Tensor::zeros({4, 6}, DType::I32), out); }, "int x");
  check_throws_naming("swiglu_forward", [&] { swiglu_forward(Tensor::zeros({4, 12}, DType::F32).slice(1, 0, 6), out); },
                      "non-contiguous x");
  check_throws_naming("swiglu_backward", [&] { swiglu_backward(Tensor::zeros({4, 6}, DType::F32), x, x); }, "dout shape");
  check_throws_naming("swiglu_backward", [&] { swiglu_backward(out, x, Tensor::zeros({4, 3}, DType::F32)); }, "dx shape");
  check_throws_naming("geglu_forward", [&] { geglu_forward(Tensor::zeros({4, 5}, DType::F32), out); }, "odd width");
  check_throws_naming("geglu_backward", [&] { geglu_backward(out, x, Tensor::zeros({4, 3}, DType::F32)); }, "dx shape");
}
