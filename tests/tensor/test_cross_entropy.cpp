// tests/tensor/test_cross_entropy.cpp — fused softmax cross-entropy.
//
// Reference: float64 losses_n = logsumexp(logits_n) − logits_n[target_n] (0 for
// target < 0), written here. dlogits: float64 central differences of
// L = dloss_scale · Σ_n losses_n on small shapes, the closed form
// dloss_scale · (softmax − onehot) on the large one. Also: dlogits aliasing
// logits (in place), ignored targets, loss-only mode leaving logits untouched.
#include "tests/tensor/op_harness.h"

using namespace mpitron;
using namespace mpitron::test;

namespace {

std::vector<double> ref_losses(const std::vector<double>& logits, const std::vector<int64_t>& tg, int64_t n, int64_t v) {
  std::vector<double> l(static_cast<size_t>(n), 0.0);
  for (int64_t i = 0; i < n; ++i) {
    if (tg[i] < 0) continue;
    const double* r = &logits[static_cast<size_t>(i * v)];
    double mx = -INFINITY, s = 0;
    for (int64_t j = 0; j < v; ++j) mx = std::max(mx, r[j]);
    for (int64_t j = 0; j < v; ++j) s += std::exp(r[j] - mx);
    l[i] = mx + std::log(s) - r[tg[i]];
  }
  return l;
}

std::vector<double> ref_dlogits(const std::vector<double>& logits, const std::vector<int64_t>& tg, int64_t n, int64_t v,
                                double scale) {
  std::vector<double> g(logits.size(), 0.0);
  for (int64_t i = 0; i < n; ++i) {
    if (tg[i] < 0) continue;
    const double* r = &logits[static_cast<size_t>(i * v)];
    double mx = -INFINITY, s = 0;
    for (int64_t j = 0; j < v; ++j) mx = std::max(mx, r[j]);
    for (int64_t j = 0; j < v; ++j) s += std::exp(r[j] - mx);
    for (int64_t j = 0; j < v; ++j) g[i * v + j] = scale * (std::exp(r[j] - mx) / s - (j == tg[i] ? 1.0 : 0.0));
  }
  return g;
}

enum class Mode { Separate, InPlace, LossOnly };

void run(Device dev, DType dt, DType tg_dt, int64_t n, int64_t v, Mode mode, uint64_t seed) {
  Rng rng(seed);
  const Input logits = rand_input(rng, {n, v}, dt, dev, -4, 4);
  std::vector<int64_t> tg(static_cast<size_t>(n));
  int64_t valid = 0;
  for (auto& t : tg) {
    t = rng.randint(0, v - 1);
    if (n > 2 && rng.uniform(0, 1) < 0.25) t = rng.uniform(0, 1) < 0.5 ? -1 : -100;  // ignored positions
    valid += t >= 0;
  }
  const float scale = 1.0f / static_cast<float>(std::max<int64_t>(valid, 1));
  const Tensor targets = make_ints(tg, {n}, tg_dt, dev);
  Out losses = make_out({n}, DType::F32, dev);
  const std::string name = case_name(dev, dt, str("softmax_cross_entropy N=", n, " V=", v, " targets=", dtype_name(tg_dt),
                                                  mode == Mode::InPlace ? " in-place" : mode == Mode::LossOnly ? " loss-only" : ""));
  const std::vector<double> lref = ref_losses(logits.v, tg, n, v);
  std::vector<double> gref;
  if (mode != Mode::LossOnly) {
    if (n * v <= 1200) {
      std::vector<double> w(static_cast<size_t>(n), scale);
      gref = fd_grad(logits.v, [&](const std::vector<double>& x) { return ref_losses(x, tg, n, v); }, w);
    } else {
      gref = ref_dlogits(logits.v, tg, n, v, scale);
    }
  }
  // The 8-wide row kernel needs V % 8 == 0 and aligned logits and dlogits: the
  // placement matters only for a separate dlogits output (in place it is a fresh clone).
  const PathProbe path;
  const std::string want = mode == Mode::Separate ? vec_path("softmax_cross_entropy", v % 8 == 0)
                                                  : str("softmax_cross_entropy", v % 8 == 0 ? ".vec8" : ".scalar");
  switch (mode) {
    case Mode::Separate: {
      Out dl = make_out({n, v}, dt, dev);
      softmax_cross_entropy(logits.t, targets, losses.t, dl.t, scale);
      check_out(name + " dlogits", dl, gref, tol(dt, Kind::Reduction));
      check_close(name + " logits unchanged", logits.t, logits.v, {0, 0, 0});
      break;
    }
    case Mode::InPlace: {
      const Tensor lg = logits.t.clone();
      softmax_cross_entropy(lg, targets, losses.t, lg, scale);
      check_close(name + " dlogits", lg, gref, tol(dt, Kind::Reduction));
      break;
    }
    case Mode::LossOnly:
      softmax_cross_entropy(logits.t, targets, losses.t, Tensor(), scale);
      check_close(name + " logits unchanged", logits.t, logits.v, {0, 0, 0});
      break;
  }
  check_path(dev, path, want, name);
  // Loss of a row of V logits is ~log V; f32 math on rounded inputs.
  check_out(name + " losses", losses, lref, tol(DType::F32, Kind::Reduction));
}

}  // namespace

