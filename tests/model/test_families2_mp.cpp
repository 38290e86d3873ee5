// The families of the sublayer options (Gemma 2's sandwich norms, soft-capping and alternating
// windows; Gemma 3's QK-norm, local rope base and scaled global rope; Qwen3-MoE's QK-norm over
// experts; OLMo-2's output norms and full-width QK-norm, whose sums of squares cross the TP ranks;
// Llama 3's rope scaling) train under model parallelism to the one-process losses: each trains a
// small model for 10 steps (hidden and attention dropout 0.1) on one process, then under DP2 with
// ZeRO-3 (np=2) and TP2 x PP2 (np=4: with sequence parallelism and recompute, and under the zero-bubble
// zb-h1 schedule); Llama 3's scaled rope also under context parallelism (CP2,
// np=2). Losses and grad norms within 1e-5 relative (fp32), TP-replicated parameters bitwise equal. The
// learning rate (1e-3) keeps the 10 steps clear of the loss spike OLMo-2's output norms give at 3e-3 (a grad
// norm of 12 at step 7), where the layouts' reduction-order noise (~1e-7) grows past 1e-5 within 3 steps.
// mpitron-test: np=2,4
// mpitron-test: timeout=900
// mpitron-test: long_np=4
#include <doctest/doctest.h>
#include <mpi.h>

#include <cmath>
#include <filesystem>

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

struct Result {
  std::vector<double> losses, grad_norms;
};

std::vector<std::string> base_flags(const std::string& data) {
  return {"--num-layers", "4", "--hidden-size", "32", "--num-attention-heads", "4", "--seq-length", "16",
          "--micro-batch-size", "2", "--global-batch-size", "8", "--train-iters", "10", "--lr", "1e-3",
          "--lr-warmup-iters", "2", "--lr-decay-style", "cosine", "--hidden-dropout", "0.1", "--attention-dropout", "0.1",
          "--data-path", data, "--split", "90,10,0", "--log-interval", "5", "--eval-interval", "100", "--eval-iters", "0",
          "--seed", "11", "--device", "cpu", "--ddp-bucket-size", "3000", "--ffn-hidden-size", "48",
          "--group-query-attention", "--num-query-groups", "2", "--normalization", "RMSNorm", "--position-embedding-type",
          "rope", "--disable-bias-linear"};
}

// Each family's own flags on top of the base (Megatron's names), and whether it runs under CP2.
struct FamilyFlags {
  std::string name;
  std::vector<std::string> flags;
  bool cp = false;
};
const std::vector<FamilyFlags> kFamilies = {
    {"gemma2",
     {"--geglu", "--apply-layernorm-1p", "--scale-embeddings", "--kv-channels", "16", "--norm-placement", "sandwich",
      "--attn-logit-softcapping", "2", "--final-logit-softcapping", "3", "--query-pre-attn-scalar", "12", "--window-size",
      "5", "--window-attn-skip-freq", "2"}},
    {"gemma3",
     {"--geglu", "--apply-layernorm-1p", "--scale-embeddings", "--kv-channels", "16", "--norm-placement", "sandwich",
      "--qk-layernorm", "--query-pre-attn-scalar", "12", "--window-size", "5", "--window-attn-skip-freq", "2",
      "--rotary-base", "1000000", "--local-rotary-base", "10000", "--rope-scaling-type", "linear", "--rope-scaling-factor", "8"}},
    {"qwen3_moe",
     {"--swiglu", "--qk-layernorm", "--kv-channels", "16", "--untie-embeddings-and-output-weights", "--num-experts", "4",
      "--moe-router-topk", "2", "--moe-ffn-hidden-size", "24"}},
    {"olmo2", {"--swiglu", "--norm-placement", "output", "--qk-layernorm-full-width", "--untie-embeddings-and-output-weights"}},
    {"llama3",
     {"--swiglu", "--use-rope-scaling", "--rope-scaling-factor", "32", "--original-max-position-embeddings", "8",
      "--rotary-base", "500000"},
     true},
};

Result run(std::vector<std::string> f, MPI_Comm comm) {
  int size = 1;
  MPI_Comm_size(comm, &size);
  TrainArgs a;
  a.world_size = size;
  std::vector<char*> argv{const_cast<char*>("pretrain_gpt")};
  for (auto& s : f) argv.push_back(s.data());
  REQUIRE(parse_train_args(static_cast<int>(argv.size()), argv.data(), a));
  a.model.vocab_size = 50257;
  a.model.padded_vocab_size = 50304;
  std::shared_ptr<SampleSource> data;
  if (world_rank() == 0) data = make_gpt_data(a, 50257);  // index caches: rank 0 first
  MPI_Barrier(MPI_COMM_WORLD);
  if (world_rank() != 0) data = make_gpt_data(a, 50257);
  ParallelRuntime rt(comm, a);
  Trainer t(a, data, rt.context());
  const TrainSummary s = t.run();
  if (rt.grid().tp_size() > 1) testing::check_tp_replicas_identical(t.model().params(), rt.grid().tp_comm());
  return {s.losses, s.grad_norms};
}

void check_close(const Result& got, const Result& want, const std::string& what) {
  REQUIRE(got.losses.size() == want.losses.size());
  for (size_t i = 0; i < got.losses.size(); ++i) {
    CHECK_MESSAGE(std::abs(got.losses[i] - want.losses[i]) <= 1e-5 * std::abs(want.losses[i]), what, " iteration ", i + 1,
                  " loss ", got.losses[i], " vs ", want.losses[i]);
    CHECK_MESSAGE(std::abs(got.grad_norms[i] - want.grad_norms[i]) <= 1e-5 * std::abs(want.grad_norms[i]), what,
                  " iteration ", i + 1, " grad norm ", got.grad_norms[i], " vs ", want.grad_norms[i]);
  }
}

}  // namespace

TEST_CASE("Gemma 2/3, Qwen3-MoE, OLMo-2 and Llama 3: DP2 + ZeRO-3, TP2 x PP2 and CP2 give the one-process losses") {
  const int world = world_size();
  const fs::path dir = testing::shared_dir("families2_mp");
  const std::string data = testing::make_shared_dataset(dir, 19, 300);
  for (const FamilyFlags& fam : kFamilies) {
    std::vector<std::vector<std::string>> layouts;
    if (world == 2) {
      layouts.push_back({"--zero-stage", "3"});
      if (fam.cp) layouts.push_back({"--context-parallel-size", "2"});
    } else {
      layouts.push_back({"--tensor-model-parallel-size", "2", "--sequence-parallel", "--pipeline-model-parallel-size", "2",
                         "--recompute-activations"});
      layouts.push_back({"--tensor-model-parallel-size", "2", "--pipeline-model-parallel-size", "2", "--pipeline-schedule",
                         "zb-h1"});
    }
    std::vector<std::string> f = base_flags(data);
    f.insert(f.end(), fam.flags.begin(), fam.flags.end());
    const Result single = run(f, MPI_COMM_SELF);
    REQUIRE(single.losses.size() == 10);
    CHECK(single.losses.back() < single.losses.front());
    for (const auto& l : layouts) {
      std::vector<std::string> g = f;
      g.insert(g.end(), l.begin(), l.end());
      std::string what = fam.name + " ";
      for (const std::string& e : l) what += e + " ";
      check_close(run(g, MPI_COMM_WORLD), single, what);
    }
  }
  MPI_Barrier(MPI_COMM_WORLD);
  if (world_rank() == 0) fs::remove_all(dir);
}
