// tests/tensor/test_rope_scaling.cpp — RoPE frequency scaling (rope.h's RopeScaling: linear,
// dynamic NTK, llama3, yarn), the inverse frequencies and the rotation on every device.
//
// References:
//   - tests/tensor/ref/rope_scaling_ref.json, written by tests/reference/rope_scaling_ref.py, which
//     runs transformers' own ROPE_INIT_FUNCTIONS (4.55.4) in float64: the inv_freq and
//     attention_factor of 13 configs (Llama 3.1/3.2, Qwen2.5 and DeepSeek-V3 yarn, gpt-oss's
//     untruncated yarn, dynamic NTK above and below the original context, partial rotary).
//     rope_inv_freq / rope_cos_sin_scale (the functions both kernels call) must equal them;
//   - a float64 rotate_half RoPE written here from those inv_freq values, with cos and sin
//     multiplied by the attention factor on the rotated dims only; backward against float64
//     central differences of that forward (RoPE is linear: they are exact up to roundoff) on
//     small shapes and against the transpose map on larger ones.
#include <fstream>

#include <nlohmann/json.hpp>

#include "tests/tensor/op_harness.h"

using namespace mpitron;
using namespace mpitron::test;

namespace {

struct RefCase {
  std::string name;
  RopeArgs args;
  int64_t head_dim = 0;
  std::vector<double> inv_freq;
  double attention_factor = 1;
};

RopeScalingType type_of(const std::string& t) {
  if (t == "linear") return RopeScalingType::Linear;
  if (t == "dynamic") return RopeScalingType::Dynamic;
  if (t == "llama3") return RopeScalingType::Llama3;
  if (t == "yarn") return RopeScalingType::Yarn;
  return RopeScalingType::None;
}

const std::vector<RefCase>& ref_cases() {
  static const std::vector<RefCase> cases = [] {
    std::ifstream f(std::string(MPITRON_SOURCE_DIR) + "/tests/tensor/ref/rope_scaling_ref.json");
    REQUIRE_MESSAGE(f.good(), "tests/tensor/ref/rope_scaling_ref.json is missing: run tests/reference/rope_scaling_ref.py");
    const nlohmann::json j = nlohmann::json::parse(f);
    std::vector<RefCase> v;
    for (const auto& c : j.at("cases")) {
      RefCase r;
      r.name = c.at("name");
      r.head_dim = c.at("head_dim");
      r.args.base = c.at("base");
      r.args.percent = c.at("percent");
      RopeScaling& s = r.args.scaling;
      s.type = type_of(c.at("rope_type"));
      s.factor = c.at("factor");
      s.original_max_position_embeddings = c.at("original_max_position_embeddings");
      if (s.type == RopeScalingType::Llama3) {
        s.low_freq_factor = c.at("low_freq_factor");
        s.high_freq_factor = c.at("high_freq_factor");
      }
      s.beta_fast = c.at("beta_fast");
      s.beta_slow = c.at("beta_slow");
      s.truncate = c.at("truncate");
      s.attention_factor = c.at("attention_factor_given");  // 0: derived, as transformers does
      s.mscale = c.at("mscale");
      s.mscale_all_dim = c.at("mscale_all_dim");
      s.dynamic_seq_len = c.at("seq_len");
      r.inv_freq = c.at("inv_freq").get<std::vector<double>>();
      r.attention_factor = c.at("attention_factor");
      v.push_back(r);
    }
    return v;
  }();
  return cases;
}

struct Dims {
  int64_t b, t, h, d;
};

// out = a·RoPE(x) with θ_i = theta[i] on heads [0, rotate_heads), dims [0, R); sign −1: the transpose.
std::vector<double> ref_rope(const Dims& d, const std::vector<double>& x, int64_t rotate_heads, int64_t R,
                             const std::vector<double>& theta, double a, int64_t offset, double sign = 1.0) {
  const int64_t half = R / 2;
  std::vector<double> out = x;
  for (int64_t b = 0; b < d.b; ++b)
    for (int64_t t = 0; t < d.t; ++t)
      for (int64_t h = 0; h < rotate_heads; ++h) {
        const size_t row = static_cast<size_t>(((b * d.t + t) * d.h + h) * d.d);
        for (int64_t i = 0; i < half; ++i) {
          const double ang = static_cast<double>(t + offset) * theta[static_cast<size_t>(i)];
          const double c = a * std::cos(ang), s = sign * a * std::sin(ang);
          const double x1 = x[row + i], x2 = x[row + i + half];
          out[row + i] = x1 * c - x2 * s;
          out[row + i + half] = x2 * c + x1 * s;
        }
      }
  return out;
}

void run(Device dev, DType dt, const RefCase& rc, const Dims& d, int64_t rotate_heads, int64_t offset, bool in_place,
         uint64_t seed) {
  Rng rng(seed);
  RopeArgs a = rc.args;
  a.position_offset = offset;
  const int64_t R = rope_rotary_dim(d.d, a.percent);
  REQUIRE(static_cast<int64_t>(rc.inv_freq.size()) == R / 2);
  const Shape shape{d.b, d.t, d.h, d.d};
  const Input x = rand_input(rng, shape, dt, dev, -2, 2);
  const std::string name = case_name(dev, dt, str("rope scaling ", rc.name, " B=", d.b, " T=", d.t, " H=", d.h,
                                                  " D=", d.d, " rotate_heads=", rotate_heads, " offset=", offset,
                                                  in_place ? " in place" : ""));
  const double af = rc.attention_factor;
  const std::vector<double> ref = ref_rope(d, x.v, rotate_heads, R, rc.inv_freq, af, offset);
  // a·cos and a·sin are rounded to f32 once more than the rotation (a ≈ 1.1–1.5): one f32 ulp.
  Tol t = tol(dt, Kind::Pointwise);
  if (dt == DType::F32) t.rtol = 2e-5, t.atol = 2e-6;
  if (in_place) {
    const Tensor y = x.t.clone();
    rope_forward(y, y, rotate_heads, a);
    check_close(name + " out", y, ref, t);
  } else {
    Out out = make_out(shape, dt, dev);
    rope_forward(x.t, out.t, rotate_heads, a);
    check_out(name + " out", out, ref, t);
  }
  const Input dout = rand_input(rng, shape, dt, dev, -1, 1);
  const std::vector<double> g =
      x.v.size() <= 1200
          ? fd_grad(x.v,
                    [&](const std::vector<double>& v) { return ref_rope(d, v, rotate_heads, R, rc.inv_freq, af, offset); },
                    dout.v)
          : ref_rope(d, dout.v, rotate_heads, R, rc.inv_freq, af, offset, -1.0);
  t.atol = std::max(t.atol, 1e-8);  // finite-difference noise
  if (in_place) {
    const Tensor dy = dout.t.clone();
    rope_backward(dy, dy, rotate_heads, a);
    check_close(name + " dx", dy, g, t);
  } else {
    Out dx = make_out(shape, dt, dev);
    rope_backward(dout.t, dx.t, rotate_heads, a);
    check_out(name + " dx", dx, g, t);
  }
}

}  // namespace

