// Mixture of Experts (model/layers/moe_layer.h) under every parallel layout, with real MPI
// ranks: a 4-layer GPT whose layers 0 and 1 are MoE (--moe-layer-freq [1,1,0,0]: with
// PP2 the second stage has no MoE layer) with 4 experts, top-2, the load-balancing and z
// losses on, must train to the single-process losses, grad norms and load-balancing losses
// within 1e-5 relative (f32) under TP (+SP), PP (1F1B, zb-h1's split backward), DP with
// ZeRO-1/2/3, recompute and their products; capacity dropping (both policies) and a
// Qwen2-MoE-like layer (SwiGLU experts, pre-softmax router, gated shared expert) too.
// Each layer's aux-loss gradient reaches the router at the loss's scale: it is in the grad
// norms compared here. Expert parallelism (EP2, EP2×TP2, EP2×PP2 with a stage without MoE,
// EP2×DP2 with ZeRO-1/2/3, both dispatchers) trains to the same losses, and its checkpoints
// reshard across EP sizes (the experts are per-expert rows in the checkpoint).
// mpitron-test: np=2,4
// mpitron-test: timeout=900
// mpitron-test: long_np=4
#include <doctest/doctest.h>
#include <mpi.h>

#include <cmath>
#include <filesystem>

#include "io/checkpoint.h"
#include "tests/model/mpi_test_util.h"
#include "tests/model/trainer_test_util.h"

using namespace mpitron;
using namespace mpitron::testing::trainer;
namespace fs = std::filesystem;
using testing::world_rank;
using testing::world_size;

namespace {

const std::vector<std::string> kMoe = {"--num-experts", "4", "--moe-router-topk", "2", "--moe-ffn-hidden-size", "48",
                                       "--moe-layer-freq", "[1,1,0,0]", "--moe-aux-loss-coeff", "0.01",
                                       "--moe-z-loss-coeff", "0.001"};

}  // namespace

TEST_CASE("MoE trains to the single-process losses under every layout") {
  const int world = world_size();
  const fs::path dir = testing::shared_dir("moe");
  const std::string data = testing::make_shared_dataset(dir, 13, 300);
  const std::vector<std::string> base = plus(flags(data), kMoe);
  const Result single = single_process(base);
  REQUIRE(single.losses.size() == 10);
  REQUIRE(single.aux_losses.size() == 10);
  CHECK(single.losses.back() < single.losses.front());
  for (const double a : single.aux_losses) CHECK(a > 0);
  struct Layout {
    int ranks;
    std::vector<std::string> extra;
  };
  const std::vector<Layout> layouts = {
      {2, {"--tensor-model-parallel-size", "2"}},
      {2, {"--tensor-model-parallel-size", "2", "--sequence-parallel", "--recompute-activations"}},
      {2, {"--pipeline-model-parallel-size", "2"}},  // stage 1 holds no MoE layer
      {2, {"--pipeline-model-parallel-size", "2", "--pipeline-schedule", "zb-h1"}},
      {2, {"--use-distributed-optimizer"}},
      {2, {"--use-distributed-optimizer", "--zero-stage", "2", "--overlap-param-gather"}},
      {2, {"--zero-stage", "3"}},
      {4, {"--tensor-model-parallel-size", "2", "--sequence-parallel", "--use-distributed-optimizer"}},
      {4, {"--tensor-model-parallel-size", "2", "--pipeline-model-parallel-size", "2", "--pipeline-schedule", "zb-h1"}},
      {4, {"--pipeline-model-parallel-size", "2", "--zero-stage", "3"}},
      // Expert parallelism: the experts split over the data-parallel ranks.
      {2, {"--expert-model-parallel-size", "2"}},
      {2, {"--expert-model-parallel-size", "2", "--moe-token-dispatcher-type", "alltoall", "--use-distributed-optimizer"}},
      {4, {"--expert-model-parallel-size", "2", "--tensor-model-parallel-size", "2", "--sequence-parallel",
           "--moe-token-dispatcher-type", "alltoall"}},
      {4, {"--expert-model-parallel-size", "2", "--pipeline-model-parallel-size", "2", "--pipeline-schedule", "zb-h1",
           "--moe-token-dispatcher-type", "alltoall"}},  // stage 1 holds no MoE layer
      {4, {"--expert-model-parallel-size", "2", "--use-distributed-optimizer", "--moe-token-dispatcher-type", "alltoall"}},
      {4, {"--expert-model-parallel-size", "2", "--zero-stage", "2", "--recompute-activations"}},
      {4, {"--expert-model-parallel-size", "2", "--zero-stage", "3", "--moe-token-dispatcher-type", "alltoall"}},
      {4, {"--expert-model-parallel-size", "4", "--moe-token-dispatcher-type", "alltoall"}},
  };
  int ran = 0;
  for (const Layout& l : layouts) {
    if (l.ranks != world) continue;
    std::string what = "MoE ";
    for (const std::string& e : l.extra) what += e + " ";
    check_close(run(plus(base, l.extra), MPI_COMM_WORLD), single, 1e-5, what);
    ++ran;
  }
  CHECK(ran > 0);
  MPI_Barrier(MPI_COMM_WORLD);
}

