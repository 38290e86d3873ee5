// pretrain_gpt under mpirun with --zero-stage 3 and --async-save: the background thread writes
// each rank's shards while the training collectives go on (MPI_THREAD_MULTIPLE, which
// pretrain_gpt asks for with --async-save); the run logs the synchronous run's losses, and a
// run resumed from the asynchronous checkpoint logs the uninterrupted run's next losses.
// (The test executables' own MPI main has no MPI_THREAD_MULTIPLE: the apps run here.)
#include <doctest/doctest.h>

#include <regex>

#include "apps_test_util.h"

using apps_test::slurp;
using apps_test::TempDir;

namespace {

int run_np2(const std::string& args, const std::string& log) {
  const std::string cmd = "OMP_NUM_THREADS=1 mpirun --allow-run-as-root --oversubscribe -np 2 apps/pretrain_gpt " + args +
                          " > " + log + " 2>&1";
  const int rc = std::system(cmd.c_str());
  return WIFEXITED(rc) ? WEXITSTATUS(rc) : 128 + WTERMSIG(rc);
}

// The "lm loss: X" of each iteration line, as printed.
std::vector<std::string> losses(const std::string& log) {
  std::vector<std::string> v;
  const std::string text = slurp(log);
  const std::regex re("lm loss: ([0-9.eE+-]+)");
  for (auto it = std::sregex_iterator(text.begin(), text.end(), re); it != std::sregex_iterator(); ++it)
    v.push_back((*it)[1]);
  return v;
}

std::string flags(int iters) {
  const std::string gpt2 = apps_test::kSource + "/assets/gpt2/";
  return "--num-layers 2 --hidden-size 32 --num-attention-heads 4 --seq-length 16 --max-position-embeddings 16 "
         "--micro-batch-size 2 --global-batch-size 8 --lr 3e-3 --lr-warmup-iters 1 --hidden-dropout 0.1 "
         "--mock-data --vocab-file " + gpt2 + "gpt2-vocab.json --merge-file " + gpt2 + "gpt2-merges.txt "
         "--log-interval 1 --eval-iters 0 --seed 5 --device cpu --zero-stage 3 --train-iters " + std::to_string(iters);
}

}  // namespace

TEST_CASE("pretrain_gpt -np 2 --zero-stage 3 --async-save: the synchronous losses; resuming from its checkpoint is bitwise") {
  TempDir tmp("zero3_async");
  REQUIRE(run_np2(flags(6) + " --save " + tmp / "sync" + " --save-interval 3", tmp / "sync.log") == 0);
  const std::vector<std::string> whole = losses(tmp / "sync.log");
  REQUIRE(whole.size() == 6);
  // Saved in the background at iteration 3 (the run exits there, waiting for the write).
  REQUIRE(run_np2(flags(6) + " --async-save --save " + tmp / "async" + " --save-interval 3 --exit-interval 3",
                  tmp / "async.log") == 0);
  const std::vector<std::string> first = losses(tmp / "async.log");
  REQUIRE(first.size() == 3);
  for (size_t i = 0; i < 3; ++i) CHECK(first[i] == whole[i]);
  CHECK(slurp(tmp / "async" + "/latest_checkpointed_iteration.txt").find('3') != std::string::npos);
  // Resumed from the asynchronous checkpoint (shards written by both ranks' threads).
  REQUIRE(run_np2(flags(6) + " --async-save --load " + tmp / "async" + " --save " + tmp / "async", tmp / "resumed.log") == 0);
  const std::vector<std::string> rest = losses(tmp / "resumed.log");
  REQUIRE(rest.size() == 3);
  for (size_t i = 0; i < 3; ++i) CHECK_MESSAGE(rest[i] == whole[i + 3], "iteration ", i + 4, ": ", rest[i], " vs ", whole[i + 3]);
  CHECK(slurp(tmp / "resumed.log").find("ZeRO-3") != std::string::npos);
}
