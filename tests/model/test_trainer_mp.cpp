// Tensor, sequence, pipeline and data parallelism end to end with real MPI
// ranks: every layout that fits the world size trains a small GPT (hidden and
// attention dropout 0.1, Megatron's defaults) for 10 steps and must give the single-process losses and grad norms
// within 1e-5 relative (fp32); parameters replicated across tensor-parallel
// ranks must stay bitwise identical. Checkpoints cross layouts (np=4).
// mpitron-test: np=2,4,8
// mpitron-test: timeout=900
// mpitron-test: long_np=4,8
#include <sstream>
#include <algorithm>
#include <doctest/doctest.h>
#include <mpi.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "model/training/arguments.h"
#include "model/training/gpt_data.h"
#include "model/training/parallel_runtime.h"
#include "model/training/trainer.h"
#include "tests/model/mpi_test_util.h"
#include "tests/model/trainer_test_util.h"

using namespace mpitron;
namespace fs = std::filesystem;

namespace {

using testing::world_rank;
using testing::world_size;
using namespace testing::trainer;

fs::path shared_dir() { return testing::shared_dir("mp"); }

std::string make_dataset(const fs::path& dir) { return testing::make_shared_dataset(dir, 13, 300); }

}  // namespace

TEST_CASE("every parallel layout of the world gives the single-process losses and grad norms") {
  const int world = world_size();
  const fs::path dir = shared_dir();
  const std::string data = make_dataset(dir);
  const Result single = single_process(flags(data));
  REQUIRE(single.losses.size() == 10);
  CHECK(single.losses.back() < single.losses.front());

  struct Layout {
    int ranks;
    std::vector<std::string> extra;
  };
  const std::vector<Layout> layouts = {
      {2, {"--tensor-model-parallel-size", "2"}},
      {2, {"--tensor-model-parallel-size", "2", "--sequence-parallel"}},
      {2, {"--pipeline-model-parallel-size", "2", "--pipeline-schedule", "gpipe"}},
      {2, {"--pipeline-model-parallel-size", "2"}},  // 1F1B
      {2, {"--pipeline-model-parallel-size", "2", "--num-layers-per-virtual-pipeline-stage", "1"}},
      {2, {"--tensor-model-parallel-size", "2", "--sequence-parallel", "--recompute-activations"}},
      {4, {"--tensor-model-parallel-size", "2", "--pipeline-model-parallel-size", "2"}},
      {4, {"--tensor-model-parallel-size", "2", "--sequence-parallel", "--use-distributed-optimizer"}},  // TP2 x DP2
      {4, {"--tensor-model-parallel-size", "2", "--sequence-parallel"}},  // TP2 x DP2, buckets overlapped with backward
      {4, {"--pipeline-model-parallel-size", "4"}},
      {4, {"--pipeline-model-parallel-size", "2", "--use-distributed-optimizer", "--overlap-param-gather"}},  // PP2 x DP2, ZeRO-1
      {4, {"--tensor-model-parallel-size", "2", "--sequence-parallel", "--pipeline-model-parallel-size", "2",
           "--num-layers-per-virtual-pipeline-stage", "1"}},
      {4, {"--tensor-model-parallel-size", "2", "--pipeline-model-parallel-size", "2", "--recompute-activations"}},
      // Zero-bubble schedules: backward split into B and W (docs/pipeline-schedules.md).
      {2, {"--pipeline-model-parallel-size", "2", "--pipeline-schedule", "zb-h1"}},
      {2, {"--pipeline-model-parallel-size", "2", "--pipeline-schedule", "zbv", "--num-layers-per-virtual-pipeline-stage",
           "1"}},  // V placement: rank 0 holds stages 0 and 3
      {4, {"--tensor-model-parallel-size", "2", "--pipeline-model-parallel-size", "2", "--pipeline-schedule", "zb-h1",
           "--sequence-parallel"}},
      {4, {"--tensor-model-parallel-size", "2", "--pipeline-model-parallel-size", "2", "--pipeline-schedule", "zbv",
           "--num-layers-per-virtual-pipeline-stage", "1", "--recompute-activations"}},
      {4, {"--pipeline-model-parallel-size", "4", "--pipeline-schedule", "zb-h1"}},
      {4, {"--pipeline-model-parallel-size", "2", "--pipeline-schedule", "zb-h1", "--use-distributed-optimizer"}},
      // DP with ZeRO-2, the reduce-scatter during backward and the parameter all-gather during the next forward.
      {2, {"--use-distributed-optimizer", "--zero-stage", "2", "--overlap-param-gather"}},
      {4, {"--tensor-model-parallel-size", "2", "--sequence-parallel", "--use-distributed-optimizer", "--zero-stage",
           "2", "--overlap-param-gather"}},  // TP2 x DP2, ZeRO-2
      {8, {"--tensor-model-parallel-size", "2", "--pipeline-model-parallel-size", "2"}},  // TP2 x PP2 x DP2
      {8, {"--tensor-model-parallel-size", "2", "--sequence-parallel", "--pipeline-model-parallel-size", "2",
           "--use-distributed-optimizer"}},
  };
  // MPITRON_TEST_LAYOUTS=i,j,… runs only those layouts of this world size (0-based,
  // in the order above) and not the schedule-file checks: the simulated device's
  // quick set (tests/cuda_sim/run.sh). MPITRON_TEST_LAYOUTS_NP<world> overrides it
  // for one world size.
  std::vector<int> only;
  const char* e = std::getenv(("MPITRON_TEST_LAYOUTS_NP" + std::to_string(world)).c_str());
  if (!e || !*e) e = std::getenv("MPITRON_TEST_LAYOUTS");
  if (e && *e) {
    std::stringstream ss(e);
    for (std::string tok; std::getline(ss, tok, ',');) only.push_back(std::stoi(tok));
  }
  int ran = 0, index = -1;
  for (const Layout& l : layouts) {
    if (l.ranks != world) continue;
    ++index;
    if (!only.empty() && std::find(only.begin(), only.end(), index) == only.end()) continue;
    std::vector<std::string> f = flags(data);
    f.insert(f.end(), l.extra.begin(), l.extra.end());
    std::string what;
    for (const std::string& e : l.extra) what += e + " ";
    check_close(run(f, MPI_COMM_WORLD), single, 1e-5, what);
    ++ran;
  }
  if (world == 2 && only.empty()) {
    // A user's schedule file (`p2p auto`: only F and B written): 1F1B with one
    // more warm-up forward on each rank than the built-in, which no built-in makes.
    const std::string path = (dir / "my_schedule.txt").string();
    if (world_rank() == 0) {
      std::ofstream f(path);
      f << "# test: deeper warm-up than 1F1B\npp 2\nmicro-batches 8\n"
        << "rank 0: F0 F1 F2 B0 F3 B1 F4 B2 F5 B3 F6 B4 F7 B5 B6 B7\n"
        << "rank 1: F0 F1 B0 F2 B1 F3 B2 F4 B3 F5 B4 F6 B5 F7 B6 B7\n";
    }
    MPI_Barrier(MPI_COMM_WORLD);
    std::vector<std::string> f = flags(data);
    f.insert(f.end(), {"--pipeline-model-parallel-size", "2", "--pipeline-schedule", path});
    check_close(run(f, MPI_COMM_WORLD), single, 1e-5, "--pipeline-schedule FILE");
    ++ran;
    // A schedule that deadlocks (rank 1 sends its first gradient while rank 0
    // is still sending activations) is rejected on every rank before any step.
    const std::string bad = (dir / "deadlock.txt").string();
    if (world_rank() == 0) {
      std::ofstream b(bad);
      b << "pp 2\nmicro-batches 8\nrank 0: F0 F1 F2 F3 F4 F5 F6 F7 B0 B1 B2 B3 B4 B5 B6 B7\n"
        << "rank 1: F0 B0 F1 B1 F2 B2 F3 B3 F4 B4 F5 B5 F6 B6 F7 B7\n";
    }
    MPI_Barrier(MPI_COMM_WORLD);
    std::vector<std::string> fb = flags(data);
    fb.insert(fb.end(), {"--pipeline-model-parallel-size", "2", "--pipeline-schedule", bad});
    CHECK_THROWS_WITH_AS(run(fb, MPI_COMM_WORLD), doctest::Contains("deadlock"), Error);
  }
  if (world == 4 && only.empty()) {  // zbv at PP4 needs 8 stages: an 8-layer model
    const auto eight = [&] {
      std::vector<std::string> f = flags(data);
      f[static_cast<size_t>(std::find(f.begin(), f.end(), std::string("--num-layers")) - f.begin()) + 1] = "8";
      return f;
    };
    const Result single8 = single_process(eight());
    check_close(run(with(eight(), {"--pipeline-model-parallel-size", "4", "--pipeline-schedule", "zbv",
                                   "--num-layers-per-virtual-pipeline-stage", "1"}),
                    MPI_COMM_WORLD),
                single8, 1e-5, "PP4 zbv");
    ++ran;
  }
  if (world > 1) CHECK(ran > 0);
  MPI_Barrier(MPI_COMM_WORLD);
  if (world_rank() == 0) fs::remove_all(dir);
}

