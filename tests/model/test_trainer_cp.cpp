// Context parallelism end to end with real MPI ranks (--context-parallel-size,
// --cp-comm-type; parallel/context_parallel.h): a GPT-2 config and a GQA Llama
// (rope, RMSNorm, SwiGLU, untied head) trained for 10 steps with hidden and attention
// dropout 0.1 in f32 under CP 2 and CP 4 with every comm type, CP x TP (+SP), CP x DP
// with ZeRO, CP x PP under every schedule, recompute, must give the single-process
// losses, grad norms and validation loss within 1e-5 relative; bf16 and fp16 within
// their rounding. A checkpoint saved at CP 2 resumes on one process and one saved on one
// process resumes at CP 2, continuing the uninterrupted losses. The start-up memory
// estimate agrees with the measured peak (10%). Unsupported combinations are refused
// naming the flags.
// mpitron-test: np=2,4
// mpitron-test: timeout=900
// mpitron-test: long_np=4
#include <doctest/doctest.h>
#include <mpi.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "model/training/arguments.h"
#include "model/training/gpt_data.h"
#include "model/training/parallel_runtime.h"
#include "model/training/trainer.h"
#include "tests/model/mpi_test_util.h"

using namespace mpitron;
namespace fs = std::filesystem;

namespace {

using testing::world_rank;
using testing::world_size;

// MPITRON_TEST_DEVICE=cuda runs on the GPU (tools/gpu_check.sh: the ranks share it, so
// their device tensors go through MPI) or on the simulated one under make test-cuda-sim
// (every rank its own device, the communicators NCCL's stand-in: tests/cuda_sim/nccl.cpp).
std::string test_device() {
  const char* d = std::getenv("MPITRON_TEST_DEVICE");
  return d && *d ? d : "cpu";
}

std::vector<std::string> gpt_flags(const std::string& data) {
  std::vector<std::string> f = {"--num-layers", "4", "--hidden-size", "32", "--num-attention-heads", "4",
                                "--seq-length", "16", "--micro-batch-size", "2", "--global-batch-size", "8",
                                "--train-iters", "10", "--lr", "3e-3", "--lr-warmup-iters", "2", "--lr-decay-style",
                                "cosine", "--hidden-dropout", "0.1", "--attention-dropout", "0.1", "--data-path", data,
                                "--split", "90,10,0", "--log-interval", "5", "--eval-interval", "5", "--eval-iters", "1",
                                "--seed", "11", "--device", test_device(), "--ddp-bucket-size", "3000"};
#if !defined(MPITRON_CUDA_SIM)
  if (test_device() == "cuda") f.push_back("--force-mpi-for-device");  // the ranks share one GPU
#endif
  return f;
}
std::vector<std::string> with(std::vector<std::string> f, const std::vector<std::string>& extra) {
  f.insert(f.end(), extra.begin(), extra.end());
  return f;
}
// A Llama with grouped-query attention: 8 heads in 4 kv groups (so a2a splits them
// over CP 4 too), rope, RMSNorm, SwiGLU, an untied head, no biases.
std::vector<std::string> llama_flags(const std::string& data) {
  return with(gpt_flags(data), {"--num-attention-heads", "8", "--group-query-attention", "--num-query-groups", "4",
                                "--ffn-hidden-size", "48", "--normalization", "RMSNorm", "--norm-epsilon", "1e-5",
                                "--swiglu", "--position-embedding-type", "rope", "--rotary-base", "1000",
                                "--untie-embeddings-and-output-weights", "--disable-bias-linear"});
}

struct Result {
  std::vector<double> losses, grad_norms;
  double valid_loss = 0;
};

TrainArgs parse(std::vector<std::string> f, int world) {
  TrainArgs a;
  a.world_size = world;
  std::vector<char*> argv{const_cast<char*>("pretrain_gpt")};
  for (auto& s : f) argv.push_back(s.data());
  REQUIRE(parse_train_args(static_cast<int>(argv.size()), argv.data(), a));
  return a;
}

// Trains on `comm` (MPI_COMM_SELF: one process) with the layout the flags give.
Result run(const std::vector<std::string>& f, MPI_Comm comm) {
  int size = 1;
  MPI_Comm_size(comm, &size);
  TrainArgs a = parse(f, size);
  a.model.vocab_size = 50257;
  a.model.padded_vocab_size = 50304;
  std::shared_ptr<SampleSource> data;
  if (world_rank() == 0) data = make_gpt_data(a, 50257);  // index caches: rank 0 first
  MPI_Barrier(MPI_COMM_WORLD);
  if (world_rank() != 0) data = make_gpt_data(a, 50257);
  ParallelRuntime rt(comm, a);
#if defined(MPITRON_CUDA_SIM)
  if (test_device() == "cuda") {  // every device communicator through parallel/comm_nccl.cpp (the stand-in)
    const ParallelContext ctx = rt.context();
    for (Communicator* c : {ctx.dp, ctx.tp, ctx.pp, ctx.mp, ctx.embedding, ctx.cp, ctx.dp_cp})
      if (c) CHECK_MESSAGE(std::string(c->backend()) == "nccl", c->describe());
  }
#endif
  Trainer t(a, data, rt.context());
  const TrainSummary s = t.run();
  if (rt.grid().tp_size() > 1) testing::check_tp_replicas_identical(t.model().params(), rt.grid().tp_comm());
  // The start-up estimate (activations of T/cp tokens, the comm type's buffers) agrees with the peak.
  const double est = static_cast<double>(s.estimated_memory_bytes), peak = static_cast<double>(s.peak_memory_bytes);
  const double rounding = test_device() == "cuda" ? 16.0 * (1 << 20) : 0.0;
  CHECK_MESSAGE(std::abs(peak - est) <= 0.1 * est + rounding, "rank ", world_rank(), ": measured peak ", peak / 1e6,
                " MB vs estimate ", est / 1e6, " MB");
  return {s.losses, s.grad_norms, s.valid_loss};
}

// The single-process reference: rank 0 trains it alone (on MPI_COMM_SELF) and the
// other ranks receive its numbers, instead of every rank training the same model on
// the few shared cores.
Result single_process(const std::vector<std::string>& f) {
  Result r;
  if (world_rank() == 0) r = run(f, MPI_COMM_SELF);
  else MPI_Barrier(MPI_COMM_WORLD);  // run()'s barrier: rank 0 has built the dataset's index caches
  const auto bcast = [](std::vector<double>& v) {
    int n = static_cast<int>(v.size());
    MPI_Bcast(&n, 1, MPI_INT, 0, MPI_COMM_WORLD);
    v.resize(static_cast<size_t>(n));
    MPI_Bcast(v.data(), n, MPI_DOUBLE, 0, MPI_COMM_WORLD);
  };
  bcast(r.losses);
  bcast(r.grad_norms);
  MPI_Bcast(&r.valid_loss, 1, MPI_DOUBLE, 0, MPI_COMM_WORLD);
  return r;
}

void check_close(const Result& got, const Result& want, double rel, const std::string& what) {
  REQUIRE(got.losses.size() == want.losses.size());
  for (size_t i = 0; i < got.losses.size(); ++i) {
    CHECK_MESSAGE(std::abs(got.losses[i] - want.losses[i]) <= rel * std::abs(want.losses[i]), what, " iteration ",
                  i + 1, " loss ", got.losses[i], " vs ", want.losses[i]);
    CHECK_MESSAGE(std::abs(got.grad_norms[i] - want.grad_norms[i]) <= rel * std::abs(want.grad_norms[i]), what,
                  " iteration ", i + 1, " grad norm ", got.grad_norms[i], " vs ", want.grad_norms[i]);
  }
  CHECK_MESSAGE(std::abs(got.valid_loss - want.valid_loss) <= rel * std::abs(want.valid_loss), what,
                " validation loss ", got.valid_loss, " vs ", want.valid_loss);
}

void check_part(const std::vector<double>& got, const std::vector<double>& want, const std::string& what) {
  REQUIRE(got.size() == want.size());
  for (size_t i = 0; i < got.size(); ++i)
    CHECK_MESSAGE(std::abs(got[i] - want[i]) <= 1e-5 * std::abs(want[i]), what, " step ", i, ": ", got[i], " vs ",
                  want[i]);
}

struct Layout {
  int ranks;
  std::vector<std::string> extra;
};

// Every layout of this world size against the single-process run of `model`.
void run_layouts(const std::string& name, const std::vector<std::string>& model, const std::vector<Layout>& layouts,
                 double rel = 1e-5) {
  const Result single = single_process(model);
  REQUIRE(single.losses.size() == 10);
  CHECK(single.losses.back() < single.losses.front());
  int ran = 0;
  for (const Layout& l : layouts) {
    if (l.ranks != world_size()) continue;
    std::string what = name + " ";
    for (const std::string& e : l.extra) what += e + " ";
    check_close(run(with(model, l.extra), MPI_COMM_WORLD), single, rel, what);
    ++ran;
  }
  CHECK(ran > 0);
}

// MPITRON_TEST_LAYOUTS (the simulated device's quick set): only the first layout of each list.
std::vector<Layout> quick(std::vector<Layout> v) {
  if (const char* e = std::getenv("MPITRON_TEST_LAYOUTS"); e && *e) {
    std::vector<Layout> q;
    for (const Layout& l : v)
      if (l.ranks == world_size()) {
        q.push_back(l);
        break;
      }
    return q;
  }
  return v;
}

const std::vector<Layout> kCommTypes = {
    {2, {"--context-parallel-size", "2"}},  // p2p, the default
    {2, {"--context-parallel-size", "2", "--cp-comm-type", "all_gather"}},
    {2, {"--context-parallel-size", "2", "--cp-comm-type", "a2a"}},
    {2, {"--context-parallel-size", "2", "--recompute-activations"}},
    {4, {"--context-parallel-size", "4"}},
    {4, {"--context-parallel-size", "4", "--cp-comm-type", "all_gather"}},
    {4, {"--context-parallel-size", "4", "--cp-comm-type", "a2a"}},
    {4, {"--context-parallel-size", "2", "--tensor-model-parallel-size", "2", "--sequence-parallel"}},
    {4, {"--context-parallel-size", "2", "--use-distributed-optimizer"}},  // CP2 x DP2, ZeRO-1 over dp x cp
    {4, {"--context-parallel-size", "2", "--zero-stage", "2", "--cp-comm-type", "a2a"}},
};

}  // namespace

