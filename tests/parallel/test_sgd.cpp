// tests/parallel/test_sgd.cpp — --optimizer sgd (parallel/update_rule.h) through the one
// flat-slice step every model-states strategy runs (parallel/flat_optimizer.h), against
// torch.optim.SGD in float64 on the same gradients (tests/reference/torch_sgd_ref.py,
// tests/parallel/ref/torch_sgd.json): momentum, L2 weight decay on the decaying parameters
// only, loss-scale unscaling, clipping, a learning rate per step. f32 within 1e-5.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <fstream>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "model/params.h"
#include "model/training/optimizer.h"
#include "parallel/flat_optimizer.h"
#include "parallel/update_rule.h"

using namespace mpitron;

TEST_CASE("SGD with momentum equals torch.optim.SGD step by step (float64 reference, f32 within 1e-5)") {
  std::ifstream f(std::string(MPITRON_SOURCE_DIR) + "/tests/parallel/ref/torch_sgd.json");
  REQUIRE(f.good());
  const nlohmann::json ref = nlohmann::json::parse(f);
  for (const nlohmann::json& c : ref.at("cases")) {
    const std::string name = c.at("name");
    CAPTURE(name);
    ParamSet ps;
    for (const nlohmann::json& p : ref.at("params"))
      ps.add(p.at("name"), p.at("shape").get<std::vector<int64_t>>(), p.at("decay").get<bool>());
    ps.allocate(DType::F32, Device::cpu());
    const int64_t n = ps.numel();
    const auto init = c.at("init").get<std::vector<float>>();
    REQUIRE(static_cast<int64_t>(init.size()) == n);
    ps.values().copy_from(Tensor::from_vector(init, {n}));
    OptimizerConfig oc;
    oc.optimizer = "sgd";
    oc.sgd_momentum = c.at("momentum").get<float>();
    oc.weight_decay = c.at("weight_decay").get<float>();
    oc.clip_grad = c.at("clip_grad").get<float>();
    ReplicatedOptimizer opt(ps, oc);  // the replicated strategy's optimizer: its rule is --optimizer's
    CHECK(std::string(opt.optimizer()) == "sgd");
    CHECK_FALSE(opt.exp_avg_sq().defined());  // one state: the momentum buffer
    const float loss_scale = c.at("loss_scale").get<float>();
    const auto lrs = c.at("lrs").get<std::vector<float>>();
    double worst = 0;
    for (size_t s = 0; s < lrs.size(); ++s) {
      ps.grads().copy_from(Tensor::from_vector(c.at("grads")[s].get<std::vector<float>>(), {n}));
      const StepResult r = opt.step(lrs[s], loss_scale);
      CHECK(r.grad_norm == doctest::Approx(c.at("grad_norms")[s].get<double>()).epsilon(1e-6));
      const std::vector<float> got = ps.values().to_floats();
      const auto want = c.at("values")[s].get<std::vector<double>>();
      for (int64_t i = 0; i < n; ++i) {
        const double e = std::abs(got[static_cast<size_t>(i)] - want[static_cast<size_t>(i)]) /
                         std::max(std::abs(want[static_cast<size_t>(i)]), 1e-3);
        worst = std::max(worst, e);
      }
    }
    MESSAGE(name, ": worst relative difference to torch.optim.SGD (float64) ", worst);
    CHECK(worst < 1e-5);
  }
}

TEST_CASE("--optimizer names a built rule; the others are refused naming the value") {
  CHECK(built_optimizers() == std::vector<std::string>{"adam", "sgd", "muon", "dist_muon"});
  CHECK(optimizer_state_names("adam") == std::vector<std::string>{"exp_avg", "exp_avg_sq"});
  CHECK(optimizer_state_names("sgd") == std::vector<std::string>{"momentum_buffer"});
  OptimizerConfig oc;
  oc.optimizer = "lion";
  try {
    make_update_rule(oc);
    FAIL("lion was built");
  } catch (const Error& e) {
    CHECK(std::string(e.what()).find("--optimizer lion") != std::string::npos);
  }
}
