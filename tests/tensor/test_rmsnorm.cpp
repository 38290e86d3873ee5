// tests/tensor/test_rmsnorm.cpp — RMSNorm forward/backward conformance.
//
// Reference: float64 y = x / √(mean(x²) + eps) · w, written here. Backward:
// float64 central differences of that forward on small shapes, the closed-form
// float64 backward on the large ones. dweight accumulates (+=) into random
// initial values; dx is = or += (accumulate_dx).
#include "tests/tensor/op_harness.h"

using namespace mpitron;
using namespace mpitron::test;

namespace {

struct RmsRef {
  std::vector<double> out, rstd;
};

RmsRef ref_rms(const std::vector<double>& x, const std::vector<double>& w, int64_t n, int64_t c, double eps) {
  RmsRef r;
  r.out.resize(x.size());
  r.rstd.resize(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    const double* xr = &x[static_cast<size_t>(i * c)];
    double ms = 0;
    for (int64_t j = 0; j < c; ++j) ms += xr[j] * xr[j];
    const double rs = 1.0 / std::sqrt(ms / static_cast<double>(c) + eps);
    r.rstd[i] = rs;
    for (int64_t j = 0; j < c; ++j) r.out[static_cast<size_t>(i * c + j)] = xr[j] * rs * w[j];
  }
  return r;
}

// Closed-form backward: dx = rstd·(g − x̂·mean(g·x̂)), g = dout·w;  dw = Σ_rows dout·x̂.
void ref_rms_backward(const std::vector<double>& dout, const std::vector<double>& x, const std::vector<double>& w,
                      int64_t n, int64_t c, double eps, std::vector<double>& dx, std::vector<double>& dw) {
  const RmsRef r = ref_rms(x, w, n, c, eps);
  dx.assign(x.size(), 0.0);
  dw.assign(static_cast<size_t>(c), 0.0);
  for (int64_t i = 0; i < n; ++i) {
    double m = 0;
    for (int64_t j = 0; j < c; ++j) {
      const size_t o = static_cast<size_t>(i * c + j);
      m += dout[o] * w[j] * x[o] * r.rstd[i];
      dw[j] += dout[o] * x[o] * r.rstd[i];
    }
    m /= static_cast<double>(c);
    for (int64_t j = 0; j < c; ++j) {
      const size_t o = static_cast<size_t>(i * c + j);
      dx[o] = r.rstd[i] * (dout[o] * w[j] - x[o] * r.rstd[i] * m);
    }
  }
}

void run(Device dev, DType dt, DType wgrad_dt, int64_t n, int64_t c, bool accumulate_dx, uint64_t seed,
         float eps = 1e-5f) {
  Rng rng(seed);
  std::vector<double> xv(static_cast<size_t>(n * c));
  for (int64_t i = 0; i < n; ++i) {
    const double scale = std::exp(rng.uniform(-2, 2));  // per-row scale: the RMS must be divided out
    for (int64_t j = 0; j < c; ++j) xv[static_cast<size_t>(i * c + j)] = round_to(dt, scale * rng.uniform(-2, 2));
  }
  const Shape shape = n % 2 == 0 && n > 1 ? Shape{2, n / 2, c} : Shape{n, c};  // leading dims flatten
  const Tensor x = make_tensor(xv, shape, dt, dev);
  const Input w = rand_input(rng, {c}, dt, dev, -1.5, 1.5);
  Out out = make_out(shape, dt, dev), rstd = make_out({n}, DType::F32, dev);
  rmsnorm_forward(x, w.t, out.t, rstd.t, eps);

  const RmsRef r = ref_rms(xv, w.v, n, c, eps);
  const std::string name = case_name(dev, dt, str("rmsnorm N=", n, " C=", c, " eps=", eps));
  check_out(name + " out", out, r.out, tol(dt, Kind::Reduction));
  check_out(name + " rstd", rstd, r.rstd, tol(DType::F32, Kind::Reduction));

  const Input dout = rand_input(rng, shape, dt, dev, -1, 1);
  const std::vector<double> dx0 = rand_input(rng, shape, dt, dev, -1, 1).v;
  const std::vector<double> dw0 = rand_input(rng, {c}, wgrad_dt, dev, -1, 1).v;
  Out dx = accumulate_dx ? make_out(shape, dt, dev, &dx0) : make_out(shape, dt, dev);
  Out dw = make_out({c}, wgrad_dt, dev, &dw0);
  rmsnorm_backward(dout.t, x, w.t, rstd.t, dx.t, dw.t, accumulate_dx);

  std::vector<double> gx, gw;
  if (n * c <= 600) {
    const double h = 1e-6;  // rows may be small (scale e^-2): keep the step well inside them
    gx = fd_grad(xv, [&](const std::vector<double>& v) { return ref_rms(v, w.v, n, c, eps).out; }, dout.v, h);
    gw = fd_grad(w.v, [&](const std::vector<double>& v) { return ref_rms(xv, v, n, c, eps).out; }, dout.v, h);
  } else {
    ref_rms_backward(dout.v, xv, w.v, n, c, eps, gx, gw);
  }
  for (size_t i = 0; i < gx.size() && accumulate_dx; ++i) gx[i] += dx0[i];
  for (size_t i = 0; i < gw.size(); ++i) gw[i] += dw0[i];
  check_out(name + " dx", dx, gx, tol(dt, Kind::Reduction));
  check_out(name + " dweight", dw, gw, tol(wgrad_dt == DType::F32 ? dt : wgrad_dt, Kind::Reduction));
}

}  // namespace