TEST_CASE("rope scaling: rope_inv_freq and rope_cos_sin_scale equal transformers' ROPE_INIT_FUNCTIONS") {
  REQUIRE(ref_cases().size() >= 13);
  for (const RefCase& rc : ref_cases()) {
    const int64_t R = rope_rotary_dim(rc.head_dim, rc.args.percent);
    REQUIRE(static_cast<int64_t>(rc.inv_freq.size()) == R / 2);
    double worst = 0;
    for (int64_t i = 0; i < R / 2; ++i) {
      const double want = rc.inv_freq[static_cast<size_t>(i)], got = rope_inv_freq(i, R, rc.args);
      worst = std::max(worst, std::fabs(got - want) / want);
    }
    // transformers evaluates 1/(base ** (2i/R)), we base^(−2i/R): a few double ulps.
    CHECK_MESSAGE(worst <= 1e-13, rc.name << ": inv_freq differs from transformers by " << worst << " relative");
    CHECK_MESSAGE(std::fabs(rope_cos_sin_scale(rc.args) - rc.attention_factor) <= 1e-15 * rc.attention_factor,
                  rc.name << ": attention factor " << rope_cos_sin_scale(rc.args) << " vs transformers' "
                          << rc.attention_factor);
    MESSAGE(rc.name << ": max relative inv_freq error vs transformers " << worst);
  }
  // The cases are not vacuous: every type differs from unscaled RoPE somewhere (but dynamic at L <= M).
  for (const RefCase& rc : ref_cases()) {
    RopeArgs plain = rc.args;
    plain.scaling = {};
    const int64_t R = rope_rotary_dim(rc.head_dim, rc.args.percent);
    bool differs = false;
    for (int64_t i = 0; i < R / 2; ++i) differs |= rope_inv_freq(i, R, rc.args) != rope_inv_freq(i, R, plain);
    const bool unscaled = rc.args.scaling.type == RopeScalingType::Dynamic &&
                          rc.args.scaling.dynamic_seq_len <= rc.args.scaling.original_max_position_embeddings;
    CHECK_MESSAGE(differs != unscaled, rc.name << ": scaled " << differs);
  }
}

