// tests/apps/test_straggler.cpp — --log-straggler (issue 47): a rank made 2x slower
// (MPITRON_FAULT slow, parallel/fault_injection.h) is named, with its host, as the
// slowest at the log lines within 5 log intervals, on the log line and in the metrics
// JSONL; its score against the fastest rank is near 0.5. Real mpirun, DP2 on the CPU.
// mpitron-test: label=reliability
// mpitron-test: timeout=300
#include <doctest/doctest.h>

#include <cstdlib>
#include <filesystem>
#include <sstream>
#include <string>

#include <nlohmann/json.hpp>

#include "tests/apps/apps_test_util.h"
#include "tests/model/model_test_util.h"

namespace fs = std::filesystem;

TEST_CASE("--log-straggler names a 2x slow rank and its host within 5 log intervals") {
  REQUIRE_MESSAGE(fs::exists("apps/pretrain_gpt"), "build pretrain_gpt first (the test runs from the build dir)");
  apps_test::TempDir dir("straggler");
  const std::string data = mpitron::testing::write_toy_dataset(dir.path, 6, 200);
  const std::string cmd =
      "OMP_NUM_THREADS=1 MPITRON_FAULT=slow:rank=1:factor=2 mpirun --allow-run-as-root --oversubscribe "
      "--mca btl self,vader,tcp -np 2 apps/pretrain_gpt --num-layers 2 --hidden-size 32 --num-attention-heads 2 "
      "--seq-length 32 --max-position-embeddings 32 --micro-batch-size 2 --global-batch-size 16 --train-iters 10 "
      "--lr 1e-3 --data-path " + data + " --split 1,0,0 --log-interval 2 --eval-iters 0 --device cpu --log-straggler "
      "--straggler-minmax-count 1 --metrics-file " + (dir / "metrics.jsonl") + " > " + (dir / "log") + " 2>&1";
  const int rc = std::system(cmd.c_str());
  const std::string log = apps_test::slurp(dir / "log");
  INFO(log);
  REQUIRE(WIFEXITED(rc));
  REQUIRE(WEXITSTATUS(rc) == 0);
  // The five log lines: rank 1 the slowest in most of them (timings on a shared CPU are noisy).
  int lines = 0, named = 0;
  double worst = 1;
  std::istringstream in(apps_test::slurp(dir / "metrics.jsonl"));
  std::string line;
  while (std::getline(in, line)) {
    const nlohmann::json j = nlohmann::json::parse(line);
    if (!j.contains("straggler_slowest")) continue;
    ++lines;
    const nlohmann::json& s = j["straggler_slowest"].at(0);
    CHECK(!s.at("host").get<std::string>().empty());
    CHECK(j["straggler_scores"].size() == 2);
    if (s.at("rank") == 1) {
      ++named;
      worst = std::min(worst, s.at("score").get<double>());
    }
  }
  CHECK(lines == 5);
  CHECK(named >= 3);
  CHECK(worst < 0.8);  // 2x slower: a score near 0.5
  CHECK(log.find("straggler: compute per iteration, slowest rank 1 on ") != std::string::npos);
}
