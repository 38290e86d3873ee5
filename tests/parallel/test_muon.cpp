// tests/parallel/test_muon.cpp — --optimizer muon (parallel/muon_rule.cpp, parallel/newton_schulz.h)
// through the one flat-slice step every model-states strategy runs (parallel/flat_optimizer.h),
// against torch.optim.Muon chained with torch.optim.AdamW in float64 on the same gradients
// (tests/reference/torch_muon_ref.py, tests/parallel/ref/torch_muon.json): momentum with and without
// Nesterov, decoupled weight decay, the three scale modes, a fused qkv split and whole, loss-scale
// unscaling, clipping over every parameter, a learning rate per step. f32 within 1e-5 per tensor.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <fstream>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "parallel/data_parallel.h"
#include "parallel/flat_optimizer.h"
#include "parallel/newton_schulz.h"
#include "parallel/update_rule.h"

using namespace mpitron;

namespace {

// The reference's parameters as the flat slice mpitron's optimizer sees them.
std::vector<FlatParam> reference_params(const nlohmann::json& ps) {
  std::vector<FlatParam> v;
  int64_t at = 0;
  for (const nlohmann::json& p : ps) {
    const auto shape = p.at("shape").get<std::vector<int64_t>>();
    FlatParam f;
    f.offset = at;
    f.numel = 1;
    for (const int64_t d : shape) f.numel *= d;
    f.weight_decay = p.at("decay").get<bool>();
    if (p.at("matrix").get<bool>()) {
      f.rows = shape[0];
      f.cols = shape[1];
      f.row_parts = p.at("row_parts").get<std::vector<int64_t>>();
    }
    at += f.numel;
    v.push_back(f);
  }
  return v;
}

// max |a - b| / max |b| over one parameter's elements.
double tensor_rel(const std::vector<float>& got, const std::vector<double>& want, const FlatParam& p) {
  double diff = 0, scale = 0;
  for (int64_t i = p.offset; i < p.offset + p.numel; ++i) {
    diff = std::max(diff, std::abs(got[static_cast<size_t>(i)] - want[static_cast<size_t>(i)]));
    scale = std::max(scale, std::abs(want[static_cast<size_t>(i)]));
  }
  return diff / std::max(scale, 1e-12);
}

}  // namespace

TEST_CASE("Muon equals torch.optim.Muon (+ AdamW for the rest) step by step (float64 reference, f32 within 1e-5)") {
  std::ifstream f(std::string(MPITRON_SOURCE_DIR) + "/tests/parallel/ref/torch_muon.json");
  REQUIRE(f.good());
  const nlohmann::json ref = nlohmann::json::parse(f);
  const std::vector<FlatParam> params = reference_params(ref.at("params"));
  const int64_t n = params.back().offset + params.back().numel;
  for (const nlohmann::json& c : ref.at("cases")) {
    const std::string name = c.at("name");
    CAPTURE(name);
    const auto init = c.at("init").get<std::vector<float>>();
    REQUIRE(static_cast<int64_t>(init.size()) == n);
    const Tensor values = Tensor::from_vector(init, {n});
    OptimizerConfig oc;
    oc.optimizer = "muon";
    oc.muon_momentum = c.at("momentum").get<float>();
    oc.muon_nesterov = c.at("nesterov").get<bool>();
    oc.muon_scale_mode = c.at("scale_mode").get<std::string>();
    oc.muon_extra_scale = c.at("extra_scale").get<float>();
    oc.muon_split_qkv = c.at("split_qkv").get<bool>();
    oc.muon_coefficients = "simple";  // torch.optim.Muon's one tuple
    oc.muon_matmul_prec = "high";     // f32 products: the reference is float64
    oc.beta1 = c.at("adam").at("beta1").get<float>();
    oc.beta2 = c.at("adam").at("beta2").get<float>();
    oc.eps = c.at("adam").at("eps").get<float>();
    oc.weight_decay = c.at("weight_decay").get<float>();
    oc.clip_grad = c.at("clip_grad").get<float>();
    FlatOptimizer opt(values, 0, params, oc);
    CHECK(std::string(opt.optimizer()) == "muon");
    const float loss_scale = c.at("loss_scale").get<float>();
    const auto lrs = c.at("lrs").get<std::vector<float>>();
    double worst = 0;
    for (size_t s = 0; s < lrs.size(); ++s) {
      const Tensor grads = Tensor::from_vector(c.at("grads")[s].get<std::vector<float>>(), {n});
      const Tensor sq = Tensor::zeros({1}, DType::F32);
      opt.add_sum_squares(grads, sq);
      const StepResult r = opt.step(grads, static_cast<double>(sq.item()), loss_scale, lrs[s]);
      CHECK(r.grad_norm == doctest::Approx(c.at("grad_norms")[s].get<double>()).epsilon(1e-6));
      const std::vector<float> got = values.to_floats();
      const auto want = c.at("values")[s].get<std::vector<double>>();
      for (const FlatParam& p : params) worst = std::max(worst, tensor_rel(got, want, p));
    }
    MESSAGE(name, ": worst per-tensor relative difference to torch.optim.Muon/AdamW (float64) ", worst);
    CHECK(worst < 1e-5);
  }
}

