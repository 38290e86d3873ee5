// pretrain_gpt --load of a Megatron-LM checkpoint resumes it (issue 43): megatron-core 0.16.1
// trained a small GPTModel for 3 steps on the CPU with its distributed optimizer, saved it in
// torch_dist and the legacy torch format, and trained the next 5 steps on the next batches of
// its GPTDataset over the committed .bin/.idx (tests/reference/megatron_resume_ref.py; outputs
// in tests/io/ref/megatron_resume/). mpitron, on the same data and hyper-parameters (ref.json's
// flags), must log those 5 losses.
//
// Tolerance: 1e-5 relative. Both sides compute in fp32; they differ only in the order of
// reductions (GEMMs, norms, the loss mean, the gradient norm), each ~1e-7 relative, carried
// through 5 steps of Adam at lr <= 1e-3: the differences measured are ~1e-7 (printed). A wrong
// mapping (a permuted qkv, gate/up swapped, an offset in the optimizer buffer, moments not
// loaded, the LR schedule or the data out of step) moves a loss by 1e-4 or more; the last case
// shows it: --no-load-optim gives the same first loss and other ones after.
//
// mpitron-test: timeout=900
#include <doctest/doctest.h>

#include <cmath>
#include <regex>

#include "apps_test_util.h"

using apps_test::slurp;
using apps_test::TempDir;

namespace {

const std::string kRef = apps_test::kSource + "/tests/io/ref/megatron_resume/";

int run(int np, const std::string& args, const std::string& log) {
  const std::string launcher =
      np > 1 ? "mpirun --allow-run-as-root --oversubscribe -np " + std::to_string(np) + " " : std::string();
  const std::string cmd = "OMP_NUM_THREADS=1 " + launcher + "apps/pretrain_gpt " + args + " > " + log + " 2>&1";
  const int rc = std::system(cmd.c_str());
  return WIFEXITED(rc) ? WEXITSTATUS(rc) : 128 + WTERMSIG(rc);
}

std::vector<double> losses(const std::string& log) {
  std::vector<double> v;
  const std::string text = slurp(log);
  const std::regex re("lm loss: ([0-9.eE+-]+)");
  for (auto it = std::sregex_iterator(text.begin(), text.end(), re); it != std::sregex_iterator(); ++it)
    v.push_back(std::stod((*it)[1]));
  return v;
}

nlohmann::json ref(const std::string& run) { return nlohmann::json::parse(slurp(kRef + run + "/ref.json")); }

// ref.json's flags with the data, the tokenizer and the checkpoint.
std::string flags(const std::string& run, const std::string& ckpt, const TempDir& tmp) {
  return ref(run).at("flags").get<std::string>() + " --data-path " + kRef + "data/tokens --tokenizer-model " + kRef +
         "data/tokenizer.json --data-cache-path " + tmp / "cache" + " --device cpu --load " + kRef + run + "/" + ckpt;
}

// Runs and compares the 5 losses after the checkpoint with megatron-core's.
std::vector<double> resume(const std::string& run, const std::string& ckpt, int np, const std::string& extra) {
  TempDir tmp("mresume");
  const std::string log = tmp / "run.log";
  const int rc = ::run(np, flags(run, ckpt, tmp) + " " + extra, log);
  if (rc != 0) MESSAGE(slurp(log));
  REQUIRE(rc == 0);
  CHECK(slurp(log).find("loaded checkpoint") != std::string::npos);
  return losses(log);
}

void check_equal(const std::string& run, const std::vector<double>& got) {
  const std::vector<double> want = ref(run).at("losses").get<std::vector<double>>();
  REQUIRE(got.size() == want.size());
  double worst = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    const double rel = std::fabs(got[i] - want[i]) / std::fabs(want[i]);
    worst = std::max(worst, rel);
    CHECK_MESSAGE(rel < 1e-5, "step ", i + 4, ": mpitron ", got[i], ", megatron-core ", want[i]);
  }
  MESSAGE(run, ": worst relative difference ", worst);
}

}  // namespace