TEST_CASE("MoE with capacity dropping, and a Qwen2-MoE-like layer, under TP, DP and EP") {
  const int world = world_size();
  if (world != 2) return;
  const fs::path dir = testing::shared_dir("moe");
  const std::string data = testing::make_shared_dataset(dir, 13, 300);
  const std::vector<std::vector<std::string>> variants = {
      plus(kMoe, {"--moe-expert-capacity-factor", "1.0"}),  // the least probable choices dropped
      plus(kMoe, {"--moe-expert-capacity-factor", "0.75", "--moe-token-drop-policy", "position"}),
      {"--num-experts", "4", "--moe-router-topk", "2", "--moe-ffn-hidden-size", "24", "--swiglu", "--disable-bias-linear",
       "--moe-router-pre-softmax", "--moe-shared-expert-intermediate-size", "40", "--moe-shared-expert-gate",
       "--moe-aux-loss-coeff", "0.01"},
  };
  for (size_t i = 0; i < variants.size(); ++i) {
    const std::vector<std::string>& v = variants[i];
    const std::vector<std::string> f = plus(flags(data), v);
    const Result single = single_process(f);
    std::string what;
    for (const std::string& e : v) what += e + " ";
    check_close(run(plus(f, {"--tensor-model-parallel-size", "2", "--sequence-parallel"}), MPI_COMM_WORLD), single, 1e-5,
                what + "TP2 SP");
    check_close(run(plus(f, {"--use-distributed-optimizer"}), MPI_COMM_WORLD), single, 1e-5, what + "DP2 ZeRO-1");
    // Expert parallelism with each dispatcher (dropping by probability, the shared expert): both the
    // one-process run's, and each other's within 1e-6.
    if (i == 1) continue;
    const Result gather = run(plus(f, {"--expert-model-parallel-size", "2"}), MPI_COMM_WORLD);
    const Result a2a = run(plus(f, {"--expert-model-parallel-size", "2", "--moe-token-dispatcher-type", "alltoall"}),
                           MPI_COMM_WORLD);
    check_close(gather, single, 1e-5, what + "EP2 allgather");
    check_close(a2a, single, 1e-5, what + "EP2 alltoall");
    check_close(a2a, gather, 1e-6, what + "EP2 alltoall vs allgather");
  }
  MPI_Barrier(MPI_COMM_WORLD);
}

TEST_CASE("MoE checkpoints reshard across expert-parallel sizes") {
  const int world = world_size();
  if (const char* e = std::getenv("MPITRON_TEST_LAYOUTS"); e && *e) return;  // not in the quick set
  const fs::path dir = testing::shared_dir("moe");
  const std::string data = testing::make_shared_dataset(dir, 13, 300);
  const std::vector<std::string> base = plus(flags(data), kMoe);
  const Result single = single_process(base);
  const std::vector<double> second(single.losses.begin() + 5, single.losses.end());
  const std::vector<std::string> ep = {"--expert-model-parallel-size", std::to_string(world),
                                       "--moe-token-dispatcher-type", "alltoall", "--use-distributed-optimizer"};
  // Saved at EP = world (each rank writes its experts' rows), resumed on one process and at
  // EP 2 × DP (4 ranks) with ZeRO-3; and a one-process checkpoint resumed at EP = world.
  const std::string ck = (dir / str("ck_ep", world)).string();
  run(plus(base, plus(ep, {"--save", ck, "--exit-interval", "5"})), MPI_COMM_WORLD);
  check_part(run(plus(base, {"--load", ck}), MPI_COMM_SELF).losses, second, "EP checkpoint -> one process");
  MPI_Barrier(MPI_COMM_WORLD);
  if (world == 4)
    check_part(run(plus(base, {"--expert-model-parallel-size", "2", "--zero-stage", "3", "--load", ck}), MPI_COMM_WORLD)
                   .losses,
               second, "EP4 -> EP2 x DP2 ZeRO-3");
  const std::string ck1 = (dir / str("ck_one_ep", world)).string();
  if (world_rank() == 0) run(plus(base, {"--save", ck1, "--exit-interval", "5"}), MPI_COMM_SELF);
  else MPI_Barrier(MPI_COMM_WORLD);
  check_part(run(plus(base, plus(ep, {"--load", ck1})), MPI_COMM_WORLD).losses, second, "one process -> EP");
  MPI_Barrier(MPI_COMM_WORLD);
}