TEST_CASE("Newton-Schulz: wide and tall alike, bf16 operands near f32, coefficient tables as emerging_optimizers'") {
  // A tall matrix is the transpose of a wide one's problem: NS(Gᵀ) = NS(G)ᵀ.
  const int64_t m = 6, n = 10;
  std::vector<float> g(static_cast<size_t>(m * n)), gt(g.size());
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) {
      const float v = std::sin(0.7f * static_cast<float>(i * n + j)) + 0.1f * static_cast<float>(i);
      g[static_cast<size_t>(i * n + j)] = v;
      gt[static_cast<size_t>(j * m + i)] = v;
    }
  const auto coeff = ns_coefficients("quintic", 5);
  const Tensor wide = Tensor::empty({m, n}, DType::F32), tall = Tensor::empty({n, m}, DType::F32);
  newton_schulz(Tensor::from_vector(g, {m, n}), wide, coeff);
  newton_schulz(Tensor::from_vector(gt, {n, m}), tall, coeff);
  const std::vector<float> w = wide.to_floats(), t = tall.to_floats();
  double diff = 0;
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j)
      diff = std::max(diff, static_cast<double>(std::abs(w[static_cast<size_t>(i * n + j)] - t[static_cast<size_t>(j * m + i)])));
  CHECK(diff < 1e-5);
  // The singular values land near 1 (the quintic set leaves them between about 0.6 and 1.2, not exactly 1):
  // X Xᵀ ≈ I within 0.8, where the input's Gram matrix is nowhere near it.
  double off = 0;
  for (int64_t i = 0; i < m; ++i)
    for (int64_t k = 0; k < m; ++k) {
      double d = 0;
      for (int64_t j = 0; j < n; ++j) d += w[static_cast<size_t>(i * n + j)] * w[static_cast<size_t>(k * n + j)];
      off = std::max(off, std::abs(d - (i == k ? 1.0 : 0.0)));
    }
  MESSAGE("quintic: max |X Xᵀ - I| = ", off);
  CHECK(off < 0.8);
  const Tensor half = Tensor::empty({m, n}, DType::F32);
  newton_schulz(Tensor::from_vector(g, {m, n}), half, coeff, true);
  const std::vector<float> h = half.to_floats();
  double hd = 0;
  for (size_t i = 0; i < h.size(); ++i) hd = std::max(hd, static_cast<double>(std::abs(h[i] - w[i])));
  MESSAGE("bf16 operands against f32: ", hd);
  CHECK(hd > 0);  // the operands really were rounded ...
  CHECK(hd < 3e-2);  // ... and only by bf16's precision
  // A zero matrix stays zero (the norm's eps guard).
  const Tensor z = Tensor::empty({m, n}, DType::F32);
  newton_schulz(Tensor::zeros({m, n}, DType::F32), z, coeff);
  for (const float v : z.to_floats()) CHECK(v == 0.0f);
  // Tables: simple is one tuple, quintic cycles its five, polar_express repeats its last.
  CHECK(ns_coefficients("simple", 3).size() == 3);
  CHECK(ns_coefficients("quintic", 6)[5].a == ns_coefficients("quintic", 1)[0].a);
  CHECK(ns_coefficients("polar_express", 10)[9].a == 1.8750f);
  CHECK_THROWS_WITH_AS(ns_coefficients("aol", 5), doctest::Contains("--muon-coefficient-type aol"), Error);
}

TEST_CASE("Muon needs whole matrices: a flat shard that cuts one is refused naming dist_muon; whole-tensor shards") {
  std::vector<FlatParam> ps(3);
  ps[0].offset = 0, ps[0].numel = 12, ps[0].rows = 3, ps[0].cols = 4;
  ps[1].offset = 12, ps[1].numel = 5;  // a bias
  ps[2].offset = 17, ps[2].numel = 20, ps[2].rows = 4, ps[2].cols = 5;
  OptimizerConfig oc;
  oc.optimizer = "muon";
  const Tensor values = Tensor::zeros({37}, DType::F32);
  // ZeRO's even split over 2 ranks: [0, 19) and [19, 37) — the second matrix is cut.
  const ShardLayout even(37, 2);
  CHECK_THROWS_WITH_AS(FlatOptimizer(values.flat_range(even.begin(1), even.size(1)), even.begin(1), ps, oc),
                       doctest::Contains("dist_muon"), Error);
  // By whole tensors: every boundary on a parameter's start, the shares near even.
  const ShardLayout whole = ShardLayout::whole_tensors(ps, 37, 2);
  CHECK(whole.begin(0) == 0);
  CHECK(whole.end(0) == 37);  // the second matrix starts at 17, short of 37/2 = 19: all on rank 0 ...
  const ShardLayout three = ShardLayout::whole_tensors(ps, 37, 3);
  CHECK(three.end(0) == 17);  // ... with 3 ranks: [0, 17) [17, 37) [37, 37)
  CHECK(three.end(1) == 37);
  CHECK(three.size(2) == 0);
  for (int r = 0; r < 3; ++r)
    FlatOptimizer(values.flat_range(three.begin(r), three.size(r)), three.begin(r), ps, oc);  // no cut: accepted
  std::vector<int64_t> c = three.pieces(0, 37);
  CHECK(c == std::vector<int64_t>{17, 20, 0});
  // The rule is a row of the table; Megatron's others are refused by name.
  const std::vector<std::string> built = built_optimizers();
  CHECK(std::find(built.begin(), built.end(), "dist_muon") != built.end());
  CHECK(optimizer_state_names("dist_muon") == std::vector<std::string>{"exp_avg", "exp_avg_sq"});
  oc.muon_tp_mode = "ring";
  CHECK_THROWS_WITH_AS(make_update_rule(oc), doctest::Contains("--muon-tp-mode ring"), Error);
}
