// Training that survives (issue #18): a non-finite loss or gradient norm stops
// an f32/bf16 run with an error naming the iteration, before anything
// non-finite is applied or saved; fp16 skips it as an overflow and stops when
// the loss scale can fall no further; loss / grad-norm spikes are skipped (or
// rerun from the last checkpoint) over a moving window; resuming past the end
// trains nothing and saves nothing.
#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>

#include "core/error.h"
#include "model/training/arguments.h"
#include "model/gpt.h"
#include "model/training/gpt_data.h"
#include "model/training/trainer.h"
#include "tests/model/model_test_util.h"

using namespace mpitron;
namespace fs = std::filesystem;

namespace {

std::vector<std::string> flags(const std::string& data, int iters, const std::string& lr = "3e-3") {
  return {"--num-layers", "2", "--hidden-size", "32", "--num-attention-heads", "2", "--seq-length", "24",
          "--micro-batch-size", "2", "--global-batch-size", "4", "--train-iters", std::to_string(iters),
          "--lr", lr, "--lr-decay-style", "constant", "--hidden-dropout", "0", "--data-path", data, "--split", "90,10,0",
          "--log-interval", "1", "--eval-iters", "0", "--seed", "5", "--device", "cpu"};
}

std::string message_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

int64_t latest_iteration(const fs::path& save) {
  std::ifstream f(save / "latest_checkpointed_iteration.txt");
  int64_t it = -1;
  f >> it;
  return it;
}

// An easy repeating pattern, except for the samples of iteration `spike_iter`
// (global batch 4), which are uniformly random tokens: a loss spike.
struct SpikyData final : SampleSource {
  int64_t spike_iter;
  explicit SpikyData(int64_t it) : spike_iter(it) {}
  int64_t num_samples(int) const override { return 100000; }
  void sample(int, int64_t index, int32_t* t) const override {
    const bool spike = index / 4 == spike_iter - 1;
    std::mt19937 rng(static_cast<uint32_t>(index));
    for (int i = 0; i < 25; ++i) t[i] = spike ? static_cast<int32_t>(rng() % 50257) : 10 + (i + index) % 7;
  }
};

}  // namespace

TEST_CASE("f32 --lr 1e6 diverges: the run stops naming the iteration; no checkpoint holds NaN") {
  const fs::path dir = testing::fresh_temp_dir("robust_diverge");
  const std::string data = testing::write_toy_dataset(dir, 7, 200);
  auto f = flags(data, 40, "1e6");
  const fs::path save = dir / "ckpt";
  f.insert(f.end(), {"--save", save.string(), "--save-interval", "1"});
  const TrainArgs a = testing::parse_flags(f);
  const std::string m = message_of([&] { Trainer(a, make_gpt_data(a, 50257)).run(); });
  REQUIRE_MESSAGE(!m.empty(), "a run at --lr 1e6 finished without an error");
  CHECK_MESSAGE(m.find("iteration ") != std::string::npos, m);
  CHECK_MESSAGE((m.find("not finite") != std::string::npos || m.find("NaN or Inf") != std::string::npos), m);
  // Every checkpoint that was written predates the failure and is finite (the last one loads).
  const int64_t latest = latest_iteration(save);
  MESSAGE("stopped with: ", m, "; latest checkpoint: ", latest);
  CHECK(latest < 40);
  if (latest > 0) {  // it loads, and its weights are finite (huge: they give the NaN of the next step)
    auto g = flags(data, static_cast<int>(latest));
    g.insert(g.end(), {"--load", save.string()});
    const TrainArgs b = testing::parse_flags(g);
    Trainer t(b, make_gpt_data(b, 50257));
    CHECK(t.run().steps_run == 0);
    const Tensor w = t.model().params().values();
    int64_t bad = 0;
    for (int64_t i = 0; i < w.numel(); ++i) bad += !std::isfinite(w.data<float>()[i]);
    CHECK(bad == 0);
  }
  fs::remove_all(dir);
}

TEST_CASE("--no-check-for-nan-in-loss-and-grad: non-finite steps are skipped and counted, nothing stops") {
  const fs::path dir = testing::fresh_temp_dir("robust_nocheck");
  const std::string data = testing::write_toy_dataset(dir, 7, 200);
  auto f = flags(data, 12, "1e6");
  f.insert(f.end(), {"--no-check-for-nan-in-loss-and-grad"});
  const TrainArgs a = testing::parse_flags(f);
  const TrainSummary s = Trainer(a, make_gpt_data(a, 50257)).run();
  CHECK(s.iterations == 12);
  int nonfinite = 0;
  for (double l : s.losses) nonfinite += !std::isfinite(l);
  CHECK(nonfinite > 0);
  fs::remove_all(dir);
}