TEST_CASE("context parallelism trains a GPT-2 config to the single-process losses") {
  const fs::path dir = testing::shared_dir("cp_gpt");
  const std::string data = testing::make_shared_dataset(dir, 17, 300);
  std::vector<Layout> layouts = kCommTypes;
  // Pipeline parallelism under every schedule.
  for (const std::vector<std::string>& pp :
       std::vector<std::vector<std::string>>{{"--pipeline-schedule", "gpipe"},
                                             {"--pipeline-schedule", "1f1b"},
                                             {"--num-layers-per-virtual-pipeline-stage", "1"},  // interleaved
                                             {"--pipeline-schedule", "zb-h1"},
                                             {"--pipeline-schedule", "zbv", "--num-layers-per-virtual-pipeline-stage", "1"}})
    layouts.push_back({4, with({"--context-parallel-size", "2", "--pipeline-model-parallel-size", "2"}, pp)});
  layouts.push_back({4, {"--context-parallel-size", "2", "--tensor-model-parallel-size", "2", "--recompute-activations",
                         "--cp-comm-type", "all_gather"}});
  run_layouts("gpt", gpt_flags(data), quick(layouts));
  MPI_Barrier(MPI_COMM_WORLD);
  if (world_rank() == 0) fs::remove_all(dir);
}

