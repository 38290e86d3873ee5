// Learning-rate schedule and batch-size ramp-up against Megatron's formulas
// (megatron/core/optimizer_param_scheduler.py, num_microbatches_calculator.py),
// worked out by hand here.
#include <doctest/doctest.h>

#include <cmath>
#include <fstream>

#include "core/error.h"
#include "model/training/arguments.h"
#include "model/training/lr_schedule.h"

using namespace mpitron;

TEST_CASE("LR: linear warmup, then cosine / linear / constant decay to min-lr") {
  LRScheduleConfig c;
  c.lr = 1.0f;
  c.min_lr = 0.1f;
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
