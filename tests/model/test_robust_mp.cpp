// The non-finite check is one decision for all ranks (issue #18): NaN weights
// on ONE rank stop every rank of every layout (tp, pp, dp, ZeRO) at the same
// iteration with the same error, before any update or save; nobody deadlocks
// (a hang would hit the ctest timeout).
// mpitron-test: np=2,4
// mpitron-test: timeout=300
#include <doctest/doctest.h>
#include <mpi.h>

#include <cmath>
#include <filesystem>

#include "core/error.h"
#include "model/training/arguments.h"
#include "model/gpt.h"
#include "model/training/gpt_data.h"
#include "model/training/parallel_runtime.h"
#include "model/training/trainer.h"
#include "tests/model/mpi_test_util.h"

using namespace mpitron;
namespace fs = std::filesystem;

namespace {

using testing::world_rank;
using testing::world_size;

std::vector<std::string> flags(const std::string& data, const std::string& save) {
  return {"--num-layers", "2", "--hidden-size", "32", "--num-attention-heads", "4", "--seq-length", "16",
          "--micro-batch-size", "2", "--global-batch-size", "8", "--train-iters", "3", "--lr", "3e-3",
          "--hidden-dropout", "0", "--data-path", data, "--split", "90,10,0", "--log-interval", "1",
          "--eval-iters", "0", "--seed", "7", "--device", "cpu", "--save", save, "--save-interval", "1"};
}

// Trains with NaN put into one weight on the last rank only; returns this rank's error ("" if none).
std::string run_poisoned(std::vector<std::string> f) {
  TrainArgs a;
  a.world_size = world_size();
  std::vector<char*> argv{const_cast<char*>("pretrain_gpt")};
  for (auto& s : f) argv.push_back(s.data());
  REQUIRE(parse_train_args(static_cast<int>(argv.size()), argv.data(), a));
  a.model.vocab_size = 50257;
  a.model.padded_vocab_size = 50304;
  std::shared_ptr<SampleSource> data;
  if (world_rank() == 0) data = make_gpt_data(a, 50257);
  MPI_Barrier(MPI_COMM_WORLD);
  if (world_rank() != 0) data = make_gpt_data(a, 50257);
  ParallelRuntime rt(MPI_COMM_WORLD, a);
  Trainer t(a, data, rt.context());
  // Through a parameter's own storage: the first one this rank holds (ZeRO-3 releases the flat value
  // buffer and gathers the blocks and the embedding tables at each use; it keeps the small units whole).
  if (world_rank() == world_size() - 1) {
    ParamSet& ps = t.model().params();
    size_t i = 0;
    while (i < ps.infos().size() && !ps.var(i).value().defined()) ++i;
    REQUIRE(i < ps.infos().size());
    ps.var(i).value().data<float>()[0] = NAN;
  }
  try {
    t.run();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

// An easy repeating pattern, except the global batch (8 samples) of iteration
// `spike_iter`, which is random tokens: a loss spike seen by whichever ranks hold it.
struct SpikyData final : SampleSource {
  int64_t spike_iter;
  explicit SpikyData(int64_t it) : spike_iter(it) {}
  int64_t num_samples(int) const override { return 100000; }
  void sample(int, int64_t index, int32_t* t) const override {
    const bool spike = index / 8 == spike_iter - 1;
    uint32_t x = static_cast<uint32_t>(index) * 2654435761u + 1;
    for (int i = 0; i < 17; ++i) {
      x = x * 1664525u + 1013904223u;
      t[i] = spike ? static_cast<int32_t>(x % 50257) : 10 + static_cast<int32_t>((i + index) % 7);
    }
  }
};

}  // namespace

TEST_CASE("a loss spike is skipped by every rank together (dp, pp, tp)") {
  std::vector<std::vector<std::string>> layouts;
  if (world_size() == 2) layouts = {{}, {"--pipeline-model-parallel-size", "2"}, {"--zero-stage", "3"}};
  else layouts = {{"--tensor-model-parallel-size", "2", "--pipeline-model-parallel-size", "2"},
                  {"--pipeline-model-parallel-size", "2", "--zero-stage", "3"}};
  for (const auto& extra : layouts) {
    std::string what;
    for (const auto& e : extra) what += e + " ";
    CAPTURE(what);
    std::vector<std::string> f = {"--num-layers", "2", "--hidden-size", "32", "--num-attention-heads", "4",
                                  "--seq-length", "16", "--micro-batch-size", "2", "--global-batch-size", "8",
                                  "--train-iters", "12", "--lr", "3e-3", "--lr-decay-style", "constant",
                                  "--hidden-dropout", "0", "--data-path", "unused", "--log-interval", "4",
                                  "--eval-iters", "0", "--seed", "7", "--device", "cpu", "--skip-spike-zscore", "4",
                                  "--spike-window", "5"};
    f.insert(f.end(), extra.begin(), extra.end());
    TrainArgs a;
    a.world_size = world_size();
    std::vector<char*> argv{const_cast<char*>("pretrain_gpt")};
    for (auto& s : f) argv.push_back(s.data());
    REQUIRE(parse_train_args(static_cast<int>(argv.size()), argv.data(), a));
    a.model.vocab_size = 50257;
    a.model.padded_vocab_size = 50304;
    ParallelRuntime rt(MPI_COMM_WORLD, a);
    Trainer t(a, std::make_shared<SpikyData>(10), rt.context());
    const TrainSummary s = t.run();
    CHECK(s.iterations == 12);
    CHECK_MESSAGE(s.spike_skips == 1, "rank ", world_rank());
  }
}

TEST_CASE("NaN on one rank: every rank of every layout stops at iteration 1, nothing saved") {
  const fs::path dir = testing::shared_dir("robust_mp");
  const std::string data = testing::make_shared_dataset(dir, 3, 200);
  std::vector<std::vector<std::string>> layouts;
  if (world_size() == 2)
    layouts = {{}, {"--tensor-model-parallel-size", "2"}, {"--pipeline-model-parallel-size", "2"},
               {"--use-distributed-optimizer"}, {"--zero-stage", "3"}};
  else
    layouts = {{"--tensor-model-parallel-size", "2", "--pipeline-model-parallel-size", "2"},
               {"--pipeline-model-parallel-size", "2", "--use-distributed-optimizer"},
               {"--tensor-model-parallel-size", "2", "--use-distributed-optimizer"}};
  int k = 0;
  for (const auto& extra : layouts) {
    std::string what;
    for (const auto& e : extra) what += e + " ";
    CAPTURE(what);
    const fs::path save = dir / ("ckpt" + std::to_string(k++));
    auto f = flags(data, save.string());
    f.insert(f.end(), extra.begin(), extra.end());
    const std::string m = run_poisoned(f);
    CHECK_MESSAGE(m.find("iteration 1: the ") != std::string::npos, "rank ", world_rank(), ": ", m);
    CHECK_MESSAGE(m.find("not finite") != std::string::npos, "rank ", world_rank(), ": ", m);
    MPI_Barrier(MPI_COMM_WORLD);
    CHECK(!fs::exists(save / "latest_checkpointed_iteration.txt"));
  }
}