TEST_CASE("a GQA Llama gives the single-process losses under every kind of layout") {
  const int world = world_size();
  if (world == 8) return;  // the GPT layouts above cover the 8-rank grids
  // The simulated device's quick set (MPITRON_TEST_LAYOUTS) runs GPT layouts only;
  // the Llama block runs there in model_test_trainer's bf16 resume.
  if (const char* e = std::getenv("MPITRON_TEST_LAYOUTS"); e && *e) return;
  const fs::path dir = shared_dir();
  const std::string data = make_dataset(dir);
  const Result single = single_process(llama_flags(data));
  REQUIRE(single.losses.size() == 10);
  CHECK(single.losses.back() < single.losses.front());
  struct Layout {
    int ranks;
    std::vector<std::string> extra;
  };
  const std::vector<Layout> layouts = {
      {2, {"--tensor-model-parallel-size", "2", "--sequence-parallel"}},  // one kv group per TP rank
      {2, {"--pipeline-model-parallel-size", "2", "--num-layers-per-virtual-pipeline-stage", "1"}},
      {2, {"--use-distributed-optimizer", "--zero-stage", "2"}},  // DP2 + ZeRO-2
      {4, {"--tensor-model-parallel-size", "2", "--pipeline-model-parallel-size", "2"}},
      {4, {"--tensor-model-parallel-size", "2", "--sequence-parallel", "--use-distributed-optimizer",
           "--recompute-activations"}},  // TP2 x DP2, ZeRO-1
      {4, {"--pipeline-model-parallel-size", "2", "--use-distributed-optimizer"}},  // PP2 x DP2: untied head on stage 1
      {2, {"--pipeline-model-parallel-size", "2", "--pipeline-schedule", "zbv", "--num-layers-per-virtual-pipeline-stage",
           "1"}},  // split backward of the Llama block, V placement with an untied head
      {4, {"--tensor-model-parallel-size", "2", "--sequence-parallel", "--pipeline-model-parallel-size", "2",
           "--pipeline-schedule", "zb-h1"}},
  };
  int ran = 0;
  for (const Layout& l : layouts) {
    if (l.ranks != world) continue;
    std::vector<std::string> f = llama_flags(data);
    f.insert(f.end(), l.extra.begin(), l.extra.end());
    std::string what = "llama ";
    for (const std::string& e : l.extra) what += e + " ";
    check_close(run(f, MPI_COMM_WORLD), single, 1e-5, what);
    ++ran;
  }
  if (world > 1) CHECK(ran > 0);
  MPI_Barrier(MPI_COMM_WORLD);
  if (world_rank() == 0) fs::remove_all(dir);
}