// Aux-loss-free balancing (DeepSeek-V3's, Megatron-Core's --moe-router-enable-expert-bias): the
// bias (a buffer, moved by rate · sign(mean − count) after every step from the counts summed over
// all ranks) changes which experts are chosen, so every layout trains to the one-process losses
// only when each rank's bias moves the same way; a resume reads it back from the checkpoint
// (buffers/…expert_bias), so the resumed losses equal the uninterrupted run's.
TEST_CASE("MoE aux-loss-free balancing: the expert bias agrees across layouts and survives a resume") {
  const int world = world_size();
  const fs::path dir = testing::shared_dir("moe");
  const std::string data = testing::make_shared_dataset(dir, 13, 300);
  const std::vector<std::string> base =
      plus(flags(data), {"--num-experts", "4", "--moe-router-topk", "2", "--moe-ffn-hidden-size", "48",
                         "--moe-layer-freq", "[1,1,0,0]", "--moe-router-score-function", "sigmoid",
                         "--moe-router-enable-expert-bias", "--moe-router-bias-update-rate", "0.05",
                         "--moe-router-load-balancing-type", "none"});
  const Result single = single_process(base);
  const std::vector<std::vector<std::string>> layouts =
      world == 2 ? std::vector<std::vector<std::string>>{{"--expert-model-parallel-size", "2"},
                                                         {"--pipeline-model-parallel-size", "2"}}
                 : std::vector<std::vector<std::string>>{
                       {"--expert-model-parallel-size", "2", "--tensor-model-parallel-size", "2", "--sequence-parallel",
                        "--moe-token-dispatcher-type", "alltoall"},
                       {"--expert-model-parallel-size", "2", "--pipeline-model-parallel-size", "2",
                        "--use-distributed-optimizer"}};
  for (const std::vector<std::string>& l : layouts) {
    std::string what = "expert bias ";
    for (const std::string& e : l) what += e + " ";
    check_close(run(plus(base, l), MPI_COMM_WORLD), single, 1e-5, what);
  }
  if (world != 2) return;
  // Resume: 5 steps, save, 5 more = the uninterrupted run (the bias is in the checkpoint).
  const std::vector<std::string> ep = {"--expert-model-parallel-size", "2"};
  const std::string ck = (dir / "ck_bias").string();
  run(plus(base, plus(ep, {"--save", ck, "--exit-interval", "5"})), MPI_COMM_WORLD);
  const Result resumed = run(plus(base, plus(ep, {"--load", ck})), MPI_COMM_WORLD);
  check_part(resumed.losses, std::vector<double>(single.losses.begin() + 5, single.losses.end()), "expert bias resumed");
  // The saved biases: 5 updates of ±0.05 (or 0 when an expert sat exactly at the mean), not all zero.
  if (world_rank() == 0) {
    io::CheckpointReader r = io::CheckpointReader::open_latest(ck, MPI_COMM_SELF);
    REQUIRE(r.found());
    double moved = 0;
    for (const char* name : {"buffers/layers.0.mlp.router.expert_bias", "buffers/layers.1.mlp.router.expert_bias"}) {
      REQUIRE(r.has_tensor(name));
      const Tensor b = r.read(name);
      REQUIRE(b.numel() == 4);
      for (int64_t e = 0; e < 4; ++e) {
        const double steps = b.data<float>()[e] / 0.05;
        CHECK(std::abs(steps - std::round(steps)) < 1e-4);
        CHECK(std::abs(steps) <= 5.0 + 1e-4);
        moved += std::abs(b.data<float>()[e]);
      }
    }
    CHECK(moved > 0);
  }
  MPI_Barrier(MPI_COMM_WORLD);
}
