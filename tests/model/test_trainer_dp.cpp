// Data parallelism end to end with real MPI ranks: plain DP, ZeRO-1 and ZeRO-2
// give the single-process losses, and checkpoints saved under one layout resume
// under another (DP=2 ZeRO-1 → one process, one process → DP=2 ZeRO-2).
// mpitron-test: np=2
// mpitron-test: timeout=400
#include <doctest/doctest.h>
#include <mpi.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <random>

#include "data/indexed_dataset.h"
#include "model/training/arguments.h"
#include "model/training/gpt_data.h"
#include "model/training/trainer.h"
#include "tests/model/trainer_test_util.h"
#include "tests/model/mpi_test_util.h"
#include "parallel/communicator.h"

using namespace mpitron;
namespace fs = std::filesystem;

namespace {

using testing::world_rank;
using testing::world_size;

fs::path shared_dir() { return testing::shared_dir("dp"); }

std::string make_dataset(const fs::path& dir) { return testing::make_shared_dataset(dir, 11, 300); }

std::vector<std::string> flags(const std::string& data, int iters) {
  return {"--num-layers", "2", "--hidden-size", "32", "--num-attention-heads", "2", "--seq-length", "16",
          "--micro-batch-size", "2", "--global-batch-size", "8", "--train-iters", std::to_string(iters),
          "--lr", "3e-3", "--lr-warmup-iters", "2", "--lr-decay-style", "cosine", "--hidden-dropout", "0",
          "--data-path", data, "--split", "90,10,0", "--log-interval", "1", "--eval-interval", "4",
          "--eval-iters", "1", "--seed", "5", "--device", "cpu", "--ddp-bucket-size", "3000"};
}

// Runs the trainer on `dp` ranks of the world (1: every rank alone, no communication).
std::vector<double> run(std::vector<std::string> f, int dp) {
  TrainArgs a;
  a.data_parallel_size = dp;
  testing::trainer::parse_test_flags(std::move(f), a);
  const std::shared_ptr<SampleSource> data = testing::trainer::test_gpt_data(a);
  ParallelContext par;
  std::unique_ptr<Communicator> comm;
  if (dp > 1) {
    comm = make_communicator(MPI_COMM_WORLD, Device::cpu(), CommOptions{});
    par.dp_comm = MPI_COMM_WORLD;
    par.dp = comm.get();
    par.dp_rank = world_rank();
    par.dp_size = world_size();
  }
  Trainer t(a, data, par);
  return t.run().losses;
}

void check_close(const std::vector<double>& got, const std::vector<double>& want, double rel, const char* what) {
  REQUIRE(got.size() == want.size());
  for (size_t i = 0; i < got.size(); ++i)
    CHECK_MESSAGE(std::abs(got[i] - want[i]) <= rel * std::abs(want[i]), what, " iteration ", i + 1, ": ", got[i],
                  " vs ", want[i]);
}

}  // namespace

TEST_CASE("DP, ZeRO-1 and ZeRO-2 over 2 ranks give the single-process losses; checkpoints cross layouts") {
  REQUIRE(world_size() == 2);
  const fs::path dir = shared_dir();
  const std::string data = make_dataset(dir);
  const std::vector<double> single = run(flags(data, 10), 1);
  REQUIRE(single.size() == 10);
  CHECK(single.back() < single.front());

  check_close(run(flags(data, 10), 2), single, 1e-5, "plain DP");
  auto z1 = flags(data, 10);
  z1.push_back("--use-distributed-optimizer");
  check_close(run(z1, 2), single, 1e-5, "ZeRO-1");
  auto z2 = flags(data, 10);
  z2.insert(z2.end(), {"--zero-stage", "2"});
  check_close(run(z2, 2), single, 1e-5, "ZeRO-2");

  // Save at DP=2 with ZeRO-1 after 5 steps; resume on one process.
  const std::string ck1 = (dir / "ck_zero1").string();
  auto save1 = z1;
  save1.insert(save1.end(), {"--save", ck1, "--exit-interval", "5"});
  check_close(run(save1, 2), std::vector<double>(single.begin(), single.begin() + 5), 1e-5, "ZeRO-1 first half");
  if (world_rank() == 0) {
    auto load1 = flags(data, 10);
    load1.insert(load1.end(), {"--load", ck1});
    check_close(run(load1, 1), std::vector<double>(single.begin() + 5, single.end()), 1e-5, "resumed on 1 process");
  } else {
    // Rank 1 mirrors rank 0's index-cache barrier inside run().
    auto load1 = flags(data, 10);
    load1.insert(load1.end(), {"--load", ck1});
    run(load1, 1);
  }

  // Save on one process (rank 0 writes; both ranks run identical single-process
  // trainers into separate directories), resume on 2 ranks with ZeRO-2.
  const std::string ck2 = (dir / ("ck_single_" + std::to_string(world_rank()))).string();
  auto save2 = flags(data, 10);
  save2.insert(save2.end(), {"--save", ck2, "--exit-interval", "5"});
  run(save2, 1);
  MPI_Barrier(MPI_COMM_WORLD);
  auto load2 = z2;
  load2.insert(load2.end(), {"--load", (dir / "ck_single_0").string()});
  check_close(run(load2, 2), std::vector<double>(single.begin() + 5, single.end()), 1e-5, "resumed at DP=2 ZeRO-2");
  MPI_Barrier(MPI_COMM_WORLD);
  if (world_rank() == 0) fs::remove_all(dir);
}
