// Multi-latent attention (model/layers/mla_layer.h), group-limited routing and multi-token prediction
// (model/gpt_mtp.cpp) under model parallelism. A small MLA model (value heads wider than the query/key
// heads) trains 10 steps on one process, then under TP2 with sequence parallelism and recompute: the heads
// split, the latent down-projections replicated (their output gradients all-reduced, their input gradient
// added once). A DeepSeek-V3 in small (q-lora, yarn, narrower value heads, 2 dense + 2 MoE layers with
// group-limited sigmoid routing, expert bias and a shared expert, one MTP layer) adds PP2 zb-h1 (MTP on
// the last stage), DP2 + ZeRO-3 and EP2 (np=2), EP2 x TP2 and TP2 x PP2 (np=4). Losses (MTP loss
// included) and grad norms within 1e-5 relative (fp32), TP-replicated parameters bitwise equal.
// mpitron-test: np=2,4
// mpitron-test: timeout=900
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
          "--normalization", "RMSNorm", "--position-embedding-type", "rope", "--disable-bias-linear"};
}

struct Case {
  std::string name;
  std::vector<std::string> flags;
  bool deepseek = false;  // the whole layout set (else TP2 + SP + recompute only)
};
const std::vector<Case> kCases = {
    // Value heads wider than the query/key heads, a plain query projection.
    {"mla",
     {"--swiglu", "--multi-latent-attention", "--kv-lora-rank", "12", "--qk-head-dim", "8", "--qk-pos-emb-head-dim", "4",
      "--v-head-dim", "16"}},
    // DeepSeek-V3 in small: q-lora, yarn with its mscale, narrower value heads, 2 dense then 2 MoE layers of
    // sigmoid-scored experts in 2 groups (the best 1 group), expert bias, a shared expert, the k
    // probabilities times 2.5, and one MTP layer.
    {"deepseek",
     {"--swiglu", "--multi-latent-attention", "--q-lora-rank", "16", "--kv-lora-rank", "12", "--qk-head-dim", "8",
      "--qk-pos-emb-head-dim", "4", "--v-head-dim", "6", "--rope-scaling-type", "yarn", "--rope-scaling-factor", "4",
      "--original-max-position-embeddings", "8", "--mscale", "1", "--mscale-all-dim", "1", "--num-experts", "4",
      "--moe-router-topk", "2", "--moe-ffn-hidden-size", "24", "--moe-router-score-function", "sigmoid",
      "--moe-layer-freq", "[0,0,1,1]", "--moe-router-num-groups", "2", "--moe-router-group-topk", "1",
      "--moe-router-topk-scaling-factor", "2.5", "--moe-router-enable-expert-bias", "--moe-shared-expert-intermediate-size",
      "24", "--untie-embeddings-and-output-weights", "--mtp-num-layers", "1", "--mtp-loss-scaling-factor", "0.3"},
     true},
};

