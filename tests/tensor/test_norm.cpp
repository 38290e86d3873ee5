// tests/tensor/test_norm.cpp — sum_squares (+=) and global_l2_norm.
//
// Reference: float64 sums written here. Tolerance: rtol 1e-5 up to 10^5
// elements, 5e-5 at 10^6 (the sum of n positive f32 terms rounded in f32 has
// a random-walk error ~sqrt(n)·2^-24 ≈ 6e-5 at worst for a serial loop; a
// blocked or pairwise sum does far better). Non-finite inputs must surface.
#include "tests/tensor/op_harness.h"

using namespace mpitron;
using namespace mpitron::test;

TEST_CASE("sum_squares accumulates into out, every dtype") {
  uint64_t seed = 9500;
  for (Device dev : test_devices())
    for (DType dt : float_dtypes())
      for (int64_t n : {1, 7, 13, 127, 1000, 100003, 1 << 20}) {
        Rng rng(++seed);
        const Input x = rand_input(rng, {n}, dt, dev, -2, 2);
        const std::vector<double> init{2.5};
        Out out = make_out({1}, DType::F32, dev, &init);
        sum_squares(x.t, out.t);
        double s = 2.5;
        for (double v : x.v) s += v * v;
        check_out(case_name(dev, dt, str("sum_squares n=", n)), out, {s}, {n > 100003 ? 5e-5 : 1e-5, 0, 0});
      }
}

TEST_CASE("sum_squares flags non-finite values") {
  for (Device dev : test_devices())
    for (DType dt : float_dtypes())
      for (double bad : {double(INFINITY), -double(INFINITY), double(NAN)}) {
        std::vector<double> v(1001, 0.5);
        v[777] = bad;
        const Tensor out = Tensor::zeros({1}, DType::F32, dev);
        sum_squares(make_tensor(v, {1001}, dt, dev), out);
        const float got = out.item();
        CHECK_MESSAGE(!std::isfinite(got), case_name(dev, dt, str("sum_squares with ", bad, " gave ", got)));
      }
}

TEST_CASE("global_l2_norm over tensors of mixed dtypes and sizes") {
  for (Device dev : test_devices()) {
    Rng rng(9600);
    std::vector<Tensor> ts;
    double s = 0;
    const std::vector<std::pair<Shape, DType>> specs = {{{1}, DType::F32}, {{7, 13}, DType::BF16}, {{127}, DType::F16},
                                                        {{300, 301}, DType::F32}, {{37, 3, 5}, DType::BF16}};
    for (auto& [shape, dt] : specs) {
      const Input x = rand_input(rng, shape, dt, dev, -1, 1);
      ts.push_back(x.t);
      for (double v : x.v) s += v * v;
    }
    const double got = global_l2_norm(ts);
    CHECK_MESSAGE(std::fabs(got - std::sqrt(s)) <= 1e-5 * std::sqrt(s), dev.name() << ": " << got << " vs " << std::sqrt(s));
    CHECK(global_l2_norm({}) == 0.0);
  }
}

TEST_CASE("sum_squares: invalid arguments throw naming the op") {
  const Tensor x = Tensor::zeros({8}, DType::F32);
  check_throws_naming("sum_squares", [&] { sum_squares(x, Tensor::zeros({2}, DType::F32)); }, "out size");
  check_throws_naming("sum_squares", [&] { sum_squares(x, Tensor::zeros({1}, DType::BF16)); }, "out dtype");
  check_throws_naming("sum_squares", [&] { sum_squares(Tensor::zeros({8}, DType::I32), Tensor::zeros({1}, DType::F32)); }, "int x");
}
