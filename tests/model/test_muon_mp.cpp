// --optimizer muon / dist_muon (parallel/muon_rule.cpp) end to end with real MPI ranks: a GQA Llama
// (its fused qkv split into q, k, v for the orthogonalisation, SwiGLU, an untied head on AdamW) trains
// 10 steps on one process, then under DP2 (muon replicated; dist_muon: the states sharded by whole
// tensors), TP2 with --muon-tp-mode duplicated (each shard's whole gathered) and distributed (the Gram
// matrices summed over tp), PP2, and an MoE model at EP2; at np=4 TP2 x DP2 dist_muon, TP2 x PP2 and
// DP4 dist_muon. Losses and grad norms within 1e-5
// relative (f32, --muon-fp32-matmul-prec high). --muon-tp-mode blockwise orthogonalises each shard alone,
// which is another optimizer than the one-process run's: it must train and differ from duplicated.
// A dist_muon checkpoint resumes bitwise, and crosses to one process and back.
// mpitron-test: np=2,4
// mpitron-test: timeout=900
#include <doctest/doctest.h>
#include <mpi.h>

#include <cmath>
#include <filesystem>

#include "tests/model/mpi_test_util.h"
#include "tests/model/trainer_test_util.h"

using namespace mpitron;
using namespace mpitron::testing::trainer;
namespace fs = std::filesystem;
using testing::world_rank;
using testing::world_size;

namespace {

fs::path shared_dir() { return testing::shared_dir("muon"); }
std::string make_dataset(const fs::path& dir) { return testing::make_shared_dataset(dir, 13, 300); }

std::vector<std::string> muon_flags(const std::string& data, const char* optimizer = "muon") {
  return plus(llama_flags(data), {"--optimizer", optimizer, "--muon-fp32-matmul-prec", "high", "--muon-use-nesterov",
                                  "--weight-decay", "0.1", "--muon-scale-mode", "spectral",
                                  "--muon-extra-scale-factor", "0.2"});
}

std::vector<std::string> moe_flags(const std::string& data, const char* optimizer) {
  return plus(muon_flags(data, optimizer), {"--num-experts", "4", "--moe-router-topk", "2", "--moe-ffn-hidden-size",
                                            "24", "--moe-aux-loss-coeff", "0.01"});
}

}  // namespace

TEST_CASE("Muon and dist_muon train to the one-process losses under every layout") {
  const int world = world_size();
  const fs::path dir = shared_dir();
  const std::string data = make_dataset(dir);
  const Result single = single_process(muon_flags(data));
  REQUIRE(single.losses.size() == 10u);
  CHECK(single.losses.back() < single.losses.front());
  struct Layout {
    int ranks;
    const char* optimizer;
    std::vector<std::string> extra;
  };
  const std::vector<Layout> layouts = {
      {2, "muon", {}},  // replicated states, gradients all-reduced
      {2, "dist_muon", {}},  // ZeRO-1 by whole tensors
      {2, "dist_muon", {"--zero-stage", "2"}},
      {2, "muon", {"--tensor-model-parallel-size", "2", "--sequence-parallel", "--muon-tp-mode", "duplicated"}},
      {2, "muon", {"--tensor-model-parallel-size", "2", "--muon-tp-mode", "distributed"}},
      {2, "muon", {"--pipeline-model-parallel-size", "2"}},
      {2, "muon", {"--pipeline-model-parallel-size", "2", "--pipeline-schedule", "zb-h1"}},
      {4, "dist_muon", {}},
      {4, "dist_muon", {"--tensor-model-parallel-size", "2", "--muon-tp-mode", "duplicated"}},
      {4, "muon", {"--tensor-model-parallel-size", "2", "--pipeline-model-parallel-size", "2", "--muon-tp-mode",
                   "duplicated"}},
      {4, "dist_muon", {"--tensor-model-parallel-size", "2", "--muon-tp-mode", "distributed"}},
  };
  int ran = 0;
  for (const Layout& l : layouts) {
    if (l.ranks != world) continue;
    std::string what = l.optimizer;
    for (const std::string& e : l.extra) what += " " + e;
    check_close(run(plus(muon_flags(data, l.optimizer), l.extra), MPI_COMM_WORLD), single, 1e-5, what);
    ++ran;
  }
  if (world == 2) {
    // Blockwise: each TP shard orthogonalised alone (scaled by its own shape) — it trains, and it is not
    // the whole matrix's update.
    const Result block = run(plus(muon_flags(data), {"--tensor-model-parallel-size", "2", "--muon-tp-mode", "blockwise"}),
                             MPI_COMM_WORLD);
    CHECK(block.losses.back() < block.losses.front());
    CHECK(std::abs(block.losses.back() - single.losses.back()) > 1e-5 * std::abs(single.losses.back()));
    // Expert parallelism: each expert's weights its own matrices, on the rank that holds the expert.
    const Result moe = single_process(moe_flags(data, "muon"));
    check_close(run(plus(moe_flags(data, "muon"), {"--expert-model-parallel-size", "2"}), MPI_COMM_WORLD), moe, 1e-5,
                "muon EP2");
    check_close(run(plus(moe_flags(data, "dist_muon"), {"--expert-model-parallel-size", "2"}), MPI_COMM_WORLD), moe,
                1e-5, "dist_muon EP2");
    ++ran;
  }
  CHECK(ran > 0);
  MPI_Barrier(MPI_COMM_WORLD);
  if (world_rank() == 0) fs::remove_all(dir);
}

