// Learning-rate schedule and batch-size ramp-up against Megatron's formulas
// (megatron/core/optimizer_param_scheduler.py, num_microbatches_calculator.py),
// worked out by hand here, and every schedule against megatron-core 0.16.1's own
// OptimizerParamScheduler over a whole run (tests/reference/megatron_sched_ref.py,
// tests/model/ref/schedules/megatron_sched.json).
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <fstream>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "model/training/arguments.h"
#include "model/training/lr_schedule.h"

using namespace mpitron;

namespace {

// The schedule flags on a small model (throws what parse_train_args throws).
bool parse_into(std::vector<std::string> flags, TrainArgs& a) {
  std::vector<std::string> all = {"pretrain_gpt", "--num-layers", "2", "--hidden-size", "32", "--num-attention-heads",
                                  "2", "--seq-length", "16", "--micro-batch-size", "1", "--mock-data", "--lr", "3e-3"};
  all.insert(all.end(), flags.begin(), flags.end());
  std::vector<char*> argv;
  for (auto& f : all) argv.push_back(f.data());
  return parse_train_args(static_cast<int>(argv.size()), argv.data(), a);
}

TrainArgs parse(std::vector<std::string> flags) {
  TrainArgs a;
  REQUIRE(parse_into(std::move(flags), a));
  return a;
}

double rel(double x, double ref) { return std::abs(x - ref) / std::max(std::abs(ref), 1e-30); }

bool refused_naming(std::vector<std::string> flags, const std::string& needle) {
  try {
    TrainArgs a;
    parse_into(std::move(flags), a);
  } catch (const Error& e) {
    const bool ok = std::string(e.what()).find(needle) != std::string::npos;
    if (!ok) MESSAGE("message was: ", std::string(e.what()));
    return ok;
  }
  return false;
}

}  // namespace

TEST_CASE("every schedule equals megatron-core's OptimizerParamScheduler at every step (lr and weight decay, 1e-7)") {
  std::ifstream f(std::string(MPITRON_SOURCE_DIR) + "/tests/model/ref/schedules/megatron_sched.json");
  REQUIRE(f.good());
  const nlohmann::json ref = nlohmann::json::parse(f);
  CHECK(ref.at("megatron_core") == "0.16.1");
  int checked = 0;
  double worst = 0;
  for (const nlohmann::json& c : ref.at("configs")) {
    const std::string name = c.at("name");
    CAPTURE(name);
    const TrainArgs a = parse(c.at("flags").get<std::vector<std::string>>());
    const LRSchedule s(lr_schedule_config(a));
    const auto lr = c.at("lr").get<std::vector<double>>(), wd = c.at("wd").get<std::vector<double>>();
    const int64_t gbs = c.at("global_batch_size");
    CHECK(a.global_batch_size == gbs);
    // lr[k]: what iteration k + 1 trains with, the scheduler having stepped k global batches.
    for (size_t k = 0; k < lr.size(); ++k) {
      const double step = static_cast<double>(static_cast<int64_t>(k) * gbs);
      const double l = s.lr_at(step), w = s.wd_at(step);
      worst = std::max({worst, rel(l, lr[k]), rel(w, wd[k])});
      if (rel(l, lr[k]) > 1e-7 || rel(w, wd[k]) > 1e-7)
        FAIL_CHECK("step ", k, ": lr ", l, " vs megatron ", lr[k], ", wd ", w, " vs ", wd[k]);
      ++checked;
    }
  }
  MESSAGE(checked, " steps of ", ref.at("configs").size(), " schedules; worst relative difference ", worst);
  CHECK(checked > 500);
}

TEST_CASE("schedule flags Megatron refuses are refused naming the flag") {
  CHECK(refused_naming({"--train-iters", "10", "--lr-decay-style", "WSD"}, "--lr-wsd-decay-iters"));
  CHECK(refused_naming({"--train-samples", "40", "--lr-decay-style", "WSD", "--lr-wsd-decay-iters", "3"},
                       "--lr-wsd-decay-iters"));
  CHECK(refused_naming({"--train-iters", "10", "--lr-decay-style", "WSD", "--lr-wsd-decay-iters", "3",
                        "--lr-wsd-decay-style", "square"},
                       "--lr-wsd-decay-style"));
  CHECK(refused_naming({"--train-iters", "10", "--lr-decay-style", "exponential"}, "--lr-decay-style"));
  CHECK(refused_naming({"--train-iters", "10", "--start-weight-decay", "0.1"}, "--start-weight-decay"));
  CHECK(refused_naming({"--train-iters", "10", "--weight-decay-incr-style", "linear", "--start-weight-decay", "0.1"},
                       "--end-weight-decay"));
  CHECK(refused_naming({"--train-iters", "10", "--weight-decay-incr-style", "linear", "--start-weight-decay", "0.2",
                        "--end-weight-decay", "0.1"},
                       "--end-weight-decay"));
  CHECK(refused_naming({"--train-iters", "10", "--weight-decay-incr-style", "exp"}, "--weight-decay-incr-style"));
  CHECK(refused_naming({"--train-iters", "10", "--override-opt_param-scheduler", "--use-checkpoint-opt_param-scheduler"},
                       "--override-opt_param-scheduler"));
  // The annealing cannot be longer than the decay.
  const TrainArgs a = parse({"--train-iters", "10", "--lr-decay-style", "WSD", "--lr-wsd-decay-iters", "11"});
  CHECK_THROWS_AS(LRSchedule{lr_schedule_config(a)}, Error);
}