// A GQA Llama checkpoint saved at TP2 x PP2 (qkv split in uneven Q | K | V parts,
// gate | up halves, an untied head on the last stage) resumes on one process and
// at TP2 x DP2 with ZeRO-1, continuing the single-process losses.
TEST_CASE("a Llama checkpoint reshards across layouts") {
  if (world_size() != 4) return;
  if (const char* e = std::getenv("MPITRON_TEST_LAYOUTS"); e && *e) return;
  const fs::path dir = shared_dir();
  const std::string data = make_dataset(dir);
  const Result single = run(llama_flags(data), MPI_COMM_SELF);
  const std::vector<double> second(single.losses.begin() + 5, single.losses.end());
  const std::string ck = (dir / "llama_tp2pp2").string();
  run(with(llama_flags(data), {"--tensor-model-parallel-size", "2", "--pipeline-model-parallel-size", "2", "--save",
                               ck.c_str(), "--exit-interval", "5"}),
      MPI_COMM_WORLD);
  MPI_Barrier(MPI_COMM_WORLD);
  check_part(run(with(llama_flags(data), {"--load", ck.c_str()}), MPI_COMM_SELF).losses, second,
             "llama TP2xPP2 -> one process");
  MPI_Barrier(MPI_COMM_WORLD);
  check_part(run(with(llama_flags(data), {"--tensor-model-parallel-size", "2", "--use-distributed-optimizer", "--load",
                                          ck.c_str()}),
                 MPI_COMM_WORLD)
                 .losses,
             second, "llama TP2xPP2 -> TP2xDP2 ZeRO-1");
  MPI_Barrier(MPI_COMM_WORLD);
  if (world_rank() == 0) fs::remove_all(dir);
}