TEST_CASE("softmax_cross_entropy: losses and dlogits, every dtype") {
  uint64_t seed = 6000;
  for (Device dev : test_devices())
    for (DType dt : float_dtypes())
      for (Mode mode : {Mode::Separate, Mode::InPlace, Mode::LossOnly}) {
        run(dev, dt, DType::I32, 1, 1, mode, ++seed);
        run(dev, dt, DType::I64, 7, 13, mode, ++seed);
        run(dev, dt, DType::I32, 13, 37, mode, ++seed);
        run(dev, dt, DType::I64, 3, 127, mode, ++seed);
        run(dev, dt, DType::I32, 16, 50257, mode, ++seed);
        run(dev, dt, DType::I64, 5, 1024, mode, ++seed);  // 8-wide rows
      }
}

TEST_CASE("softmax_cross_entropy on the CPU over a 50,257-word vocabulary: losses within float rounding of float64") {
  // A running float sum of 50k exponentials drifts by ~1e-4 relative; the row sums
  // must be accurate to float rounding so evaluate's perplexities are exact.
  const int64_t n = 16, v = 50257;
  Rng rng(6200);
  for (double spread : {1.0, 4.0, 12.0}) {
    const Input logits = rand_input(rng, {n, v}, DType::F32, Device::cpu(), -spread, spread);
    std::vector<int64_t> tg(static_cast<size_t>(n));
    for (auto& t : tg) t = rng.randint(0, v - 1);
    const Tensor targets = make_ints(tg, {n}, DType::I64, Device::cpu());
    const Tensor losses = Tensor::zeros({n}, DType::F32);
    softmax_cross_entropy(logits.t, targets, losses, Tensor(), 1.0f);
    const std::vector<double> want = ref_losses(logits.v, tg, n, v);
    const std::vector<float> got = losses.to_floats();
    double worst = 0;
    for (int64_t i = 0; i < n; ++i) worst = std::max(worst, std::fabs(got[i] - want[i]));
    CAPTURE(spread);
    CHECK(worst < 4e-6);  // a few ulp of losses ~11–25 nats
  }
}

TEST_CASE("softmax_cross_entropy: all targets ignored gives zero loss and zero gradient") {
  for (Device dev : test_devices()) {
    Rng rng(6100);
    const Input logits = rand_input(rng, {5, 11}, DType::F32, dev, -3, 3);
    const Tensor targets = make_ints({-1, -1, -100, -1, -7}, {5}, DType::I64, dev);
    Out losses = make_out({5}, DType::F32, dev), dl = make_out({5, 11}, DType::F32, dev);
    softmax_cross_entropy(logits.t, targets, losses.t, dl.t, 0.5f);
    check_out(case_name(dev, DType::F32, "all ignored losses"), losses, std::vector<double>(5, 0.0), {0, 0, 0});
    check_out(case_name(dev, DType::F32, "all ignored dlogits"), dl, std::vector<double>(55, 0.0), {0, 0, 0});
  }
}

TEST_CASE("softmax_cross_entropy: invalid arguments throw naming the op") {
  const Tensor logits = Tensor::zeros({4, 6}, DType::F32), tg = Tensor::from_ints({0, 1, 2, 3}, {4});
  const Tensor losses = Tensor::zeros({4}, DType::F32);
  const char* op = "softmax_cross_entropy";
  check_throws_naming(op, [&] { softmax_cross_entropy(logits, Tensor::from_ints({0, 1, 2}, {3}), losses, Tensor(), 1); }, "targets shape");
  check_throws_naming(op, [&] { softmax_cross_entropy(logits, Tensor::zeros({4}, DType::F32), losses, Tensor(), 1); }, "float targets");
  check_throws_naming(op, [&] { softmax_cross_entropy(logits, tg, Tensor::zeros({4}, DType::BF16), Tensor(), 1); }, "losses dtype");
  check_throws_naming(op, [&] { softmax_cross_entropy(logits, tg, losses, Tensor::zeros({4, 6}, DType::F16), 1); }, "dlogits dtype");
  check_throws_naming(op, [&] { softmax_cross_entropy(Tensor::zeros({2, 2, 6}, DType::F32), tg, losses, Tensor(), 1); }, "3-D logits");
}
