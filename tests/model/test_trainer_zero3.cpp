// ZeRO-3 (--zero-stage 3, model/training/states_zero3.cpp) end to end with real MPI
// ranks: parameters, gradients and optimizer state sharded over the data-parallel
// ranks must train the small GPT (and a GQA Llama) to the single-process losses and
// grad norms within 1e-5 relative (f32), in both flag dialects (DeepSpeed's JSON,
// Megatron-FSDP's); resume is bitwise; checkpoints cross to and from other layouts;
// the start-up estimate agrees with the measured peak (trainer_test_util.h's run()).
// mpitron-test: np=2,4
// mpitron-test: timeout=900
#include <doctest/doctest.h>
#include <mpi.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "model/training/model_states.h"
#include "tests/model/mpi_test_util.h"
#include "tests/model/trainer_test_util.h"

using namespace mpitron;
using namespace mpitron::testing::trainer;
namespace fs = std::filesystem;
using testing::world_rank;
using testing::world_size;

namespace {

fs::path shared_dir() { return testing::shared_dir("zero3"); }

std::string make_dataset(const fs::path& dir) { return testing::make_shared_dataset(dir, 13, 300); }

}  // namespace

TEST_CASE("ZeRO-3 trains to the single-process losses under every data-parallel layout") {
  const int world = world_size();
  const fs::path dir = shared_dir();
  const std::string data = make_dataset(dir);
  // The simulated device's quick set (MPITRON_TEST_LAYOUTS given, tests/cuda_sim/run.sh): the
  // first layout of the world size only, 5 steps.
  const bool quick = std::getenv("MPITRON_TEST_LAYOUTS") && *std::getenv("MPITRON_TEST_LAYOUTS");
  auto flags = [quick](const std::string& d) {
    std::vector<std::string> f = testing::trainer::flags(d);
    if (quick) *(std::find(f.begin(), f.end(), "--train-iters") + 1) = "5";
    return f;
  };
  const Result single = single_process(flags(data));
  REQUIRE(single.losses.size() == (quick ? 5u : 10u));
  const std::string ds = (dir / "ds_zero3.json").string();
  if (world_rank() == 0) {
    std::ofstream f(ds);
    f << R"({"train_micro_batch_size_per_gpu": 2, "gradient_clipping": 1.0,
             "zero_optimization": {"stage": 3, "overlap_comm": true, "reduce_bucket_size": 3000,
                                   "stage3_prefetch_bucket_size": 0, "stage3_param_persistence_threshold": 100,
                                   "stage3_max_live_parameters": 1000000,
                                   "offload_optimizer": {"device": "cpu", "pin_memory": true}}})";
  }
  MPI_Barrier(MPI_COMM_WORLD);
  struct Layout {
    int ranks;
    std::vector<std::string> extra;
  };
  const std::vector<Layout> layouts = {
      // First: the simulated device's quick set (and the GPU's): ZeRO-3 with the optimizer
      // state in host memory (on the CPU the offload moves nothing; the next layouts
      // cover plain ZeRO-3 there).
      {2, {"--zero-stage", "3", "--optimizer-cpu-offload"}},
      {2, {"--zero-stage", "3"}},
      {2, {"--zero-stage", "3", "--recompute-activations"}},
      {2, {"--use-distributed-optimizer", "--optimizer-cpu-offload", "--optimizer-offload-fraction", "1.0"}},
      {2, {"--use-megatron-fsdp", "--data-parallel-sharding-strategy", "optim_grads_params", "--overlap-param-gather"}},
      {2, {"--deepspeed", "--deepspeed_config", ds}},  // no prefetch, small blocks kept whole
      {2, {"--zero-stage", "3", "--bf16"}},  // against the one-process bf16 run below
      {2, {"--zero-stage", "3", "--initial-loss-scale", "4096", "--fp16"}},  // fp16, dynamic loss scaling
      {4, {"--zero-stage", "3"}},
      {4, {"--tensor-model-parallel-size", "2", "--sequence-parallel", "--zero-stage", "3", "--recompute-activations"}},
      // Pipeline schedules at PP2 x DP2: each stage's blocks sharded over its dp pair; the
      // tied embedding's two copies summed between the stages.
      {4, {"--pipeline-model-parallel-size", "2", "--zero-stage", "3"}},  // 1f1b
      {4, {"--pipeline-model-parallel-size", "2", "--pipeline-schedule", "zb-h1", "--zero-stage", "3"}},  // deferred W
      {4, {"--pipeline-model-parallel-size", "2", "--num-layers-per-virtual-pipeline-stage", "1", "--zero-stage", "3",
           "--recompute-activations"}},  // interleaved, two chunks per rank
      {4, {"--pipeline-model-parallel-size", "2", "--pipeline-schedule", "zbv", "--num-layers-per-virtual-pipeline-stage",
           "1", "--zero-stage", "3"}},  // V: both ends of the model on pipeline rank 0
  };
  int ran = 0;
  for (const Layout& l : layouts) {
    if (l.ranks != world || (quick && ran > 0)) continue;
    const std::string half = l.extra.back();
    if (half == "--bf16" || half == "--fp16") {
      // 16-bit: the same rounding of the same f32 master weights; the sums' order differs,
      // which 16-bit activations amplify: 1e-3 relative.
      const Result single16 = single_process(plus(flags(data), {l.extra.begin() + 2, l.extra.end()}));  // no --zero-stage
      check_close(run(plus(flags(data), l.extra), MPI_COMM_WORLD), single16, 1e-3, half + " ZeRO-3");
      ++ran;
      continue;
    }
    std::string what;
    for (const std::string& e : l.extra) what += e + " ";
    check_close(run(plus(flags(data), l.extra), MPI_COMM_WORLD), single, 1e-5, what);
    ++ran;
  }
  if (world == 2 && !quick) {  // a GQA Llama (RMSNorm, SwiGLU, rope, untied head) at DP2
    const Result llama = single_process(llama_flags(data));
    check_close(run(plus(llama_flags(data), {"--zero-stage", "3"}), MPI_COMM_WORLD), llama, 1e-5, "Llama ZeRO-3");
    ++ran;
    // --optimizer sgd (parallel/update_rule.h): the same sharded step, another rule (issue 44).
    const std::vector<std::string> sgd = {"--optimizer", "sgd", "--sgd-momentum", "0.9"};
    const Result one = single_process(plus(flags(data), sgd));
    check_close(run(plus(flags(data), plus(sgd, {"--zero-stage", "3"})), MPI_COMM_WORLD), one, 1e-5, "SGD ZeRO-3");
    check_close(run(plus(flags(data), plus(sgd, {"--zero-stage", "1"})), MPI_COMM_WORLD), one, 1e-5, "SGD ZeRO-1");
    ++ran;
  }
  CHECK(ran > 0);
  MPI_Barrier(MPI_COMM_WORLD);
  if (world_rank() == 0) fs::remove_all(dir);
}

