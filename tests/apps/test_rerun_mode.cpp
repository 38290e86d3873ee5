// tests/apps/test_rerun_mode.cpp — --rerun-mode validate_results (issue 47): a NaN put
// into one rank's loss and gradient at one step (MPITRON_FAULT nan, a transient fault:
// the re-run runs clean) is a fault of that rank's hardware: the job ends with exit code
// 16 naming the rank and its host, and leaves a failure record for the launcher; a
// learning rate that explodes gives a NaN the re-run reproduces: the model's, the run
// stops as --check-for-nan-in-loss-and-grad says (exit 1). Real mpirun, DP2 on the CPU.
// Also: a malformed MPITRON_FAULT is refused naming the variable.
// mpitron-test: label=reliability
// mpitron-test: timeout=300
#include <doctest/doctest.h>

#include <cstdlib>
#include <filesystem>
#include <string>

#include <nlohmann/json.hpp>

#include "tests/apps/apps_test_util.h"
#include "tests/model/model_test_util.h"

namespace fs = std::filesystem;

namespace {

int run_job(const std::string& env, const std::string& flags, const std::string& log) {
  const std::string cmd = "OMP_NUM_THREADS=1 " + env +
                          " mpirun --allow-run-as-root --oversubscribe --mca btl self,vader,tcp -np 2 apps/pretrain_gpt "
                          "--num-layers 2 --hidden-size 16 --num-attention-heads 2 --seq-length 16 "
                          "--max-position-embeddings 16 --micro-batch-size 2 --global-batch-size 4 --train-iters 8 "
                          "--split 1,0,0 --log-interval 1 --eval-iters 0 --device cpu " + flags + " > " + log + " 2>&1";
  const int rc = std::system(cmd.c_str());
  return WIFEXITED(rc) ? WEXITSTATUS(rc) : 128 + WTERMSIG(rc);
}

}  // namespace

TEST_CASE("--rerun-mode validate_results: a one-rank NaN is a fault, an exploding learning rate the model's") {
  REQUIRE_MESSAGE(fs::exists("apps/pretrain_gpt"), "build pretrain_gpt first (the test runs from the build dir)");
  apps_test::TempDir dir("rerun_mode");
  const std::string data = mpitron::testing::write_toy_dataset(dir.path, 4, 200);
  const std::string common = "--data-path " + data + " --rerun-mode validate_results --lr 1e-3";

  SUBCASE("a NaN in rank 1's gradient at step 5, not reproduced: exit 16 naming rank 1 and its host") {
    const int rc = run_job("MPITRON_FAULT=nan:rank=1:step=5", common + " --save " + (dir / "ckpt"), dir / "nan.log");
    const std::string log = apps_test::slurp(dir / "nan.log");
    INFO(log);
    CHECK(rc == 16);
    CHECK(log.find("iteration 5: the loss (nan) and the gradient norm (nan) were not reproduced") != std::string::npos);
    CHECK(log.find("a fault of the hardware, not the model") != std::string::npos);
    CHECK(log.find("computed differently: world rank 1 on host ") != std::string::npos);
    CHECK(log.find("world rank 0 on host") == std::string::npos);  // rank 0 computed the same both times
    // The record the launcher reads.
    const nlohmann::json r = nlohmann::json::parse(apps_test::slurp(dir / "ckpt/failures/rank-0.json"));
    CHECK(r.at("cause") == "host_fault");
    CHECK(r.at("rank") == 1);
    CHECK(!r.at("host").get<std::string>().empty());
    CHECK(r.at("phase") == "step");
    CHECK(r.at("step") == 5);
    CHECK(r.at("exit_code") == 16);
  }
  SUBCASE("the same NaN without --rerun-mode: the old rule, the run stops (exit 1)") {
    const int rc = run_job("MPITRON_FAULT=nan:rank=1:step=5", "--data-path " + data + " --lr 1e-3", dir / "off.log");
    const std::string log = apps_test::slurp(dir / "off.log");
    INFO(log);
    CHECK(rc == 1);
    CHECK(log.find("iteration 5: the loss (nan)") != std::string::npos);
    CHECK(log.find("re-run") == std::string::npos);
  }
  SUBCASE("an exploding learning rate: reproduced, the model's (exit 1, no host fault)") {
    const int rc = run_job("", "--data-path " + data + " --rerun-mode validate_results --lr 1e30 --save " + (dir / "lr"),
                           dir / "lr.log");
    const std::string log = apps_test::slurp(dir / "lr.log");
    INFO(log);
    CHECK(rc == 1);
    CHECK(log.find("reproduced by a re-run of the same step on the same data") != std::string::npos);
    CHECK(log.find("the model's, not a fault") != std::string::npos);
    CHECK(log.find("not reproduced") == std::string::npos);
    CHECK(log.find("not finite; the update was not applied") != std::string::npos);
    const nlohmann::json r = nlohmann::json::parse(apps_test::slurp(dir / "lr/failures/rank-0.json"));
    CHECK(r.at("cause") == "error");
  }
  SUBCASE("a malformed MPITRON_FAULT is refused naming it") {
    const int rc = run_job("MPITRON_FAULT=explode:rank=1", "--data-path " + data + " --lr 1e-3", dir / "bad.log");
    const std::string log = apps_test::slurp(dir / "bad.log");
    INFO(log);
    CHECK(rc == 1);
    CHECK(log.find("MPITRON_FAULT=explode:rank=1: unknown fault kind 'explode'") != std::string::npos);
  }
}
