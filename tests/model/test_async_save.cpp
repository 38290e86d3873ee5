// tests/model/test_async_save.cpp — --async-save: the checkpoints a background
// thread writes are the synchronous ones (same datasets, bit for bit), a run
// resumed from one continues bitwise, and a failure in the background stops
// the run at the next step with a clear error, the previous checkpoint intact.
#include <doctest/doctest.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "core/error.h"
#include "io/checkpoint.h"
#include "model/training/arguments.h"
#include "model/training/gpt_data.h"
#include "model/training/trainer.h"
#include "tests/model/model_test_util.h"

using namespace mpitron;
namespace fs = std::filesystem;

namespace {

std::vector<std::string> base_flags(const std::string& data, int iters) {
  return {"--num-layers", "2", "--hidden-size", "32", "--num-attention-heads", "2", "--seq-length", "24",
          "--micro-batch-size", "2", "--global-batch-size", "4", "--train-iters", std::to_string(iters),
          "--lr", "3e-3", "--min-lr", "3e-4", "--lr-warmup-iters", "3", "--lr-decay-style", "cosine",
          "--hidden-dropout", "0.1", "--data-path", data, "--split", "90,10,0", "--log-interval", "1",
          "--seed", "99", "--device", "cpu"};
}

std::vector<double> train(std::vector<std::string> flags) {
  const TrainArgs a = testing::parse_flags(std::move(flags));
  Trainer t(a, make_gpt_data(a, 50257));
  return t.run().losses;
}

std::string tracker(const std::string& dir) {
  std::ifstream in(fs::path(dir) / io::kTrackerFileName);
  std::string s;
  std::getline(in, s);
  return s;
}

// Every dataset bit for bit, and the state attributes, of iteration `it` in two save directories.
void check_same_checkpoint(const std::string& a, const std::string& b, int64_t it) {
  CAPTURE(it);
  const io::CheckpointReader ra = io::CheckpointReader::open_iteration(a, it);
  const io::CheckpointReader rb = io::CheckpointReader::open_iteration(b, it);
  const auto ta = ra.tensors(), tb = rb.tensors();
  REQUIRE(ta.size() == tb.size());
  for (size_t i = 0; i < ta.size(); ++i) {
    CAPTURE(ta[i].name);
    REQUIRE(ta[i].name == tb[i].name);
    const Tensor x = ra.read(ta[i].name), y = rb.read(tb[i].name);
    REQUIRE(x.nbytes() == y.nbytes());
    CHECK(std::memcmp(x.data_ptr(), y.data_ptr(), x.nbytes()) == 0);
  }
  for (const char* k : {"consumed_train_samples", "consumed_valid_samples", "optimizer_steps", "skipped_iterations"})
    CHECK(ra.attr_int(k) == rb.attr_int(k));
  for (const char* k : {"lr_schedule", "loss_scaler", "model_config", "rng"})
    CHECK(ra.attr_string(k) == rb.attr_string(k));
}

}  // namespace

TEST_CASE("--async-save writes the synchronous checkpoints, and resuming from one is bitwise") {
  const fs::path dir = testing::fresh_temp_dir("async_save");
  const std::string data = testing::write_toy_dataset(dir, 7, 200);
  const auto flags = base_flags(data, 8);
  const std::string sync_dir = (dir / "sync").string(), async_dir = (dir / "async").string();
  auto sync_flags = flags, async_flags = flags;
  sync_flags.insert(sync_flags.end(), {"--save", sync_dir, "--save-interval", "4"});
  async_flags.insert(async_flags.end(), {"--save", async_dir, "--save-interval", "4", "--async-save"});
  const std::vector<double> straight = train(sync_flags);
  const std::vector<double> with_async = train(async_flags);
  REQUIRE(straight.size() == 8);
  CHECK(with_async == straight);  // saving in the background does not change training
  CHECK(tracker(async_dir) == "8");
  for (int64_t it : {4, 8}) check_same_checkpoint(sync_dir, async_dir, it);

  // Stop after 6 steps (the save at 4 went on in the background; the exit save waits), resume: bitwise.
  const std::string part = (dir / "part").string();
  auto first = flags, second = flags;
  first.insert(first.end(), {"--save", part, "--save-interval", "2", "--async-save", "--exit-interval", "6"});
  second.insert(second.end(), {"--load", part, "--save", part, "--save-interval", "4", "--async-save"});
  const std::vector<double> a = train(first);
  CHECK(tracker(part) == "6");
  const std::vector<double> b = train(second);
  REQUIRE(a.size() == 6);
  REQUIRE(b.size() == 2);
  for (int i = 0; i < 6; ++i) CHECK_MESSAGE(a[i] == straight[i], "iteration ", i + 1);
  for (int i = 0; i < 2; ++i) CHECK_MESSAGE(b[i] == straight[6 + i], "iteration ", i + 7);
  fs::remove_all(dir);
}

TEST_CASE("--async-save: a save failing in the background stops the run at the next step; the previous one stays") {
  const fs::path dir = testing::fresh_temp_dir("async_save_fail");
  const std::string data = testing::write_toy_dataset(dir, 7, 200);
  auto flags = base_flags(data, 8);
  const std::string ckpt = (dir / "ckpt").string();
  flags.insert(flags.end(), {"--save", ckpt, "--save-interval", "2", "--async-save"});
  setenv("MPITRON_TEST_CKPT_FAIL", "0:write:4", 1);
  std::string err;
  try {
    train(flags);
  } catch (const Error& e) {
    err = e.what();
  }
  unsetenv("MPITRON_TEST_CKPT_FAIL");
  CHECK(err.find("background checkpoint save of iteration 4 failed") != std::string::npos);
  CHECK(err.find("injected failure") != std::string::npos);
  CHECK(tracker(ckpt) == "2");
  CHECK_FALSE(fs::exists(fs::path(ckpt) / io::iteration_dir_name(4)));
  fs::remove_all(dir);
}

TEST_CASE("--async-save without --save is rejected") {
  std::vector<std::string> f = {"pretrain_gpt", "--num-layers", "1", "--hidden-size", "8", "--num-attention-heads", "1",
                                "--seq-length", "8", "--micro-batch-size", "1", "--global-batch-size", "1",
                                "--train-iters", "1", "--lr", "1e-3", "--data-path", "x", "--async-save"};
  std::vector<char*> argv;
  for (auto& s : f) argv.push_back(s.data());
  TrainArgs a;
  try {
    parse_train_args(static_cast<int>(argv.size()), argv.data(), a);
    FAIL("accepted");
  } catch (const Error& e) {
    CHECK_MESSAGE(std::string(e.what()).find("--async-save given without --save") != std::string::npos, std::string(e.what()));
  }
}