TEST_CASE("Megatron GPT-2 style, torch_dist and legacy torch: the next 5 losses are megatron-core's") {
  check_equal("gpt2", resume("gpt2", "torch_dist", 1, ""));
  check_equal("gpt2", resume("gpt2", "torch", 1, "--ckpt-format torch"));
}

TEST_CASE("Megatron Llama style (GQA, SwiGLU, RMSNorm, rope, untied), torch_dist and torch, at TP2") {
  check_equal("llama", resume("llama", "torch_dist", 1, ""));
  check_equal("llama", resume("llama", "torch", 2, "--tensor-model-parallel-size 2"));
}

TEST_CASE("Megatron TP2xPP2 torch_dist resumed at TP1xPP1 DP2 ZeRO-3 and at TP2xPP2") {
  check_equal("gpt2_tp2pp2", resume("gpt2_tp2pp2", "torch_dist", 2, "--zero-stage 3"));
  check_equal("gpt2_tp2pp2",
              resume("gpt2_tp2pp2", "torch_dist", 4, "--tensor-model-parallel-size 2 --pipeline-model-parallel-size 2"));
}

TEST_CASE("the optimizer state matters: --no-load-optim gives the first loss and then others") {
  const std::vector<double> want = ref("gpt2").at("losses").get<std::vector<double>>();
  const std::vector<double> got = resume("gpt2", "torch_dist", 1, "--no-load-optim");
  REQUIRE(got.size() == want.size());
  CHECK(std::fabs(got[0] - want[0]) / want[0] < 1e-5);
  CHECK(std::fabs(got.back() - want.back()) / want.back() > 1e-4);
}

TEST_CASE("convert_checkpoint --direction megatron-to-mpitron writes the weights, and mpitron-to-megatron the way back") {
  TempDir tmp("mconvert");
  const std::string log = tmp / "conv.log";
  REQUIRE(apps_test::run_app("convert_checkpoint", "--direction megatron-to-mpitron --input " + kRef +
                                                        "gpt2/torch_dist --output " + tmp / "conv",
                             log) == 0);
  CHECK(slurp(tmp / "conv/latest_checkpointed_iteration.txt").find('0') != std::string::npos);
  // (tests/apps/test_megatron_export.cpp checks what megatron-core makes of it)
  CHECK(apps_test::run_app("convert_checkpoint", "--direction mpitron-to-megatron --input " + tmp / "conv" +
                                                     " --output " + tmp / "back",
                           log) == 0);
  CHECK(std::filesystem::exists(tmp / "back/iter_0000000/mp_rank_00/model_optim_rng.pt"));
}

TEST_CASE("ZeRO-1 over two ranks; --finetune starts a new run from the weights") {
  check_equal("llama", resume("llama", "torch_dist", 2, "--zero-stage 1"));
  TempDir tmp("mfinetune");
  const std::string log = tmp / "ft.log";
  REQUIRE(run(1, flags("gpt2", "torch_dist", tmp) + " --finetune", log) == 0);
  CHECK(losses(log).size() == 8);  // iterations 1 … 8: the iteration and samples start at 0
}

TEST_CASE("a Megatron checkpoint that disagrees with the run is refused naming the flag") {
  TempDir tmp("mrefuse");
  const std::string log = tmp / "r.log";
  CHECK(run(1, flags("gpt2", "torch_dist", tmp) + " --lr 2e-3", log) != 0);
  CHECK(slurp(log).find("is not --lr 0.002") != std::string::npos);
  CHECK(run(1, flags("gpt2", "torch_dist", tmp) + " --lr-decay-iters 10", log) != 0);
  CHECK(slurp(log).find("--lr-decay-iters") != std::string::npos);
  CHECK(run(1, flags("gpt2", "torch_dist", tmp) + " --ckpt-format torch", log) != 0);
  CHECK(slurp(log).find("--ckpt-format torch but") != std::string::npos);
  CHECK(run(1, flags("gpt2", "torch_dist", tmp) + " --hidden-size 16", log) != 0);
  CHECK(slurp(log).find("hidden") != std::string::npos);
}