// Checkpoints hold every tensor once in its global shape, so one saved under
// any layout resumes under any other and continues with the losses of the
// uninterrupted single-process run.
TEST_CASE("checkpoints saved under one layout resume under another") {
  if (world_size() != 4) return;
  // Not in the simulated device's quick set (MPITRON_TEST_LAYOUTS, as the Llama
  // checkpoint above): nine trainings, four of them on every rank at once, cost
  // ~450 s of the 4-rank run there; bitwise resume on the device is
  // model_test_trainer's.
  if (const char* e = std::getenv("MPITRON_TEST_LAYOUTS"); e && *e) return;
  const fs::path dir = shared_dir();
  const std::string data = make_dataset(dir);
  const Result single = run(flags(data), MPI_COMM_SELF);
  const std::vector<double> first(single.losses.begin(), single.losses.begin() + 5);
  const std::vector<double> second(single.losses.begin() + 5, single.losses.end());
  const std::vector<std::string> tp2pp2 = {"--tensor-model-parallel-size", "2", "--pipeline-model-parallel-size", "2"};
  const std::vector<std::string> pp2dp2z1 = {"--pipeline-model-parallel-size", "2", "--use-distributed-optimizer"};
  auto layout = [&](const std::vector<std::string>& extra, std::initializer_list<std::string> more) {
    std::vector<std::string> f = flags(data);
    f.insert(f.end(), extra.begin(), extra.end());
    f.insert(f.end(), more.begin(), more.end());
    return f;
  };
  // Save at TP=2 x PP=2 after 5 steps.
  const std::string ck = (dir / "ck_tp2pp2").string();
  check_part(run(layout(tp2pp2, {"--save", ck, "--exit-interval", "5"}), MPI_COMM_WORLD).losses, first,
             "TP2xPP2 before saving");
  // h5py: the file 4 ranks wrote (each its hyperslabs) holds every tensor, with
  // valid checksums, equal to what one process saves after the same 5 steps.
  const std::string ck_single = (dir / ("ck_single_" + std::to_string(world_rank()))).string();
  run(layout({}, {"--save", ck_single, "--exit-interval", "5"}), MPI_COMM_SELF);
  if (world_rank() == 0) {
    const std::string cmd = str("/usr/bin/python3 ", MPITRON_SOURCE_DIR, "/tests/model/ckpt_compare.py ", ck,
                                "/iter_0000005/model_optim_rng.h5 ", ck_single, "/iter_0000005/model_optim_rng.h5 2>&1");
    const int rc = std::system(cmd.c_str());
    const int code = WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
    if (code == 77) MESSAGE("SKIPPED: ckpt_compare.py: h5py is not importable by /usr/bin/python3");
    else CHECK_MESSAGE(code == 0, "ckpt_compare.py failed: ", cmd);
  }
  MPI_Barrier(MPI_COMM_WORLD);
  // ... resume on one process (every rank alone, reading the same files) ...
  check_part(run(layout({}, {"--load", ck}), MPI_COMM_SELF).losses, second, "TP2xPP2 -> one process");
  MPI_Barrier(MPI_COMM_WORLD);
  // ... at PP=4 ...
  check_part(run(layout({"--pipeline-model-parallel-size", "4"}, {"--load", ck}), MPI_COMM_WORLD).losses, second,
             "TP2xPP2 -> PP4");
  // ... and at PP=2 x DP=2 with ZeRO-1 (optimizer state sharded differently again).
  check_part(run(layout(pp2dp2z1, {"--load", ck}), MPI_COMM_WORLD).losses, second, "TP2xPP2 -> PP2xDP2 ZeRO-1");
  // And back: save at PP=2 x DP=2 ZeRO-1, resume at TP=2 x PP=2 with sequence parallelism.
  const std::string ck2 = (dir / "ck_pp2dp2").string();
  check_part(run(layout(pp2dp2z1, {"--save", ck2, "--exit-interval", "5"}), MPI_COMM_WORLD).losses, first,
             "PP2xDP2 ZeRO-1 before saving");
  check_part(run(layout(tp2pp2, {"--sequence-parallel", "--load", ck2}), MPI_COMM_WORLD).losses, second,
             "PP2xDP2 ZeRO-1 -> TP2xPP2 SP");
  MPI_Barrier(MPI_COMM_WORLD);
  if (world_rank() == 0) fs::remove_all(dir);
}