TEST_CASE("context parallelism trains a GQA Llama (rope) to the single-process losses") {
  if (const char* e = std::getenv("MPITRON_TEST_LAYOUTS"); e && *e) return;  // the GPT case covers the quick set
  const fs::path dir = testing::shared_dir("cp_llama");
  const std::string data = testing::make_shared_dataset(dir, 17, 300);
  std::vector<Layout> layouts = kCommTypes;
  layouts.push_back({4, {"--context-parallel-size", "2", "--pipeline-model-parallel-size", "2", "--pipeline-schedule",
                         "zb-h1"}});
  run_layouts("llama", llama_flags(data), layouts);
  MPI_Barrier(MPI_COMM_WORLD);
  if (world_rank() == 0) fs::remove_all(dir);
}

TEST_CASE("context parallelism in bf16 and fp16 follows the single-process run of that dtype") {
  if (world_size() != 2) return;
  if (const char* e = std::getenv("MPITRON_TEST_LAYOUTS"); e && *e) return;
  const fs::path dir = testing::shared_dir("cp_bf16");
  const std::string data = testing::make_shared_dataset(dir, 17, 300);
  // bf16 rounds every activation: the split attention rounds its partial outputs
  // differently from the whole call, so the losses agree to bf16's precision only.
  run_layouts("llama bf16", with(llama_flags(data), {"--bf16"}),
              {{2, {"--context-parallel-size", "2"}}, {2, {"--context-parallel-size", "2", "--cp-comm-type", "a2a"}}},
              2e-2);
  // fp16 with a static loss scale (a dynamic one skips its first overflowing steps, whose grad norms are not finite).
  run_layouts("gpt fp16", with(gpt_flags(data), {"--fp16", "--loss-scale", "1024"}),
              {{2, {"--context-parallel-size", "2", "--cp-comm-type", "all_gather"}}}, 5e-3);
  MPI_Barrier(MPI_COMM_WORLD);
  if (world_rank() == 0) fs::remove_all(dir);
}