TEST_CASE("rope scaling: yarn's derived attention factor (transformers' get_mscale)") {
  CHECK(rope_yarn_attention_factor(1.0) == 1.0);
  CHECK(rope_yarn_attention_factor(0.5) == 1.0);
  CHECK(std::fabs(rope_yarn_attention_factor(4.0) - (0.1 * std::log(4.0) + 1.0)) < 1e-15);
  CHECK(rope_yarn_attention_factor(40.0, 1.0, 1.0) == 1.0);       // DeepSeek-V3: the ratio of equal mscales
  CHECK(rope_yarn_attention_factor(40.0, 0.707, 0.707) == 1.0);   // DeepSeek-V2
  CHECK(std::fabs(rope_yarn_attention_factor(10.0, 1.0, 0.5) - (0.1 * std::log(10.0) + 1) / (0.05 * std::log(10.0) + 1)) <
        1e-15);
  CHECK(rope_yarn_attention_factor(10.0, 1.0, 0.0) == rope_yarn_attention_factor(10.0));  // one of them absent
  RopeArgs a;
  a.scaling.type = RopeScalingType::Yarn;
  a.scaling.factor = 16;
  CHECK(rope_cos_sin_scale(a) == rope_yarn_attention_factor(16));
  a.scaling.attention_factor = 0.75;  // given: used as is
  CHECK(rope_cos_sin_scale(a) == 0.75);
  a.scaling.type = RopeScalingType::Llama3;  // only yarn scales cos and sin
  CHECK(rope_cos_sin_scale(a) == 1.0);
}

TEST_CASE("rope scaling: forward and backward vs float64 on transformers' frequencies; every dtype and device") {
  uint64_t seed = 9300;
  for (Device dev : test_devices())
    for (DType dt : float_dtypes())
      for (const RefCase& rc : ref_cases()) {
        const int64_t D = rc.head_dim;
        // A fused QKV (NH = 2, G = 1: Q and K heads rotate, V passes), at the start and past the original context.
        run(dev, dt, rc, {1, 3, 4, D}, 3, 0, false, ++seed);
        const bool in_place = (seed & 1) != 0;
        run(dev, dt, rc, {2, 4, 3, D}, 2, 70000, in_place, ++seed);
      }
}

