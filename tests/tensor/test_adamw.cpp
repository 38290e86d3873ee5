// tests/tensor/test_adamw.cpp — fused AdamW vs a float64 re-implementation of
// torch.optim.AdamW (PyTorch 2.x, non-foreach, amsgrad=False):
//   param.mul_(1 - lr*wd); m.lerp_(g, 1-beta1); v.mul_(beta2).addcmul_(g, g, 1-beta2)
//   denom = (v.sqrt() / sqrt(1 - beta2^t)).add_(eps); param.addcdiv_(m, denom, -lr/(1 - beta1^t))
// over several steps, with every grad dtype and param_copy in bf16/f16/f32/none.
// param_copy must be exactly the round-to-nearest-even of the kernel's own f32
// param (checked bitwise with the independent encoder of op_harness.h).
#include "tests/tensor/op_harness.h"

using namespace mpitron;
using namespace mpitron::test;

namespace {

struct Ref {
  std::vector<double> p, m, v;
};

void ref_step(Ref& r, const std::vector<double>& grad, const AdamWArgs& a) {
  const double bc1 = 1 - std::pow(double(a.beta1), double(a.step));
  const double bc2 = 1 - std::pow(double(a.beta2), double(a.step));
  for (size_t i = 0; i < r.p.size(); ++i) {
    const double g = grad[i] * a.grad_scale;
    r.p[i] *= 1 - double(a.lr) * a.weight_decay;
    r.m[i] += (g - r.m[i]) * (1 - double(a.beta1));  // lerp
    r.v[i] = r.v[i] * a.beta2 + (1 - double(a.beta2)) * g * g;
    const double denom = std::sqrt(r.v[i]) / std::sqrt(bc2) + a.eps;
    r.p[i] -= double(a.lr) / bc1 * r.m[i] / denom;
  }
}

void run(Device dev, DType grad_dt, DType copy_dt, bool with_copy, int64_t n, uint64_t seed) {
  Rng rng(seed);
  const Input p0 = rand_input(rng, {n}, DType::F32, dev, -1, 1);
  const Tensor param = p0.t.clone(), m = Tensor::zeros({n}, DType::F32, dev), v = Tensor::zeros({n}, DType::F32, dev);
  Ref r{p0.v, std::vector<double>(n, 0.0), std::vector<double>(n, 0.0)};
  AdamWArgs a;
  a.lr = 1e-2f;
  a.beta1 = 0.9f;
  a.beta2 = 0.95f;
  a.eps = 1e-8f;
  a.weight_decay = 0.1f;
  a.grad_scale = 0.5f;
  for (int64_t step = 1; step <= 6; ++step) {
    a.step = step;
    // Gradients of varied magnitude (a few tiny ones test eps), a fresh draw each step.
    std::vector<double> gv(static_cast<size_t>(n));
    for (auto& g : gv) g = round_to(grad_dt, rng.uniform(-1, 1) * std::pow(10.0, rng.uniform(-4, 0)));
    const Tensor grad = make_tensor(gv, {n}, grad_dt, dev);
    Out copy = make_out({n}, copy_dt, dev);
    adamw_step(param, grad, m, v, with_copy ? copy.t : Tensor(), a);
    ref_step(r, gv, a);
    const std::string name = str(dev.name(), " adamw n=", n, " grad=", dtype_name(grad_dt),
                                 with_copy ? str(" copy=", dtype_name(copy_dt)) : std::string(" no copy"), " step=", step);
    // f32 state: a few ulps per step; the update is lr·O(1), param O(1).
    check_close(name + " param", param, r.p, {1e-5, 1e-6, 0});
    // m mixes terms of both signs (beta1·m + (1-beta1)·g), so its f32 error scales with the
    // largest terms, not with |m|: ntol 1e-6 of max|m| (~100 f32 ulps of the largest term).
    check_close(name + " m", m, r.m, {1e-5, 1e-9, 1e-6});
    check_close(name + " v", v, r.v, {1e-5, 1e-12, 0});
    if (!with_copy) {
      CHECK_MESSAGE(copy.unwritten() == n, name << ": an undefined param_copy was written?");
      continue;
    }
    CHECK_MESSAGE(copy.guards_ok(), name << ": param_copy written outside its bounds");
    const std::vector<float> pf = param.to_floats();
    const Tensor ch = copy.t.to(Device::cpu());
    int64_t bad = 0;
    for (int64_t i = 0; i < n; ++i) {
      uint32_t got, want;
      if (copy_dt == DType::F32) got = f32_bits(ch.data<float>()[i]), want = f32_bits(pf[i]);
      else if (copy_dt == DType::BF16) got = ch.data<bf16_t>()[i].bits, want = ref_bf16_bits(pf[i]);
      else got = ch.data<f16_t>()[i].bits, want = ref_f16_bits(pf[i]);
      bad += got != want;
    }
    CHECK_MESSAGE(bad == 0, name << ": " << bad << " param_copy elements are not RNE(param)");
  }
}

}  // namespace

TEST_CASE("adamw_step vs float64 PyTorch AdamW over 6 steps") {
  uint64_t seed = 9000;
  for (Device dev : test_devices())
    for (DType gdt : float_dtypes())
      for (int64_t n : {1, 7, 1031, 100003}) {
        run(dev, gdt, DType::BF16, true, n, ++seed);
        run(dev, gdt, DType::F16, n != 1, n, ++seed);
      }
  for (Device dev : test_devices()) run(dev, DType::F32, DType::F32, true, 257, ++seed);
}

TEST_CASE("adamw_step: invalid arguments throw naming the op") {
  const Tensor p = Tensor::zeros({8}, DType::F32), g = Tensor::zeros({8}, DType::BF16);
  AdamWArgs a;
  check_throws_naming("adamw_step", [&] { adamw_step(Tensor::zeros({8}, DType::BF16), g, p, p, Tensor(), a); }, "bf16 param");
  check_throws_naming("adamw_step", [&] { adamw_step(p, Tensor::zeros({7}, DType::F32), p, p, Tensor(), a); }, "grad size");
  check_throws_naming("adamw_step", [&] { adamw_step(p, g, Tensor::zeros({8}, DType::BF16), p, Tensor(), a); }, "m dtype");
  check_throws_naming("adamw_step", [&] { adamw_step(p, g, p, p, Tensor::zeros({9}, DType::BF16), a); }, "copy size");
  a.step = 0;
  check_throws_naming("adamw_step", [&] { adamw_step(p, g, p, Tensor::zeros({8}, DType::F32), Tensor(), a); }, "step 0");
}