TEST_CASE("ZeRO-3 resumes bitwise, and its checkpoints cross layouts both ways") {
  const int world = world_size();
  if (const char* e = std::getenv("MPITRON_TEST_LAYOUTS"); e && *e) return;  // not in the quick set
  const fs::path dir = shared_dir();
  const std::string data = make_dataset(dir);
  const std::vector<std::string> z3 = {"--zero-stage", "3"};
  // Bitwise resume: 5 steps, save, resume for 5 more = the uninterrupted ZeRO-3 run.
  const Result whole = run(plus(flags(data), z3), MPI_COMM_WORLD);
  const std::string ck = (dir / "ck_z3").string();
  run(plus(flags(data), plus(z3, {"--save", ck, "--exit-interval", "5"})), MPI_COMM_WORLD);
  const Result resumed = run(plus(flags(data), plus(z3, {"--load", ck})), MPI_COMM_WORLD);
  REQUIRE(resumed.losses.size() == 5);
  for (size_t i = 0; i < 5; ++i) {
    CHECK_MESSAGE(resumed.losses[i] == whole.losses[i + 5], "step ", i + 6, ": ", resumed.losses[i], " vs ",
                  whole.losses[i + 5]);
    CHECK(resumed.grad_norms[i] == whole.grad_norms[i + 5]);
  }
  const std::vector<double> second(whole.losses.begin() + 5, whole.losses.end());
  if (world == 2) {  // the ZeRO-3 checkpoint on one process (every rank alone)
    check_part(run(plus(flags(data), {"--load", ck}), MPI_COMM_SELF).losses, second, "ZeRO-3 -> one process");
    MPI_Barrier(MPI_COMM_WORLD);
  }
  if (world == 4) {
    // ... at TP2 x DP2 with ZeRO-1, and back: TP2 x DP2 ZeRO-1 saved, resumed at DP4 ZeRO-3.
    const std::vector<std::string> tp2z1 = {"--tensor-model-parallel-size", "2", "--use-distributed-optimizer"};
    check_part(run(plus(flags(data), plus(tp2z1, {"--load", ck})), MPI_COMM_WORLD).losses, second,
               "ZeRO-3 DP4 -> TP2 x DP2 ZeRO-1");
    const std::string ck2 = (dir / "ck_tp2").string();
    run(plus(flags(data), plus(tp2z1, {"--save", ck2, "--exit-interval", "5"})), MPI_COMM_WORLD);
    check_part(run(plus(flags(data), plus(z3, {"--load", ck2})), MPI_COMM_WORLD).losses, second,
               "TP2 x DP2 ZeRO-1 -> ZeRO-3 DP4");
    // ... on one process (every rank alone), and a one-process checkpoint resumed at DP4 ZeRO-3.
    check_part(run(plus(flags(data), {"--load", ck}), MPI_COMM_SELF).losses, second, "ZeRO-3 DP4 -> one process");
    MPI_Barrier(MPI_COMM_WORLD);
    const std::string ck1 = (dir / "ck_one").string();
    // (run()'s dataset barrier: the other ranks pass it with rank 0's, and wait at the next
    // run()'s until rank 0 has saved.)
    if (world_rank() == 0) run(plus(flags(data), {"--save", ck1, "--exit-interval", "5"}), MPI_COMM_SELF);
    else MPI_Barrier(MPI_COMM_WORLD);
    check_part(run(plus(flags(data), plus(z3, {"--load", ck1})), MPI_COMM_WORLD).losses, second,
               "one process -> ZeRO-3 DP4");
    // ... and through a pipeline: PP2 x DP2 ZeRO-3 from the DP4 checkpoint, saved, back at DP4.
    const std::vector<std::string> pp2z3 = {"--pipeline-model-parallel-size", "2", "--zero-stage", "3"};
    check_part(run(plus(flags(data), plus(pp2z3, {"--load", ck})), MPI_COMM_WORLD).losses, second,
               "ZeRO-3 DP4 -> PP2 x DP2 ZeRO-3");
    const std::string ck3 = (dir / "ck_pp2").string();
    run(plus(flags(data), plus(pp2z3, {"--save", ck3, "--exit-interval", "5"})), MPI_COMM_WORLD);
    check_part(run(plus(flags(data), plus(z3, {"--load", ck3})), MPI_COMM_WORLD).losses, second,
               "PP2 x DP2 ZeRO-3 -> ZeRO-3 DP4");
  }
  MPI_Barrier(MPI_COMM_WORLD);
  if (world_rank() == 0) fs::remove_all(dir);
}