TEST_CASE("a checkpoint saved at CP 2 resumes on one process, and back") {
  if (world_size() != 2) return;
  if (const char* e = std::getenv("MPITRON_TEST_LAYOUTS"); e && *e) return;
  const fs::path dir = testing::shared_dir("cp_ckpt");
  const std::string data = testing::make_shared_dataset(dir, 17, 300);
  const Result single = single_process(llama_flags(data));
  const std::vector<double> first(single.losses.begin(), single.losses.begin() + 5);
  const std::vector<double> second(single.losses.begin() + 5, single.losses.end());
  const std::string cp2 = (dir / "ck_cp2").string();
  check_part(run(with(llama_flags(data), {"--context-parallel-size", "2", "--use-distributed-optimizer", "--save", cp2,
                                          "--exit-interval", "5"}),
                 MPI_COMM_WORLD)
                 .losses,
             first, "CP2 ZeRO-1 before saving");
  MPI_Barrier(MPI_COMM_WORLD);
  check_part(run(with(llama_flags(data), {"--load", cp2}), MPI_COMM_SELF).losses, second, "CP2 -> one process");
  MPI_Barrier(MPI_COMM_WORLD);
  const std::string one = (dir / ("ck_one_" + std::to_string(world_rank()))).string();
  run(with(llama_flags(data), {"--save", one, "--exit-interval", "5"}), MPI_COMM_SELF);
  MPI_Barrier(MPI_COMM_WORLD);
  const std::string one0 = (dir / "ck_one_0").string();
  check_part(run(with(llama_flags(data), {"--context-parallel-size", "2", "--cp-comm-type", "all_gather", "--load", one0}),
                 MPI_COMM_WORLD)
                 .losses,
             second, "one process -> CP2");
  MPI_Barrier(MPI_COMM_WORLD);
  if (world_rank() == 0) fs::remove_all(dir);
}

TEST_CASE("context parallelism: unsupported combinations are refused naming the flags") {
  const std::string data = "/nonexistent/prefix";
  auto refuse = [](std::vector<std::string> f, int world, const char* what) {
    TrainArgs a;
    a.world_size = world;
    std::vector<char*> argv{const_cast<char*>("pretrain_gpt")};
    for (auto& s : f) argv.push_back(s.data());
    CHECK_THROWS_WITH_AS(parse_train_args(static_cast<int>(argv.size()), argv.data(), a), doctest::Contains(what), Error);
  };
  refuse(with(gpt_flags(data), {"--context-parallel-size", "3"}), 3, "--seq-length 16 is not divisible by 2 x --context-parallel-size = 6");
  refuse(with(gpt_flags(data), {"--context-parallel-size", "2"}), 3, "--context-parallel-size 2");
  refuse(with(gpt_flags(data), {"--context-parallel-size", "2", "--cp-comm-type", "ring"}), 2, "--cp-comm-type ring");
  refuse(with(gpt_flags(data), {"--context-parallel-size", "2", "--cp-comm-type", "a2a+p2p"}), 2, "--cp-comm-type a2a+p2p");
  refuse(with(gpt_flags(data), {"--context-parallel-size", "0"}), 1, "--context-parallel-size");
  // a2a splits each TP rank's heads and kv groups over CP: 4 heads / TP 2 = 2 over CP 4.
  refuse(with(gpt_flags(data), {"--context-parallel-size", "4", "--tensor-model-parallel-size", "2", "--cp-comm-type", "a2a"}),
         8, "--cp-comm-type a2a splits");
  refuse(with(gpt_flags(data), {"--context-parallel-size", "2", "--hidden-size", "30", "--num-attention-heads", "3"}), 2,
         "--hidden-size divisible by 4");
  {  // BERT: its padding mask does not split into causal chunks
    TrainArgs a;
    a.model.bert = true;
    a.world_size = 2;
    std::vector<std::string> f = with(gpt_flags(data), {"--context-parallel-size", "2", "--tokenizer-type",
                                                        "BertWordPieceLowerCase", "--vocab-file", "/nonexistent/vocab.txt"});
    std::vector<char*> argv{const_cast<char*>("pretrain_bert")};
    for (auto& s : f) argv.push_back(s.data());
    CHECK_THROWS_WITH_AS(parse_train_args(static_cast<int>(argv.size()), argv.data(), a),
                         doctest::Contains("--context-parallel-size > 1 is not supported for BERT"), Error);
  }
  {  // accepted: Megatron's spelling, and a note when CP is 1
    const TrainArgs a = parse(with(gpt_flags(data), {"--context-parallel-size", "2", "--cp-comm-type", "allgather"}), 4);
    CHECK(a.cp_comm_type == "all_gather");
    CHECK(a.data_parallel_size == 2);
    const TrainArgs b = parse(with(gpt_flags(data), {"--cp-comm-type", "a2a"}), 1);
    REQUIRE(b.startup_notes.size() == 1);
    CHECK(b.startup_notes[0].find("no effect without --context-parallel-size") != std::string::npos);
  }
}
