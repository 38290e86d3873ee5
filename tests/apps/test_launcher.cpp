// tests/apps/test_launcher.cpp — training that finishes by itself (issue 47): a 4-rank
// run (DP2 x TP2, CPU) under tools/mpitron-launch with rank 1 killed at step 30 and rank
// 2 frozen at step 60 (MPITRON_FAULT, parallel/fault_injection.h) reaches --train-iters
// 100 by itself; its loss curve equals an uninterrupted run's at every iteration (the
// metrics JSONL has each iteration once), the launcher's log names both causes and hosts,
// and each failed host is left out of the next attempt's hostfile. The hostfile's names
// are aliases of this machine (--local-alias): every rank runs here.
// mpitron-test: label=reliability
// mpitron-test: timeout=900
#include <doctest/doctest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "tests/apps/apps_test_util.h"
#include "tests/model/model_test_util.h"

namespace fs = std::filesystem;
using mpitron::str;

namespace {

const std::string kMpirun = "mpirun --allow-run-as-root --mca btl self,vader,tcp";

// The tiny DP2 x TP2 job's flags (a metrics row per iteration; with `save`, a checkpoint
// every 20 iterations: the kill at 30 goes back to 20, the freeze at 60 to 40).
std::string job_flags(const std::string& data, const std::string& save, const std::string& metrics) {
  return "--num-layers 2 --hidden-size 16 --num-attention-heads 2 --seq-length 16 --max-position-embeddings 16 "
         "--micro-batch-size 2 --global-batch-size 8 --train-iters 100 --lr 1e-3 --tensor-model-parallel-size 2 "
         "--data-path " + data + " --split 1,0,0 --log-interval 1 --eval-iters 0 --device cpu --seed 5 --metrics-file " +
         metrics + (save.empty() ? "" : " --save " + save + " --save-interval 20");
}

int shell(const std::string& cmd) {
  const int rc = std::system(cmd.c_str());
  return WIFEXITED(rc) ? WEXITSTATUS(rc) : 128 + WTERMSIG(rc);
}

// iteration -> the row's loss, grad norm and consumed samples; every iteration at most once.
std::map<int64_t, nlohmann::json> rows_of(const std::string& path) {
  std::map<int64_t, nlohmann::json> out;
  std::istringstream in(apps_test::slurp(path));
  std::string line;
  while (std::getline(in, line)) {
    const nlohmann::json j = nlohmann::json::parse(line);
    const int64_t it = j.at("iteration").get<int64_t>();
    CHECK_MESSAGE(!out.count(it), "iteration ", it, " twice in ", path);
    out[it] = nlohmann::json{{"loss", j.at("lm_loss")}, {"grad_norm", j.at("grad_norm")},
                             {"consumed", j.at("consumed_samples")}, {"lr", j.at("lr")}};
  }
  return out;
}

}  // namespace

TEST_CASE("mpitron-launch: a kill at step 30 and a freeze at step 60 restart by themselves to --train-iters") {
  REQUIRE_MESSAGE(fs::exists("apps/pretrain_gpt"), "build pretrain_gpt first (the test runs from the build dir)");
  apps_test::TempDir dir("launcher");
  const std::string data = mpitron::testing::write_toy_dataset(dir.path, 3, 300);

  // The uninterrupted run.
  const std::string ref_cmd = "OMP_NUM_THREADS=1 " + kMpirun + " --oversubscribe -np 4 apps/pretrain_gpt " +
                              job_flags(data, "", dir / "ref_metrics.jsonl") + " > " + (dir / "ref.log") +
                              " 2>&1";
  REQUIRE_MESSAGE(shell(ref_cmd) == 0, apps_test::slurp(dir / "ref.log"));
  const auto ref = rows_of(dir / "ref_metrics.jsonl");
  REQUIRE(ref.size() == 100);

  // Four hosts of two slots: ranks 0,1 on n1 and 2,3 on n2 at first.
  {
    std::ofstream h(dir / "hosts");
    h << "n1 slots=2\nn2 slots=2\nn3 slots=2\nn4 slots=2\n";
  }
  const std::string launch =
      "OMP_NUM_THREADS=1 MPITRON_COMM_TIMEOUT_S=5 MPITRON_FAULT='kill:rank=1:step=30:attempt=0;"
      "freeze:rank=2:step=60:attempt=1' python3 " + apps_test::kSource + "/tools/mpitron-launch --hostfile " +
      (dir / "hosts") + " --np 4 --local-alias --max-restarts 3 --backoff 1 --launcher-args '--allow-run-as-root "
      "--mca btl self,vader,tcp' -- apps/pretrain_gpt " + job_flags(data, dir / "ckpt", dir / "metrics.jsonl") +
      " > " + (dir / "launch.out") + " 2>&1";
  const int rc = shell(launch);
  const std::string log = apps_test::slurp(dir / "ckpt/launch/launch.log");
  INFO("launcher log:\n", log);
  INFO("output tail:\n", [&] {
    const std::string o = apps_test::slurp(dir / "launch.out");
    return o.substr(o.size() > 5000 ? o.size() - 5000 : 0);
  }());
  CHECK(rc == 0);
  // Both causes, with their ranks and hosts, and the exclusions.
  CHECK(log.find("attempt 0 failed") != std::string::npos);
  CHECK(log.find("killed by signal 9") != std::string::npos);
  CHECK(log.find("of rank 1 on host n1") != std::string::npos);
  CHECK(log.find("excluding host n1") != std::string::npos);
  CHECK(log.find("attempt 1 failed") != std::string::npos);
  CHECK(log.find("frozen or hung") != std::string::npos);
  CHECK(log.find("of rank 2 on host n3 (phase step, step 60)") != std::string::npos);
  CHECK(log.find("excluding host n3") != std::string::npos);
  CHECK(log.find("attempt 2 finished (exit 0)") != std::string::npos);
  CHECK(log.find("restart 1/3 in 1 s from checkpoint iteration 20") != std::string::npos);
  CHECK(log.find("restart 2/3 in 2 s from checkpoint iteration 40") != std::string::npos);
  // The hostfiles the attempts ran with.
  CHECK(apps_test::slurp(dir / "ckpt/launch/attempt-1.hosts") == "n2 slots=2\nn3 slots=2\nn4 slots=2\n");
  CHECK(apps_test::slurp(dir / "ckpt/launch/attempt-2.hosts") == "n2 slots=2\nn4 slots=2\n");
  CHECK(apps_test::slurp(dir / "ckpt/latest_checkpointed_iteration.txt").find("100") == 0);
  // The curve: every iteration once, equal to the uninterrupted run's.
  const auto got = rows_of(dir / "metrics.jsonl");
  CHECK(got.size() == 100);
  int differ = 0;
  for (const auto& [it, row] : ref) {
    const auto g = got.find(it);
    if (g == got.end() || g->second != row) {
      if (differ++ < 5) MESSAGE("iteration ", it, ": ", row.dump(), " vs ", g == got.end() ? "missing" : g->second.dump());
    }
  }
  CHECK(differ == 0);
}
