// tests/tensor/test_layernorm.cpp — layernorm forward/backward conformance.
//
// Reference: float64 two-pass mean/variance (biased), written here. Backward:
// float64 central differences of that forward on small shapes, the closed-form
// float64 backward on the large one. dweight/dbias accumulate (+=) into
// random initial values; dx is = or += (accumulate_dx).
#include "tests/tensor/op_harness.h"

using namespace mpitron;
using namespace mpitron::test;

namespace {

struct LnRef {
  std::vector<double> out, mean, rstd;
};

LnRef ref_ln(const std::vector<double>& x, const std::vector<double>& w, const std::vector<double>& b, int64_t n,
             int64_t c, double eps) {
  LnRef r;
  r.out.resize(x.size());
  r.mean.resize(static_cast<size_t>(n));
  r.rstd.resize(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    const double* xr = &x[static_cast<size_t>(i * c)];
    double mu = 0, var = 0;
    for (int64_t j = 0; j < c; ++j) mu += xr[j];
    mu /= static_cast<double>(c);
    for (int64_t j = 0; j < c; ++j) var += (xr[j] - mu) * (xr[j] - mu);
    var /= static_cast<double>(c);
    const double rs = 1.0 / std::sqrt(var + eps);
    r.mean[i] = mu;
    r.rstd[i] = rs;
    for (int64_t j = 0; j < c; ++j) r.out[static_cast<size_t>(i * c + j)] = (xr[j] - mu) * rs * w[j] + b[j];
  }
  return r;
}

// Closed-form backward (used where finite differences would be too slow).
void ref_ln_backward(const std::vector<double>& dout, const std::vector<double>& x, const std::vector<double>& w,
                     int64_t n, int64_t c, double eps, std::vector<double>& dx, std::vector<double>& dw,
                     std::vector<double>& db) {
  const std::vector<double> zeros(static_cast<size_t>(c), 0.0);
  const LnRef r = ref_ln(x, w, zeros, n, c, eps);
  dx.assign(x.size(), 0.0);
  dw.assign(static_cast<size_t>(c), 0.0);
  db.assign(static_cast<size_t>(c), 0.0);
  for (int64_t i = 0; i < n; ++i) {
    double m1 = 0, m2 = 0;
    for (int64_t j = 0; j < c; ++j) {
      const size_t o = static_cast<size_t>(i * c + j);
      const double xhat = (x[o] - r.mean[i]) * r.rstd[i], g = dout[o] * w[j];
      m1 += g;
      m2 += g * xhat;
      dw[j] += dout[o] * xhat;
      db[j] += dout[o];
    }
    m1 /= static_cast<double>(c);
    m2 /= static_cast<double>(c);
    for (int64_t j = 0; j < c; ++j) {
      const size_t o = static_cast<size_t>(i * c + j);
      const double xhat = (x[o] - r.mean[i]) * r.rstd[i];
      dx[o] = r.rstd[i] * (dout[o] * w[j] - m1 - xhat * m2);
    }
  }
}

void run(Device dev, DType dt, DType wgrad_dt, int64_t n, int64_t c, bool accumulate_dx, uint64_t seed) {
  const float eps = 1e-5f;
  Rng rng(seed);
  std::vector<double> xv(static_cast<size_t>(n * c));
  for (int64_t i = 0; i < n; ++i) {
    const double off = rng.uniform(-3, 3);  // per-row offset: the mean must be subtracted
    for (int64_t j = 0; j < c; ++j) xv[static_cast<size_t>(i * c + j)] = round_to(dt, off + rng.uniform(-2, 2));
  }
  const Shape shape = n % 2 == 0 && n > 1 ? Shape{2, n / 2, c} : Shape{n, c};  // leading dims flatten
  const Tensor x = make_tensor(xv, shape, dt, dev);
  const Input w = rand_input(rng, {c}, dt, dev, 0.5, 1.5);
  const Input b = rand_input(rng, {c}, dt, dev, -0.5, 0.5);
  Out out = make_out(shape, dt, dev), mean = make_out({n}, DType::F32, dev), rstd = make_out({n}, DType::F32, dev);
  const PathProbe fwd_path;
  layernorm_forward(x, w.t, b.t, out.t, mean.t, rstd.t, eps);

  const LnRef r = ref_ln(xv, w.v, b.v, n, c, eps);
  const std::string name = case_name(dev, dt, str("layernorm N=", n, " C=", c));
  // The 8-wide row kernel when C % 8 == 0 and the outputs are aligned (inputs always are).
  check_path(dev, fwd_path, vec_path("layernorm_forward", c % 8 == 0), name);
  check_out(name + " out", out, r.out, tol(dt, Kind::Reduction));
  check_out(name + " mean", mean, r.mean, tol(DType::F32, Kind::Reduction));
  check_out(name + " rstd", rstd, r.rstd, tol(DType::F32, Kind::Reduction));

  // Backward.
  const Input dout = rand_input(rng, shape, dt, dev, -1, 1);
  const std::vector<double> dx0 = rand_input(rng, shape, dt, dev, -1, 1).v;
  const std::vector<double> dw0 = rand_input(rng, {c}, wgrad_dt, dev, -1, 1).v;
  const std::vector<double> db0 = rand_input(rng, {c}, wgrad_dt, dev, -1, 1).v;
  Out dx = accumulate_dx ? make_out(shape, dt, dev, &dx0) : make_out(shape, dt, dev);
  Out dw = make_out({c}, wgrad_dt, dev, &dw0), db = make_out({c}, wgrad_dt, dev, &db0);
  const PathProbe bwd_path;
  layernorm_backward(dout.t, x, w.t, mean.t, rstd.t, dx.t, dw.t, db.t, accumulate_dx);
  check_path(dev, bwd_path, vec_path("layernorm_backward", c % 8 == 0), name + " backward");

  std::vector<double> gx, gw, gb;
  if (n * c <= 600) {
    gx = fd_grad(xv, [&](const std::vector<double>& v) { return ref_ln(v, w.v, b.v, n, c, eps).out; }, dout.v);
    gw = fd_grad(w.v, [&](const std::vector<double>& v) { return ref_ln(xv, v, b.v, n, c, eps).out; }, dout.v);
    gb = fd_grad(b.v, [&](const std::vector<double>& v) { return ref_ln(xv, w.v, v, n, c, eps).out; }, dout.v);
  } else {
    ref_ln_backward(dout.v, xv, w.v, n, c, eps, gx, gw, gb);
  }
  for (size_t i = 0; i < gx.size() && accumulate_dx; ++i) gx[i] += dx0[i];
  for (size_t i = 0; i < gw.size(); ++i) gw[i] += dw0[i], gb[i] += db0[i];
  // C = 1: xhat is 0 and rstd = 1/sqrt(eps) ≈ 316, so dx is pure roundoff times 316.
  Tol tx = tol(dt, Kind::Reduction);
  if (c == 1) tx.atol = 1e-3;
  check_out(name + " dx", dx, gx, tx);
  check_out(name + " dweight", dw, gw, tol(wgrad_dt == DType::F32 ? dt : wgrad_dt, Kind::Reduction));
  check_out(name + " dbias", db, gb, tol(wgrad_dt == DType::F32 ? dt : wgrad_dt, Kind::Reduction));
}

}  // namespace