TEST_CASE("A dist_muon checkpoint resumes bitwise and crosses to one process and back") {
  const int world = world_size();
  const fs::path dir = shared_dir();
  const std::string data = make_dataset(dir);
  const std::vector<std::string> f = muon_flags(data, "dist_muon");
  const Result whole = run(f, MPI_COMM_WORLD);
  const std::string ck = (dir / "ck_dist").string();
  run(plus(f, {"--save", ck, "--exit-interval", "5"}), MPI_COMM_WORLD);
  const Result resumed = run(plus(f, {"--load", ck}), MPI_COMM_WORLD);
  REQUIRE(resumed.losses.size() == 5);
  for (size_t i = 0; i < 5; ++i) {
    CHECK_MESSAGE(resumed.losses[i] == whole.losses[i + 5], "step ", i + 6, ": ", resumed.losses[i], " vs ",
                  whole.losses[i + 5]);
    CHECK(resumed.grad_norms[i] == whole.grad_norms[i + 5]);
  }
  const std::vector<double> second(whole.losses.begin() + 5, whole.losses.end());
  // On one process (every rank alone: muon's replicated states from the sharded checkpoint) ...
  check_part(run(plus(muon_flags(data), {"--load", ck}), MPI_COMM_SELF).losses, second,
             str("dist_muon DP", world, " -> one process"));
  MPI_Barrier(MPI_COMM_WORLD);
  // ... and a one-process muon checkpoint resumed by dist_muon on every rank.
  const std::string ck1 = (dir / "ck_one").string();
  if (world_rank() == 0) run(plus(muon_flags(data), {"--save", ck1, "--exit-interval", "5"}), MPI_COMM_SELF);
  else MPI_Barrier(MPI_COMM_WORLD);
  check_part(run(plus(f, {"--load", ck1}), MPI_COMM_WORLD).losses, second, str("one process -> dist_muon DP", world));
  // An AdamW run cannot take Muon's states: refused naming the optimizers, unless --no-load-optim.
  CHECK_THROWS_WITH_AS(run(plus(testing::trainer::llama_flags(data), {"--load", ck}), MPI_COMM_WORLD),
                       doctest::Contains("muon"), Error);
  MPI_Barrier(MPI_COMM_WORLD);
  if (world_rank() == 0) fs::remove_all(dir);
}

TEST_CASE("Muon flags: what Megatron refuses or mpitron has not built is refused by name") {
  if (world_size() != 2) return;
  const fs::path dir = shared_dir();
  const std::string data = make_dataset(dir);
  auto parse = [&](const std::vector<std::string>& extra) {
    std::vector<std::string> f = plus(testing::trainer::flags(data), extra);
    TrainArgs a;
    a.world_size = 2;
    std::vector<char*> argv{const_cast<char*>("pretrain_gpt")};
    for (auto& s : f) argv.push_back(s.data());
    parse_train_args(static_cast<int>(argv.size()), argv.data(), a);
    return a;
  };
  CHECK(parse({"--optimizer", "dist_muon"}).zero_stage == 1);  // ZeRO-1 by whole tensors
  CHECK(parse({"--optimizer", "muon", "--muon-nesterov"}).optim.muon_nesterov);
  CHECK_FALSE(parse({"--optimizer", "muon", "--muon-no-split-qkv"}).optim.muon_split_qkv);
  for (const auto& [extra, needle] : std::vector<std::pair<std::vector<std::string>, std::string>>{
           {{"--optimizer", "muon", "--use-distributed-optimizer"}, "dist_muon"},
           {{"--optimizer", "dist_muon", "--zero-stage", "3"}, "--zero-stage 3"},
           {{"--optimizer", "muon", "--fp16"}, "--fp16"},
           {{"--muon-momentum", "0.9"}, "--muon-momentum"},
           {{"--optimizer", "muon", "--muon-tp-mode", "ring"}, "--muon-tp-mode ring"},
           {{"--optimizer", "muon", "--muon-scalar-optimizer", "lion"}, "--muon-scalar-optimizer lion"},
           {{"--optimizer", "muon", "--muon-coefficient-type", "aol"}, "--muon-coefficient-type aol"},
           {{"--optimizer", "muon", "--muon-scale-mode", "rms"}, "--muon-scale-mode rms"},
           {{"--optimizer", "muon", "--muon-num-ns-steps", "0"}, "--muon-num-ns-steps"},
           {{"--optimizer", "muon", "--muon-momentum", "1"}, "--muon-momentum"},
           {{"--optimizer", "lion"}, "--optimizer lion"},
           {{"--optimizer", "soap"}, "--optimizer soap"},
           {{"--optimizer", "adaptive_muon"}, "--optimizer adaptive_muon"}}) {
    CAPTURE(needle);
    CHECK_THROWS_WITH_AS(parse(extra), doctest::Contains(needle.c_str()), Error);
  }
  MPI_Barrier(MPI_COMM_WORLD);
  if (world_rank() == 0) fs::remove_all(dir);
}