TEST_CASE("ZeRO-3 shards the word embedding: a vocabulary-dominated model's peak falls with dp") {
  if (world_size() != 2) return;
  if (const char* e = std::getenv("MPITRON_TEST_LAYOUTS"); e && *e) return;  // not in the quick set
  const fs::path dir = shared_dir();
  const std::string data = make_dataset(dir);
  std::vector<std::string> f = flags(data);  // GPT-2's vocabulary at hidden 32: 97% of the parameters in wte
  *(std::find(f.begin(), f.end(), "--train-iters") + 1) = "5";  // one log line (the peak is read there)
  // The units: the tied word embedding is a table gathered at each use, not kept whole, unless
  // stage3_param_persistence_threshold covers it (DeepSpeed's semantics).
  {  // (scoped: its buffers would count in the runs' measured peaks)
    TrainArgs a;
    parse_test_flags(f, a);
    GPT model(a.model, Device::cpu());
    int64_t wte = 0;
    for (const ParamInfo& p : model.params().infos())
      if (p.role == ParamRole::WordEmbedding) wte = p.numel();
    REQUIRE(wte == 50304 * 32);
    Zero3Config z;
    Zero3Footprint fp = zero3_footprint(model.params(), z, model.hooked_outside_params());
    CHECK(fp.largest_outside == wte);
    CHECK(fp.persistent < wte / 10);  // the final norm (the position table is a table too)
    z.persistence_threshold = wte;
    fp = zero3_footprint(model.params(), z, model.hooked_outside_params());
    CHECK(fp.largest_outside == 0);
    CHECK(fp.persistent > wte);
  }
  // Measured: one process holds 16 bytes per parameter (f32 values, gradients, two moments);
  // ZeRO-3 at DP2 half of them plus one gathered table (values or gradient) and the
  // activations; kept whole (values and gradients) the embedding alone was 8 of those 16 bytes.
  const Result one = single_process(f);
  const Result z3 = run(plus(f, {"--zero-stage", "3"}), MPI_COMM_WORLD);
  CHECK_MESSAGE(z3.peak_bytes < 0.85 * one.peak_bytes, "ZeRO-3 DP2 peak ", z3.peak_bytes / 1e6,
                " MB vs one process ", one.peak_bytes / 1e6, " MB");
  check_close(z3, one, 1e-5, "ZeRO-3 DP2 (5 steps)");
  MPI_Barrier(MPI_COMM_WORLD);
  if (world_rank() == 0) fs::remove_all(dir);
}