TEST_CASE("LR: linear warmup, then cosine / linear / constant decay to min-lr") {
  LRScheduleConfig c;
  c.lr = 1.0;
  c.min_lr = 0.1;
  c.warmup_steps = 10;
  c.decay_steps = 110;
  c.style = "cosine";
  const LRSchedule cos(c);
  CHECK(cos.lr_at(0) == doctest::Approx(0.0));
  CHECK(cos.lr_at(5) == doctest::Approx(0.5));
  CHECK(cos.lr_at(10) == doctest::Approx(1.0));
  // halfway through the decay: min + (max - min) * 0.5 * (cos(pi/2) + 1)
  CHECK(cos.lr_at(60) == doctest::Approx(0.1 + 0.9 * 0.5));
  CHECK(cos.lr_at(35) == doctest::Approx(0.1 + 0.9 * 0.5 * (std::cos(M_PI * 0.25) + 1)));
  CHECK(cos.lr_at(110) == doctest::Approx(0.1));
  CHECK(cos.lr_at(500) == doctest::Approx(0.1));
  c.style = "linear";
  const LRSchedule lin(c);
  CHECK(lin.lr_at(35) == doctest::Approx(1.0 - 0.9 * 0.25));
  CHECK(lin.lr_at(110) == doctest::Approx(0.1));
  c.style = "constant";
  const LRSchedule con(c);
  CHECK(con.lr_at(5) == doctest::Approx(0.5));
  CHECK(con.lr_at(1000) == doctest::Approx(1.0));
  c.style = "exponential";
  CHECK_THROWS_AS(LRSchedule{c}, Error);
}

TEST_CASE("--rampup-batch-size START INCREMENT SAMPLES grows the global batch in equal steps") {
  // 4 → 16 by 4 over 300 samples: 3 increments, one every 100 samples.
  const BatchRampup r(4, 4, 300, 16, 2, 1);
  CHECK(r.global_batch(0) == 4);
  CHECK(r.global_batch(99) == 4);
  CHECK(r.global_batch(100) == 8);
  CHECK(r.global_batch(250) == 12);
  CHECK(r.global_batch(300) == 16);
  CHECK(r.global_batch(10000) == 16);
  CHECK(r.num_micro_batches(0) == 2);
  CHECK(r.num_micro_batches(300) == 8);
  CHECK_THROWS_AS(BatchRampup(4, 3, 300, 16, 2, 1), Error);  // 16 - 4 not a multiple of 3
  CHECK_THROWS_AS(BatchRampup(6, 4, 300, 18, 4, 1), Error);  // start not a multiple of micro × dp
  CHECK_THROWS_AS(BatchRampup(10, 4, 1), Error);             // 10 not divisible by 4 × 1
}

TEST_CASE("--config FILE supplies flags; the command line wins") {
  const std::string path = "mpitron_test_config.cfg";
  std::ofstream(path) << "num-layers = 3\nhidden-size = 64\nnum-attention-heads = 4\nseq-length = 32\n"
                         "lr = 0.01\ntrain-iters = 7\ndata-path = some_prefix\n";
  std::vector<std::string> flags = {"pretrain_gpt", "--config", path, "--num-layers", "5"};
  std::vector<char*> argv;
  for (auto& f : flags) argv.push_back(f.data());
  TrainArgs a;
  REQUIRE(parse_train_args(static_cast<int>(argv.size()), argv.data(), a));
  CHECK(a.model.num_layers == 5);
  CHECK(a.model.hidden_size == 64);
  CHECK(a.train_iters == 7);
  CHECK(a.lr == doctest::Approx(0.01));
  CHECK(a.data_path == std::vector<std::string>{"some_prefix"});
  std::remove(path.c_str());
}