TEST_CASE("rope scaling: defaults and an unscaled dynamic length leave RoPE bit-identical") {
  for (Device dev : test_devices())
    for (DType dt : float_dtypes()) {
      Rng rng(9400);
      const Input x = rand_input(rng, {2, 9, 5, 32}, dt, dev, -2, 2);
      RopeArgs plain;
      plain.base = 500000;
      plain.position_offset = 123;
      RopeArgs dyn = plain;
      dyn.scaling.type = RopeScalingType::Dynamic;
      dyn.scaling.factor = 4;
      dyn.scaling.original_max_position_embeddings = 4096;
      dyn.scaling.dynamic_seq_len = 4096;  // L <= M: transformers keeps the base
      RopeArgs lin1 = plain;                // linear with factor 1 divides by 1
      lin1.scaling.type = RopeScalingType::Linear;
      const Tensor a = Tensor::empty(x.t.shape(), dt, dev), b = Tensor::empty(x.t.shape(), dt, dev),
                   c = Tensor::empty(x.t.shape(), dt, dev);
      rope_forward(x.t, a, 3, plain);
      rope_forward(x.t, b, 3, dyn);
      rope_forward(x.t, c, 3, lin1);
      const std::vector<float> va = a.to_floats(), vb = b.to_floats(), vc = c.to_floats();
      CHECK_MESSAGE(std::memcmp(va.data(), vb.data(), va.size() * 4) == 0, case_name(dev, dt, "dynamic at L = M"));
      CHECK_MESSAGE(std::memcmp(va.data(), vc.data(), va.size() * 4) == 0, case_name(dev, dt, "linear x1"));
    }
}

TEST_CASE("rope scaling: invalid arguments throw naming the op") {
  const Tensor x = Tensor::zeros({1, 4, 3, 8}, DType::F32), out = Tensor::zeros({1, 4, 3, 8}, DType::F32);
  auto with = [](RopeScalingType t, auto set) {
    RopeArgs a;
    a.scaling.type = t;
    a.scaling.factor = 2;
    a.scaling.original_max_position_embeddings = 1024;
    set(a.scaling);
    return a;
  };
  auto fwd = [&](const RopeArgs& a) { rope_forward(x, out, 2, a); };
  auto none = [](RopeScaling&) {};
  fwd(with(RopeScalingType::Yarn, none));  // valid
  fwd(with(RopeScalingType::Llama3, none));
  fwd(with(RopeScalingType::Dynamic, none));
  check_throws_naming("rope_forward", [&] { fwd(with(static_cast<RopeScalingType>(7), none)); }, "unknown type");
  check_throws_naming("rope_forward", [&] { fwd(with(RopeScalingType::Linear, [](RopeScaling& s) { s.factor = 0.5; })); },
                      "factor < 1");
  check_throws_naming("rope_forward", [&] { fwd(with(RopeScalingType::Yarn, [](RopeScaling& s) { s.factor = NAN; })); },
                      "factor NaN");
  for (RopeScalingType t : {RopeScalingType::Dynamic, RopeScalingType::Llama3, RopeScalingType::Yarn})
    check_throws_naming("rope_forward", [&] {
      fwd(with(t, [](RopeScaling& s) { s.original_max_position_embeddings = 0; }));
    }, "original_max_position_embeddings 0");
  check_throws_naming("rope_forward", [&] {
    fwd(with(RopeScalingType::Llama3, [](RopeScaling& s) { s.high_freq_factor = s.low_freq_factor; }));
  }, "llama3 high == low");
  check_throws_naming("rope_forward", [&] {
    fwd(with(RopeScalingType::Llama3, [](RopeScaling& s) { s.low_freq_factor = 0; }));
  }, "llama3 low 0");
  check_throws_naming("rope_forward", [&] { fwd(with(RopeScalingType::Yarn, [](RopeScaling& s) { s.beta_fast = 0; })); },
                      "yarn beta_fast 0");
  check_throws_naming("rope_forward", [&] {
    fwd(with(RopeScalingType::Yarn, [](RopeScaling& s) { s.attention_factor = -1; }));
  }, "yarn attention_factor < 0");
  check_throws_naming("rope_forward", [&] {
    fwd(with(RopeScalingType::Yarn, [](RopeScaling& s) { s.mscale = 1, s.mscale_all_dim = -1e9; }));
  }, "yarn derived attention factor < 0");
  check_throws_naming("rope_backward", [&] {
    RopeArgs a = with(RopeScalingType::Yarn, none);
    a.base = 1;
    rope_backward(x, out, 2, a);
  }, "yarn base 1");
  check_throws_naming("rope_forward", [&] {
    fwd(with(RopeScalingType::Dynamic, [](RopeScaling& s) { s.dynamic_seq_len = -1; }));
  }, "dynamic L < 0");
}