// all_ranks: every rank of the world calls it (the data's index caches are built by rank 0 first);
// otherwise one rank alone.
Result run(std::vector<std::string> f, MPI_Comm comm, bool all_ranks = true) {
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
  if (!all_ranks || world_rank() == 0) data = make_gpt_data(a, 50257);  // index caches: rank 0 first
  if (all_ranks) MPI_Barrier(MPI_COMM_WORLD);
  if (all_ranks && world_rank() != 0) data = make_gpt_data(a, 50257);
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

TEST_CASE("MLA, group-limited routing and MTP: TP2+SP, PP2 zb-h1, DP2 ZeRO-3, EP2, EP2xTP2 and TP2xPP2 give the one-process losses") {
  const int world = world_size();
  const fs::path dir = testing::shared_dir("mla_mp");
  const std::string data = testing::make_shared_dataset(dir, 23, 300);
  for (const Case& c : kCases) {
    std::vector<std::vector<std::string>> layouts;
    if (world == 2) {
      layouts.push_back({"--tensor-model-parallel-size", "2", "--sequence-parallel", "--recompute-activations"});
      if (c.deepseek) {
        layouts.push_back({"--pipeline-model-parallel-size", "2", "--pipeline-schedule", "zb-h1"});  // MTP on stage 1
        layouts.push_back({"--zero-stage", "3"});
        layouts.push_back({"--expert-model-parallel-size", "2"});
      }
    } else if (c.deepseek) {
      layouts.push_back({"--expert-model-parallel-size", "2", "--tensor-model-parallel-size", "2"});
      layouts.push_back({"--tensor-model-parallel-size", "2", "--pipeline-model-parallel-size", "2"});
    }
    if (layouts.empty()) continue;
    std::vector<std::string> f = base_flags(data);
    f.insert(f.end(), c.flags.begin(), c.flags.end());
    const Result single = run(f, MPI_COMM_SELF);
    REQUIRE(single.losses.size() == 10);
    CHECK(single.losses.back() < single.losses.front());
    for (const auto& l : layouts) {
      std::vector<std::string> g = f;
      g.insert(g.end(), l.begin(), l.end());
      std::string what = c.name + " ";
      for (const std::string& e : l) what += e + " ";
      check_close(run(g, MPI_COMM_WORLD), single, what);
    }
  }
  MPI_Barrier(MPI_COMM_WORLD);
  if (world_rank() == 0) fs::remove_all(dir);
}

// A checkpoint trained without the MTP layer resumes with --mtp-num-layers 1 (the MTP weights start from
// the run's initialisation, with a warning), and one trained with it resumes without (its MTP weights are
// not loaded): the iterations continue, the losses stay finite, and the main model's first loss after
// each resume is the loss the checkpoint's weights give (the same data, the same weights).
TEST_CASE("MTP: checkpoints with and without the MTP layer load into each other") {
  if (world_size() != 2) return;  // one process's runs: once is enough
  const fs::path dir = testing::shared_dir("mla_mtp_ckpt");
  const std::string data = testing::make_shared_dataset(dir, 23, 300);
  if (world_rank() == 0) try {  // rank 0 alone; a failure must still reach the barrier below
    std::vector<std::string> plain = base_flags(data);
    for (size_t i = 0; i < kCases[1].flags.size(); ++i) {
      if (kCases[1].flags[i] == "--mtp-num-layers" || kCases[1].flags[i] == "--mtp-loss-scaling-factor") {
        ++i;
        continue;
      }
      plain.push_back(kCases[1].flags[i]);
    }
    for (auto& x : plain)
      if (x == "0.1") x = "0";  // no dropout: the resumed step's loss is the checkpoint's weights' own
    std::vector<std::string> mtp = plain;
    mtp.insert(mtp.end(), {"--mtp-num-layers", "1"});
    const auto with = [](std::vector<std::string> f, std::vector<std::string> more) {
      f.insert(f.end(), more.begin(), more.end());
      return f;
    };
    const std::string a = (dir / "a").string(), b = (dir / "b").string();
    const Result r0 = run(with(plain, {"--train-iters", "4", "--save", a, "--save-interval", "4"}), MPI_COMM_SELF, false);
    REQUIRE(r0.losses.size() == 4);
    const Result r1 = run(with(mtp, {"--train-iters", "6", "--load", a, "--save", b, "--save-interval", "6"}), MPI_COMM_SELF, false);
    REQUIRE(r1.losses.size() == 2);  // iterations 5 and 6: resumed at 4
    // The same weights and data as a plain resume: the trained loss adds 0.1 · mtp_1 to the same lm loss.
    const Result p1 = run(with(plain, {"--train-iters", "5", "--load", a}), MPI_COMM_SELF, false);
    REQUIRE(p1.losses.size() == 1);
    CHECK(r1.losses[0] > p1.losses[0]);
    for (double l : r1.losses) CHECK(std::isfinite(l));
    const Result r2 = run(with(plain, {"--train-iters", "7", "--load", b}), MPI_COMM_SELF, false);
    REQUIRE(r2.losses.size() == 1);
    CHECK(std::isfinite(r2.losses[0]));
  } catch (const std::exception& e) {
    FAIL_CHECK("rank 0: ", e.what());
  } catch (...) {
    FAIL_CHECK("rank 0: a check failed (above)");
  }
  MPI_Barrier(MPI_COMM_WORLD);
  if (world_rank() == 0) fs::remove_all(dir);
}