TEST_CASE("layernorm forward and backward: awkward shapes, every dtype") {
  uint64_t seed = 1000;
  for (Device dev : test_devices())
    for (DType dt : float_dtypes()) {
      run(dev, dt, dt, 1, 1, false, ++seed);
      run(dev, dt, dt, 1, 7, true, ++seed);
      run(dev, dt, DType::F32, 7, 13, false, ++seed);
      run(dev, dt, dt, 4, 37, true, ++seed);
      run(dev, dt, DType::F32, 3, 127, false, ++seed);
      run(dev, dt, dt, 6, 8, false, ++seed);
      run(dev, dt, DType::F32, 5, 64, true, ++seed);  // 8-wide rows when aligned
    }
}

TEST_CASE("layernorm: moderately large") {
  uint64_t seed = 1100;
  for (Device dev : test_devices())
    for (DType dt : float_dtypes()) run(dev, dt, DType::F32, 256, 771, true, ++seed);
}

TEST_CASE("layernorm backward: undefined dweight/dbias are skipped") {
  for (Device dev : test_devices()) {
    Rng rng(5);
    const Input x = rand_input(rng, {3, 5}, DType::F32, dev, -1, 1);
    const Input w = rand_input(rng, {5}, DType::F32, dev, 0.5, 1.5);
    const Input b = rand_input(rng, {5}, DType::F32, dev, -1, 1);
    const Tensor out = Tensor::empty({3, 5}, DType::F32, dev), mean = Tensor::empty({3}, DType::F32, dev),
                 rstd = Tensor::empty({3}, DType::F32, dev);
    layernorm_forward(x.t, w.t, b.t, out, mean, rstd);
    const Input dout = rand_input(rng, {3, 5}, DType::F32, dev, -1, 1);
    Out dx = make_out({3, 5}, DType::F32, dev);
    layernorm_backward(dout.t, x.t, w.t, mean, rstd, dx.t, Tensor(), Tensor());
    std::vector<double> gx, gw, gb;
    ref_ln_backward(dout.v, x.v, w.v, 3, 5, 1e-5, gx, gw, gb);
    check_out(case_name(dev, DType::F32, "layernorm_backward dx only"), dx, gx, tol(DType::F32, Kind::Reduction));
  }
}

TEST_CASE("layernorm: invalid arguments throw naming the op") {
  const Tensor x = Tensor::zeros({4, 6}, DType::F32), w = Tensor::zeros({6}, DType::F32);
  const Tensor out = Tensor::zeros({4, 6}, DType::F32), st = Tensor::zeros({4}, DType::F32);
  check_throws_naming("layernorm_forward", [&] { layernorm_forward(x, Tensor::zeros({5}, DType::F32), w, out, st, st); },
                      "weight shape");
  check_throws_naming("layernorm_forward", [&] { layernorm_forward(x, w, w, Tensor::zeros({4, 6}, DType::BF16), st, st); },
                      "out dtype");
  check_throws_naming("layernorm_forward", [&] { layernorm_forward(x, w, w, out, Tensor::zeros({4}, DType::BF16), st); },
                      "mean dtype");
  check_throws_naming("layernorm_forward", [&] { layernorm_forward(x, w, w, out, st, Tensor::zeros({3}, DType::F32)); },
                      "rstd shape");
  check_throws_naming("layernorm_forward", [&] {
    layernorm_forward(Tensor::zeros({4, 6}, DType::I32), w, w, out, st, st);
  }, "int x");
  check_throws_naming("layernorm_backward", [&] {
    layernorm_backward(Tensor::zeros({4, 5}, DType::F32), x, w, st, st, out, w, w);
  }, "dout shape");
  check_throws_naming("layernorm_backward", [&] {
    layernorm_backward(out, x, w, st, st, out, Tensor::zeros({6}, DType::F16), w);
  }, "dweight dtype");
}
