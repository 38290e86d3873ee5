// tests/tensor/test_rope.cpp — rotary position embeddings, forward/backward conformance.
//
// Reference: float64 rotate_half RoPE written here (pairs (i, i + R/2) of the first
// R = int(D·percent) dims, θ_i = base^(−2i/R), position t + offset), applied to heads
// [0, rotate_heads); other elements pass through. Backward: float64 central
// differences of that forward (RoPE is linear, so they are exact up to roundoff),
// and the transpose rotation on larger shapes. A PyTorch cross-check reads
// tests/tensor/ref/llama_ops_ref.json, written by tests/reference/llama_ops_ref.py
// with Hugging Face's LlamaRotaryEmbedding + apply_rotary_pos_emb.
#include <fstream>

#include <nlohmann/json.hpp>

#include "tests/tensor/op_harness.h"

using namespace mpitron;
using namespace mpitron::test;

namespace {

struct RopeDims {
  int64_t b, t, h, d;
};
std::string dims_str(const RopeDims& d) { return str("B=", d.b, " T=", d.t, " H=", d.h, " D=", d.d); }

// out = RoPE(x) (sign = +1) or its transpose (sign = −1, the backward).
std::vector<double> ref_rope(const RopeDims& d, const std::vector<double>& x, int64_t rotate_heads, double base,
                             double percent, int64_t offset, double sign = 1.0) {
  const int64_t r = static_cast<int64_t>(static_cast<double>(d.d) * percent), half = r / 2;
  std::vector<double> out = x;
  for (int64_t b = 0; b < d.b; ++b)
    for (int64_t t = 0; t < d.t; ++t)
      for (int64_t h = 0; h < rotate_heads; ++h) {
        const size_t row = static_cast<size_t>(((b * d.t + t) * d.h + h) * d.d);
        for (int64_t i = 0; i < half; ++i) {
          const double ang = static_cast<double>(t + offset) * std::pow(base, -2.0 * i / static_cast<double>(r));
          const double c = std::cos(ang), s = sign * std::sin(ang);
          const double x1 = x[row + i], x2 = x[row + i + half];
          out[row + i] = x1 * c - x2 * s;
          out[row + i + half] = x2 * c + x1 * s;
        }
      }
  return out;
}

void run(Device dev, DType dt, const RopeDims& d, int64_t rotate_heads, const RopeArgs& a, bool in_place,
         uint64_t seed) {
  Rng rng(seed);
  const Shape shape{d.b, d.t, d.h, d.d};
  const Input x = rand_input(rng, shape, dt, dev, -2, 2);
  const std::string name =
      case_name(dev, dt, str("rope ", dims_str(d), " rotate_heads=", rotate_heads, " base=", a.base, " percent=",
                             a.percent, " offset=", a.position_offset, in_place ? " in place" : ""));
  const std::vector<double> ref = ref_rope(d, x.v, rotate_heads, a.base, a.percent, a.position_offset);
  if (in_place) {
    const Tensor y = x.t.clone();
    rope_forward(y, y, rotate_heads, a);
    check_close(name + " out", y, ref, tol(dt, Kind::Pointwise));
  } else {
    Out out = make_out(shape, dt, dev);
    rope_forward(x.t, out.t, rotate_heads, a);
    check_out(name + " out", out, ref, tol(dt, Kind::Pointwise));
  }

  const Input dout = rand_input(rng, shape, dt, dev, -1, 1);
  const std::vector<double> g =
      x.v.size() <= 2000
          ? fd_grad(x.v,
                    [&](const std::vector<double>& v) {
                      return ref_rope(d, v, rotate_heads, a.base, a.percent, a.position_offset);
                    },
                    dout.v)
          : ref_rope(d, dout.v, rotate_heads, a.base, a.percent, a.position_offset, -1.0);
  Tol t = tol(dt, Kind::Pointwise);
  t.atol = std::max(t.atol, 1e-9);  // finite-difference noise on exact zeros
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

RopeArgs args(double base, double percent, int64_t offset) {
  RopeArgs a;
  a.base = base;
  a.percent = percent;
  a.position_offset = offset;
  return a;
}

}  // namespace

TEST_CASE("rope forward and backward vs float64 and finite differences: every dtype") {
  uint64_t seed = 9000;
  for (Device dev : test_devices())
    for (DType dt : float_dtypes()) {
      run(dev, dt, {1, 1, 1, 2}, 1, args(10000, 1.0, 0), false, ++seed);
      run(dev, dt, {2, 5, 3, 8}, 3, args(10000, 1.0, 0), false, ++seed);
      run(dev, dt, {1, 7, 5, 16}, 3, args(10000, 1.0, 0), false, ++seed);        // fused QKV: Q,K rotate, V passes
      run(dev, dt, {2, 3, 4, 12}, 2, args(500000, 0.5, 4), false, ++seed);      // partial rotary, decode offset
      run(dev, dt, {1, 6, 3, 10}, 3, args(10000, 0.4, 0), true, ++seed);        // R = 4 of 10, in place
      run(dev, dt, {2, 4, 6, 8}, 0, args(10000, 1.0, 0), false, ++seed);        // nothing rotates: a copy
      run(dev, dt, {1, 9, 2, 6}, 2, args(100, 1.0, 1000), true, ++seed);        // large positions
    }
}

TEST_CASE("rope: moderately large (closed-form backward)") {
  uint64_t seed = 9100;
  for (Device dev : test_devices())
    for (DType dt : float_dtypes()) {
      run(dev, dt, {2, 129, 12, 64}, 8, args(10000, 1.0, 0), false, ++seed);   // NH + 2G = 12 heads, NH = G = 4
      run(dev, dt, {1, 65, 6, 128}, 6, args(10000, 0.25, 3), true, ++seed);
    }
}

TEST_CASE("rope: Hugging Face Llama reference (tests/reference/llama_ops_ref.py)") {
  std::ifstream f(std::string(MPITRON_SOURCE_DIR) + "/tests/tensor/ref/llama_ops_ref.json");
  REQUIRE_MESSAGE(f.good(), "tests/tensor/ref/llama_ops_ref.json is missing: run tests/reference/llama_ops_ref.py");
  const nlohmann::json j = nlohmann::json::parse(f);
  for (const auto& c : j.at("rope")) {
    const RopeDims d{c.at("B"), c.at("T"), c.at("H"), c.at("D")};
    const RopeArgs a = args(c.at("base"), c.at("percent"), c.at("offset"));
    const int64_t rh = c.at("rotate_heads");
    const std::vector<double> x = c.at("x"), want = c.at("out"), dout = c.at("dout"), dx = c.at("dx");
    for (Device dev : test_devices()) {
      const Tensor xt = make_tensor(x, {d.b, d.t, d.h, d.d}, DType::F32, dev);
      const Tensor out = Tensor::empty(xt.shape(), DType::F32, dev);
      rope_forward(xt, out, rh, a);
      // HF computes the angles in f32 (error ≈ p·θ·6e-8 at these positions ≤ 20): a few 1e-6.
      const Tol t{1e-5, 5e-6, 0};
      const std::string name = case_name(dev, DType::F32, str("rope vs HF ", c.at("name").get<std::string>()));
      check_close(name + " out", out, want, t);
      const Tensor dt = make_tensor(dout, xt.shape(), DType::F32, dev), g = Tensor::empty(xt.shape(), DType::F32, dev);
      rope_backward(dt, g, rh, a);
      check_close(name + " dx (torch autograd)", g, dx, t);
    }
  }
}

TEST_CASE("rope: invalid arguments throw naming the op") {
  const Tensor x = Tensor::zeros({1, 4, 3, 8}, DType::F32), out = Tensor::zeros({1, 4, 3, 8}, DType::F32);
  check_throws_naming("rope_forward", [&] { rope_forward(Tensor::zeros({4, 3, 8}, DType::F32), out, 1, {}); }, "3-D x");
  check_throws_naming("rope_forward", [&] { rope_forward(x, Tensor::zeros({1, 4, 3, 6}, DType::F32), 1, {}); },
                      "out shape");
  check_throws_naming("rope_forward", [&] { rope_forward(x, Tensor::zeros({1, 4, 3, 8}, DType::BF16), 1, {}); },
                      "out dtype");
  check_throws_naming("rope_forward", [&] { rope_forward(x, out, 4, {}); }, "rotate_heads > H");
  check_throws_naming("rope_forward", [&] { rope_forward(x, out, -1, {}); }, "rotate_heads < 0");
  check_throws_naming("rope_forward", [&] { rope_forward(x, out, 1, args(10000, 0.375, 0)); }, "odd rotary dim (3 of 8)");
  check_throws_naming("rope_forward", [&] { rope_forward(x, out, 1, args(10000, 0.0, 0)); }, "percent 0");
  check_throws_naming("rope_forward", [&] { rope_forward(x, out, 1, args(10000, 1.5, 0)); }, "percent > 1");
  check_throws_naming("rope_forward", [&] { rope_forward(x, out, 1, args(0, 1.0, 0)); }, "base 0");
  check_throws_naming("rope_forward", [&] { rope_forward(x, out, 1, args(10000, 1.0, -1)); }, "negative offset");
  check_throws_naming("rope_backward", [&] { rope_backward(x, Tensor::zeros({1, 4, 3, 8}, DType::F16), 1, {}); },
                      "dx dtype");
  check_throws_naming("rope_rotary_dim", [&] { rope_rotary_dim(10, 0.1); }, "R = 1");
  CHECK(rope_rotary_dim(128, 1.0) == 128);
  CHECK(rope_rotary_dim(128, 0.5) == 64);
  CHECK(rope_rotary_dim(96, 0.25) == 24);
}
