// tests/tensor/test_dropout.cpp — Philox dropout forward/backward.
//
// Reference: the documented mask keep[i] = philox_uniform(seed, offset, i) >= p
// (Philox itself is checked against the Random123 known-answer vectors in
// tests/core/test_core.cpp), out = keep ? x/(1−p) : 0 in float64. Checked:
// the exact mask, the values, backward regenerating the same mask, p = 0 is
// the identity, aliasing, the stream layout (offset + 1 shifts the mask by 4
// elements), the keep rate within a 6-sigma binomial bound, and identical
// masks on CPU and CUDA.
#include "core/philox.h"
#include "tests/tensor/op_harness.h"

using namespace mpitron;
using namespace mpitron::test;

namespace {

std::vector<bool> ref_mask(int64_t n, float p, uint64_t seed, uint64_t offset) {
  std::vector<bool> keep(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) keep[i] = philox_uniform(seed, offset, static_cast<uint64_t>(i)) >= p;
  return keep;
}

// Inputs bounded away from 0 so "dropped" (exactly 0) is unambiguous.
Input nonzero_input(Rng& rng, const Shape& shape, DType dt, Device dev) {
  std::vector<double> v(static_cast<size_t>(shape_numel(shape)));
  for (auto& x : v) x = round_to(dt, (rng.uniform(0, 1) < 0.5 ? -1 : 1) * rng.uniform(0.5, 2));
  return {make_tensor(v, shape, dt, dev), v};
}

std::vector<bool> zeros_of(const Tensor& t) {
  std::vector<bool> z;
  for (float f : t.to_floats()) z.push_back(f == 0.0f);
  return z;
}

int64_t mask_mismatches(const std::vector<bool>& keep, const std::vector<bool>& zero) {
  int64_t bad = 0;
  for (size_t i = 0; i < keep.size(); ++i) bad += keep[i] == zero[i];
  return bad;
}

void run(Device dev, DType dt, int64_t n, float p, uint64_t seed, uint64_t offset, uint64_t rseed) {
  Rng rng(rseed);
  const Shape shape = n % 5 == 0 ? Shape{5, n / 5} : Shape{n};
  const Input x = nonzero_input(rng, shape, dt, dev);
  const Input dout = nonzero_input(rng, shape, dt, dev);
  const std::vector<bool> keep = ref_mask(n, p, seed, offset);
  std::vector<double> ref(x.v.size()), gref(x.v.size());
  for (size_t i = 0; i < ref.size(); ++i) {
    ref[i] = keep[i] ? x.v[i] / (1.0 - p) : 0.0;
    gref[i] = keep[i] ? dout.v[i] / (1.0 - p) : 0.0;
  }
  const std::string name = case_name(dev, dt, str("dropout n=", n, " p=", p, " seed=", seed, " offset=", offset));
  Out out = make_out(shape, dt, dev), dx = make_out(shape, dt, dev);
  dropout_forward(x.t, out.t, p, seed, offset);
  dropout_backward(dout.t, dx.t, p, seed, offset);
  CHECK_MESSAGE(mask_mismatches(keep, zeros_of(out.t)) == 0, name << ": forward mask differs from philox_uniform >= p");
  CHECK_MESSAGE(mask_mismatches(keep, zeros_of(dx.t)) == 0, name << ": backward regenerated a different mask");
  check_out(name + " forward", out, ref, tol(dt, Kind::Pointwise));
  check_out(name + " backward", dx, gref, tol(dt, Kind::Pointwise));
}

}  // namespace

TEST_CASE("dropout: exact Philox mask, values, backward regenerates the mask") {
  uint64_t rseed = 7000;
  for (Device dev : test_devices())
    for (DType dt : float_dtypes())
      for (int64_t n : {1, 7, 13, 127, 1000, 65537}) {
        run(dev, dt, n, 0.1f, 1234, 0, ++rseed);
        run(dev, dt, n, 0.5f, 99, 12345678901ull, ++rseed);
        run(dev, dt, n, 0.9f, 0xdeadbeefcafeull, 7, ++rseed);
      }
}

TEST_CASE("dropout: p = 0 is the identity") {
  for (Device dev : test_devices())
    for (DType dt : float_dtypes()) {
      Rng rng(7100);
      const Input x = rand_input(rng, {3, 37}, dt, dev, -2, 2);
      Out out = make_out({3, 37}, dt, dev), dx = make_out({3, 37}, dt, dev);
      dropout_forward(x.t, out.t, 0.0f, 5, 6);
      dropout_backward(x.t, dx.t, 0.0f, 5, 6);
      check_out(case_name(dev, dt, "dropout p=0 forward"), out, x.v, {0, 0, 0});
      check_out(case_name(dev, dt, "dropout p=0 backward"), dx, x.v, {0, 0, 0});
    }
}