TEST_CASE("NaN weights: the check stops at the step; without it the save is refused; nothing is written") {
  const fs::path dir = testing::fresh_temp_dir("robust_nanweights");
  const std::string data = testing::write_toy_dataset(dir, 7, 200);
  for (const bool check : {true, false}) {
    CAPTURE(check);
    auto f = flags(data, 3);
    f.insert(f.end(), {"--save", (dir / "ckpt").string(), "--save-interval", "1"});
    if (!check) f.push_back("--no-check-for-nan-in-loss-and-grad");
    const TrainArgs a = testing::parse_flags(f);
    Trainer t(a, make_gpt_data(a, 50257));
    t.model().params().values().data<float>()[5] = NAN;  // f32: the values are the master weights
    const std::string m = message_of([&] { t.run(); });
    if (check) CHECK_MESSAGE(m.find("iteration 1: the loss (") != std::string::npos, m);
    else CHECK_MESSAGE(m.find("hold NaN or Inf; not saving") != std::string::npos, m);
    CHECK(!fs::exists(dir / "ckpt" / "latest_checkpointed_iteration.txt"));
  }
  fs::remove_all(dir);
}

TEST_CASE("fp16: overflows are skipped; a loss scale stuck at its minimum stops the run") {
  const fs::path dir = testing::fresh_temp_dir("robust_fp16");
  const std::string data = testing::write_toy_dataset(dir, 7, 200);
  auto f = flags(data, 60);
  f.insert(f.end(), {"--fp16", "--init-method-std", "100", "--initial-loss-scale", "4", "--hysteresis", "1",
                     "--save", (dir / "ckpt").string()});
  const TrainArgs a = testing::parse_flags(f);
  const std::string m = message_of([&] { Trainer(a, make_gpt_data(a, 50257)).run(); });
  CHECK_MESSAGE(m.find("minimum loss scale 1") != std::string::npos, m);
  CHECK(!fs::exists(dir / "ckpt" / "latest_checkpointed_iteration.txt"));
  fs::remove_all(dir);
}

TEST_CASE("--skip-spike-zscore: a spike batch is counted and not applied; without it the weights move") {
  // 14 steps, the 14th on random tokens: skipped, counted, its loss reported.
  auto g = flags("unused", 14);
  g.insert(g.end(), {"--skip-spike-zscore", "4", "--spike-window", "5"});
  const TrainArgs b = testing::parse_flags(g);
  Trainer t14(b, std::make_shared<SpikyData>(14));
  const TrainSummary s = t14.run();
  REQUIRE(s.losses.size() == 14);
  CHECK(s.spike_skips == 1);
  CHECK(s.losses[13] > s.losses[12] + 1);
  // Not applied: the weights after 14 steps (the 14th skipped) equal those after 13.
  auto h = flags("unused", 13);
  const TrainArgs c = testing::parse_flags(h);
  Trainer t13(c, std::make_shared<SpikyData>(14));
  t13.run();
  const Tensor w14 = t14.model().params().values(), w13 = t13.model().params().values();
  REQUIRE(w14.numel() == w13.numel());
  CHECK(std::memcmp(w14.data<float>(), w13.data<float>(), static_cast<size_t>(w14.numel()) * 4) == 0);
  // Without the option the spike is applied: the weights move.
  auto k = flags("unused", 14);
  const TrainArgs d = testing::parse_flags(k);
  Trainer applied(d, std::make_shared<SpikyData>(14));
  CHECK(applied.run().spike_skips == 0);
  CHECK(std::memcmp(applied.model().params().values().data<float>(), w13.data<float>(),
                    static_cast<size_t>(w13.numel()) * 4) != 0);
}

TEST_CASE("--spike-rerun: back to the last checkpoint, on with the data after the spike") {
  const fs::path dir = testing::fresh_temp_dir("robust_rerun");
  auto f = flags("unused", 16);
  f.insert(f.end(), {"--skip-spike-zscore", "4", "--spike-window", "5", "--spike-rerun", "--save",
                     (dir / "ckpt").string(), "--save-interval", "4"});
  const TrainArgs a = testing::parse_flags(f);
  const TrainSummary s = Trainer(a, std::make_shared<SpikyData>(14)).run();
  CHECK(s.spike_skips == 1);
  CHECK(s.spike_reruns == 1);
  CHECK(s.iterations == 16);
  CHECK(s.losses.size() == 13 + 4);  // 1..13 applied; the spike at 14 goes back to 12; 13..16 again
  CHECK(latest_iteration(dir / "ckpt") == 16);
  fs::remove_all(dir);
}

TEST_CASE("resuming past --train-iters trains nothing, saves nothing, says so") {
  const fs::path dir = testing::fresh_temp_dir("robust_past_end");
  const std::string data = testing::write_toy_dataset(dir, 7, 200);
  const fs::path save = dir / "ckpt";
  auto f = flags(data, 4);
  f.insert(f.end(), {"--save", save.string()});
  const TrainArgs a = testing::parse_flags(f);
  Trainer(a, make_gpt_data(a, 50257)).run();
  REQUIRE(latest_iteration(save) == 4);
  auto g = flags(data, 2);
  g.insert(g.end(), {"--load", save.string(), "--save", save.string()});
  const TrainArgs b = testing::parse_flags(g);
  const TrainSummary s = Trainer(b, make_gpt_data(b, 50257)).run();
  CHECK(s.steps_run == 0);
  CHECK(s.iterations == 4);
  CHECK(s.checkpoint_dir.empty());
  CHECK(latest_iteration(save) == 4);
  fs::remove_all(dir);
}