TEST_CASE("rmsnorm forward and backward: awkward shapes, every dtype") {
  uint64_t seed = 7000;
  for (Device dev : test_devices())
    for (DType dt : float_dtypes()) {
      run(dev, dt, dt, 1, 1, false, ++seed);
      run(dev, dt, dt, 1, 7, true, ++seed);
      run(dev, dt, DType::F32, 7, 13, false, ++seed);
      run(dev, dt, dt, 4, 37, true, ++seed);
      run(dev, dt, DType::F32, 3, 127, false, ++seed);
      run(dev, dt, dt, 6, 8, false, ++seed);  // vectorised path on CUDA
      run(dev, dt, DType::F32, 5, 64, true, ++seed, 1e-6f);  // Llama's eps
    }
}

TEST_CASE("rmsnorm: moderately large") {
  uint64_t seed = 7100;
  for (Device dev : test_devices())
    for (DType dt : float_dtypes()) {
      run(dev, dt, DType::F32, 256, 771, true, ++seed);
      run(dev, dt, dt, 129, 1024, false, ++seed);
    }
}

TEST_CASE("rmsnorm: eps dominates an all-zero row") {
  // x = 0: rstd = 1/√eps, out = 0 and dx = rstd·g (x̂ = 0) — no 0/0.
  for (Device dev : test_devices()) {
    const float eps = 1e-2f;
    const Tensor x = Tensor::zeros({2, 5}, DType::F32, dev);
    Rng rng(3);
    const Input w = rand_input(rng, {5}, DType::F32, dev, 0.5, 1.5);
    Out out = make_out({2, 5}, DType::F32, dev), rstd = make_out({2}, DType::F32, dev);
    rmsnorm_forward(x, w.t, out.t, rstd.t, eps);
    check_out(case_name(dev, DType::F32, "rmsnorm zero rows out"), out, std::vector<double>(10, 0.0),
              tol(DType::F32, Kind::Reduction));
    check_out(case_name(dev, DType::F32, "rmsnorm zero rows rstd"), rstd, std::vector<double>(2, 10.0),
              tol(DType::F32, Kind::Reduction));
    const Input dout = rand_input(rng, {2, 5}, DType::F32, dev, -1, 1);
    Out dx = make_out({2, 5}, DType::F32, dev);
    rmsnorm_backward(dout.t, x, w.t, rstd.t, dx.t, Tensor());
    std::vector<double> gx(10);
    for (size_t i = 0; i < 10; ++i) gx[i] = 10.0 * dout.v[i] * w.v[i % 5];
    check_out(case_name(dev, DType::F32, "rmsnorm zero rows dx"), dx, gx, tol(DType::F32, Kind::Reduction));
  }
}