TEST_CASE("dropout: out may alias x, dx may alias dout") {
  for (Device dev : test_devices()) {
    Rng rng(7200);
    const Input x = nonzero_input(rng, {1001}, DType::F32, dev);
    const Tensor y = x.t.clone();
    dropout_forward(y, y, 0.3f, 42, 3);
    const std::vector<bool> keep = ref_mask(1001, 0.3f, 42, 3);
    std::vector<double> ref(1001);
    for (size_t i = 0; i < ref.size(); ++i) ref[i] = keep[i] ? x.v[i] / 0.7 : 0.0;
    check_close(case_name(dev, DType::F32, "dropout in place forward"), y, ref, tol(DType::F32, Kind::Pointwise));
    const Tensor g = x.t.clone();
    dropout_backward(g, g, 0.3f, 42, 3);
    check_close(case_name(dev, DType::F32, "dropout in place backward"), g, ref, tol(DType::F32, Kind::Pointwise));
  }
}

TEST_CASE("dropout: the stream layout (offset counts blocks of 4 elements) and seeds differ") {
  for (Device dev : test_devices()) {
    const int64_t n = 4096;
    const Tensor ones = Tensor::from_vector(std::vector<float>(n, 1.0f), {n}).to(dev);
    const Tensor a = Tensor::empty({n}, DType::F32, dev), b = Tensor::empty({n}, DType::F32, dev),
                 c = Tensor::empty({n}, DType::F32, dev);
    dropout_forward(ones, a, 0.5f, 77, 10);
    dropout_forward(ones, b, 0.5f, 77, 11);
    dropout_forward(ones, c, 0.5f, 78, 10);
    const std::vector<bool> za = zeros_of(a), zb = zeros_of(b), zc = zeros_of(c);
    int64_t shifted_bad = 0, same_seed_diff = 0;
    for (int64_t i = 0; i + 4 < n; ++i) shifted_bad += za[i + 4] != zb[i];
    for (int64_t i = 0; i < n; ++i) same_seed_diff += za[i] != zc[i];
    CHECK_MESSAGE(shifted_bad == 0, dev.name() << ": mask(offset+1)[i] != mask(offset)[i+4]");
    // Independent masks at p = 0.5 differ in ~n/2 places; 6 sigma = 6·sqrt(n)/2.
    CHECK(std::abs(same_seed_diff - n / 2) <= 6 * 32);
  }
}

TEST_CASE("dropout: keep rate is 1 - p within a 6-sigma binomial bound") {
  // With n independent Bernoulli(1-p) draws, |kept - n(1-p)| <= 6·sqrt(n·p·(1-p))
  // fails with probability < 2e-9 per draw (Chernoff-Hoeffding); the masks are
  // deterministic, so this either always passes or flags a biased generator.
  const int64_t n = 1 << 20;
  for (Device dev : test_devices())
    for (float p : {0.01f, 0.1f, 0.5f, 0.9f})
      for (uint64_t seed : {1ull, 2ull, 0x123456789abcdefull}) {
        const Tensor ones = Tensor::from_vector(std::vector<float>(n, 1.0f), {n}).to(dev);
        const Tensor out = Tensor::empty({n}, DType::F32, dev);
        dropout_forward(ones, out, p, seed, 0);
        int64_t kept = 0;
        for (float f : out.to_floats()) kept += f != 0.0f;
        const double expect = n * (1.0 - p), sd = std::sqrt(n * p * (1.0 - p));
        CHECK_MESSAGE(std::fabs(kept - expect) <= 6 * sd,
                      dev.name() << " p=" << p << " seed=" << seed << ": kept " << kept << ", expected " << expect
                                 << " +- " << 6 * sd);
      }
}

TEST_CASE("dropout: CPU and CUDA give identical masks") {
  if (!cuda_available()) return;  // the file's SKIPPED line says why
  const int64_t n = 300007;
  Rng rng(7300);
  const Input x = nonzero_input(rng, {n}, DType::F32, Device::cpu());
  const Tensor cpu = Tensor::empty({n}, DType::F32), gpu = Tensor::empty({n}, DType::F32, Device::cuda(0));
  dropout_forward(x.t, cpu, 0.37f, 2024, 99);
  dropout_forward(x.t.to(Device::cuda(0)), gpu, 0.37f, 2024, 99);
  CHECK(zeros_of(cpu) == zeros_of(gpu));
  CHECK(values(cpu) == values(gpu));
}

TEST_CASE("dropout: invalid arguments throw naming the op") {
  const Tensor x = Tensor::zeros({4, 6}, DType::F32);
  check_throws_naming("dropout_forward", [&] { dropout_forward(x, x, 1.0f, 0, 0); }, "p = 1");
  check_throws_naming("dropout_forward", [&] { dropout_forward(x, x, -0.1f, 0, 0); }, "p < 0");
  check_throws_naming("dropout_forward", [&] { dropout_forward(x, Tensor::zeros({4, 6}, DType::BF16), 0.1f, 0, 0); }, "dtype");
  check_throws_naming("dropout_backward", [&] { dropout_backward(x, Tensor::zeros({4, 5}, DType::F32), 0.1f, 0, 0); }, "shape");
}