TEST_CASE("ZeRO-3 flags: what is not built is refused by name") {
  if (world_size() != 2) return;
  const fs::path dir = shared_dir();
  const std::string data = make_dataset(dir);
  auto parse = [&](const std::vector<std::string>& extra) {
    std::vector<std::string> f = plus(flags(data), extra);
    TrainArgs a;
    a.world_size = 2;
    std::vector<char*> argv{const_cast<char*>("pretrain_gpt")};
    for (auto& s : f) argv.push_back(s.data());
    parse_train_args(static_cast<int>(argv.size()), argv.data(), a);
    return a;
  };
  CHECK(parse({"--zero-stage", "3"}).zero_stage == 3);
  CHECK(parse({"--use-megatron-fsdp", "--data-parallel-sharding-strategy", "optim_grads"}).zero_stage == 2);
  CHECK(parse({"--use-megatron-fsdp"}).zero_stage == 0);  // Megatron's default strategy: no_shard
  CHECK(parse({"--zero-stage", "3", "--pipeline-model-parallel-size", "2"}).zero_stage == 3);
  CHECK_THROWS_WITH_AS(parse({"--use-torch-fsdp2"}), doctest::Contains("--use-torch-fsdp2"), Error);
  // --memory-cap: an estimate above it is refused at start-up, naming the cap.
  CHECK(parse({"--memory-cap", "30"}).memory_cap_mb == 30);
  CHECK_THROWS_WITH_AS(parse({"--memory-cap", "0"}), doctest::Contains("--memory-cap"), Error);
  CHECK_THROWS_WITH_AS(run(plus(flags(data), {"--zero-stage", "3", "--memory-cap", "5"}), MPI_COMM_WORLD),
                       doctest::Contains("--memory-cap 5"), Error);
  CHECK(parse({"--zero-stage", "3", "--optimizer-cpu-offload"}).optim.cpu_offload);
  CHECK_THROWS_WITH_AS(parse({"--optimizer-cpu-offload", "--optimizer-offload-fraction", "0.5"}),
                       doctest::Contains("--optimizer-offload-fraction 0.5"), Error);
  CHECK_THROWS_WITH_AS(parse({"--optimizer-offload-fraction", "1.0"}), doctest::Contains("--optimizer-cpu-offload"), Error);
  CHECK_THROWS_WITH_AS(parse({"--data-parallel-sharding-strategy", "optim"}), doctest::Contains("--use-megatron-fsdp"),
                       Error);
  CHECK_THROWS_WITH_AS(parse({"--use-megatron-fsdp", "--data-parallel-sharding-strategy", "optim", "--zero-stage", "3"}),
                       doctest::Contains("--zero-stage 3"), Error);
  const std::string ds = (dir / ("ds_offload" + std::to_string(world_rank()) + ".json")).string();
  {
    std::ofstream f(ds);
    f << R"({"zero_optimization": {"stage": 3, "offload_optimizer": {"device": "nvme"}, "offload_param": {"device": "cpu"}}})";
  }
  CHECK_THROWS_WITH_AS(parse({"--deepspeed", "--deepspeed_config", ds}),
                       doctest::Contains("zero_optimization.offload_optimizer.device \"nvme\" and zero_optimization.offload_param"),
                       Error);
  MPI_Barrier(MPI_COMM_WORLD);
  if (world_rank() == 0) fs::remove_all(dir);
}