TEST_CASE("impossible layouts are rejected naming the flags") {
  const std::string data = "/nonexistent/prefix";
  auto parse = [&](std::vector<std::string> f, int world) {
    TrainArgs a;
    a.world_size = world;
    std::vector<char*> argv{const_cast<char*>("pretrain_gpt")};
    for (auto& s : f) argv.push_back(s.data());
    parse_train_args(static_cast<int>(argv.size()), argv.data(), a);
  };
  CHECK_THROWS_WITH_AS(parse(with(flags(data), {"--tensor-model-parallel-size", "2",
                                                "--pipeline-model-parallel-size", "2"}), 6),
                       doctest::Contains("world size 6 is not divisible"), Error);
  CHECK_THROWS_WITH_AS(parse(with(flags(data), {"--tensor-model-parallel-size", "3"}), 3),
                       doctest::Contains("--num-attention-heads 4 is not divisible"), Error);
  {  // as Megatron: --sequence-parallel at TP=1 warns and turns itself off
    TrainArgs a;
    a.world_size = 1;
    auto f = with(flags(data), {"--sequence-parallel"});
    std::vector<char*> argv{const_cast<char*>("pretrain_gpt")};
    for (auto& s : f) argv.push_back(s.data());
    parse_train_args(static_cast<int>(argv.size()), argv.data(), a);
    CHECK_FALSE(a.sequence_parallel);
    REQUIRE(a.startup_notes.size() == 1);
    CHECK(a.startup_notes[0].find("--sequence-parallel: turned off") != std::string::npos);
  }
  CHECK_THROWS_WITH_AS(parse(with(flags(data), {"--pipeline-model-parallel-size", "3"}), 3),
                       doctest::Contains("--num-layers 4 is not divisible by --pipeline-model-parallel-size 3"), Error);
  CHECK_THROWS_WITH_AS(parse(with(flags(data), {"--pipeline-model-parallel-size", "2", "--zero-stage", "2"}), 2),
                       doctest::Contains("--zero-stage 2"), Error);
  CHECK_THROWS_WITH_AS(parse(with(flags(data), {"--pipeline-model-parallel-size", "2", "--pipeline-schedule", "1f1b",
                                                "--num-layers-per-virtual-pipeline-stage", "1"}), 2),
                       doctest::Contains("1f1b has one model chunk per rank"), Error);
  CHECK_THROWS_WITH_AS(parse(with(flags(data), {"--pipeline-model-parallel-size", "2", "--pipeline-schedule", "gpipe",
                                                "--num-layers-per-virtual-pipeline-stage", "1"}), 2),
                       doctest::Contains("gpipe has one model chunk per rank"), Error);
  CHECK_THROWS_WITH_AS(parse(with(flags(data), {"--pipeline-model-parallel-size", "2"}), 1),
                       doctest::Contains("world size 1 is not divisible"), Error);
  CHECK_THROWS_WITH_AS(parse(with(flags(data), {"--overlap-grad-reduce", "--no-overlap-grad-reduce"}), 1),
                       doctest::Contains("both given"), Error);
  CHECK_NOTHROW(parse(with(flags(data), {"--overlap-grad-reduce"}), 1));
  CHECK_THROWS_WITH_AS(parse(with(flags(data), {"--overlap-param-gather"}), 2),
                       doctest::Contains("--overlap-param-gather overlaps the distributed optimizer"), Error);
  CHECK_NOTHROW(parse(with(flags(data), {"--overlap-param-gather", "--use-distributed-optimizer"}), 2));
  // Llama: TP must divide the kv groups; groups must divide the heads; rope flags need rope.
  CHECK_THROWS_WITH_AS(parse(with(llama_flags(data), {"--tensor-model-parallel-size", "4"}), 4),
                       doctest::Contains("--num-query-groups 2 is not divisible by --tensor-model-parallel-size 4"),
                       Error);
  CHECK_THROWS_WITH_AS(parse(with(flags(data), {"--group-query-attention", "--num-query-groups", "3"}), 1),
                       doctest::Contains("--num-query-groups 3 must divide --num-attention-heads 4"), Error);
  CHECK_THROWS_WITH_AS(parse(with(flags(data), {"--num-query-groups", "2"}), 1),
                       doctest::Contains("without --group-query-attention"), Error);
  CHECK_THROWS_WITH_AS(parse(with(flags(data), {"--rotary-base", "500000"}), 1),
                       doctest::Contains("--rotary-base applies to rotary positions"), Error);
  CHECK_THROWS_WITH_AS(parse(with(flags(data), {"--use-rotary-position-embeddings", "--position-embedding-type",
                                                "learned_absolute"}), 1),
                       doctest::Contains("--use-rotary-position-embeddings with --position-embedding-type"), Error);
  CHECK_THROWS_WITH_AS(parse(with(flags(data), {"--normalization", "BatchNorm"}), 1),
                       doctest::Contains("--normalization BatchNorm is not known"), Error);
  CHECK_THROWS_WITH_AS(parse(with(llama_flags(data), {"--rotary-percent", "0.1"}), 1),
                       doctest::Contains("--rotary-percent"), Error);
  CHECK_THROWS_WITH_AS(parse(with(flags(data), {"--num-layers-per-virtual-pipeline-stage", "1"}), 1),
                       doctest::Contains("needs --pipeline-model-parallel-size > 1"), Error);
}