TEST_CASE("rmsnorm backward: dweight only, and dx only") {
  for (Device dev : test_devices()) {
    Rng rng(5);
    const Input x = rand_input(rng, {3, 5}, DType::F32, dev, -1, 1);
    const Input w = rand_input(rng, {5}, DType::F32, dev, 0.5, 1.5);
    const Tensor out = Tensor::empty({3, 5}, DType::F32, dev), rstd = Tensor::empty({3}, DType::F32, dev);
    rmsnorm_forward(x.t, w.t, out, rstd);
    const Input dout = rand_input(rng, {3, 5}, DType::F32, dev, -1, 1);
    std::vector<double> gx, gw;
    ref_rms_backward(dout.v, x.v, w.v, 3, 5, 1e-5, gx, gw);
    Out dx = make_out({3, 5}, DType::F32, dev);
    rmsnorm_backward(dout.t, x.t, w.t, rstd, dx.t, Tensor());
    check_out(case_name(dev, DType::F32, "rmsnorm_backward dx only"), dx, gx, tol(DType::F32, Kind::Reduction));
    const std::vector<double> zeros(5, 0.0);
    Out dw = make_out({5}, DType::F32, dev, &zeros);
    rmsnorm_backward(dout.t, x.t, w.t, rstd, Tensor(), dw.t);
    check_out(case_name(dev, DType::F32, "rmsnorm_backward dweight only"), dw, gw, tol(DType::F32, Kind::Reduction));
  }
}

TEST_CASE("rmsnorm: invalid arguments throw naming the op") {
  const Tensor x = Tensor::zeros({4, 6}, DType::F32), w = Tensor::zeros({6}, DType::F32);
  const Tensor out = Tensor::zeros({4, 6}, DType::F32), st = Tensor::zeros({4}, DType::F32);
  check_throws_naming("rmsnorm_forward", [&] { rmsnorm_forward(x, Tensor::zeros({5}, DType::F32), out, st); },
                      "weight shape");
  check_throws_naming("rmsnorm_forward", [&] { rmsnorm_forward(x, Tensor::zeros({6}, DType::BF16), out, st); },
                      "weight dtype");
  check_throws_naming("rmsnorm_forward", [&] { rmsnorm_forward(x, w, Tensor::zeros({4, 6}, DType::BF16), st); },
                      "out dtype");
  check_throws_naming("rmsnorm_forward", [&] { rmsnorm_forward(x, w, out, Tensor::zeros({4}, DType::BF16)); },
                      "rstd dtype");
  check_throws_naming("rmsnorm_forward", [&] { rmsnorm_forward(x, w, out, Tensor::zeros({3}, DType::F32)); },
                      "rstd shape");
  check_throws_naming("rmsnorm_forward", [&] { rmsnorm_forward(x, w, out, st, -1.0f); }, "negative eps");
  check_throws_naming("rmsnorm_forward", [&] { rmsnorm_forward(Tensor::zeros({4, 6}, DType::I32), w, out, st); },
                      "int x");
  check_throws_naming("rmsnorm_forward", [&] { rmsnorm_forward(Tensor::zeros({4, 12}, DType::F32).slice(1, 0, 6), w, out, st); },
                      "non-contiguous x");
  check_throws_naming("rmsnorm_backward", [&] { rmsnorm_backward(Tensor::zeros({4, 5}, DType::F32), x, w, st, out, w); },
                      "dout shape");
  check_throws_naming("rmsnorm_backward", [&] { rmsnorm_backward(out, x, w, st, out, Tensor::zeros({6}, DType::F16)); },
                      "dweight dtype");
  check_throws_naming("rmsnorm_backward", [&] { rmsnorm_backward(out, x, w, st, Tensor::zeros({4, 6}, DType::BF16), w); },
                      "dx dtype");
}
