// tests/io/test_metrics_jsonl.cpp — one JSON object per line, flushed as written.
#include <doctest/doctest.h>

#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>

#include "io/metrics_jsonl.h"
#include "tests/io/io_test_util.h"

using namespace mpitron;
using namespace mpitron::io;

namespace {
std::vector<nlohmann::json> read_lines(const std::string& path) {
  std::ifstream in(path);
  std::vector<nlohmann::json> out;
  for (std::string line; std::getline(in, line);) out.push_back(nlohmann::json::parse(line));
  return out;
}
}  // namespace

TEST_CASE("metrics jsonl: lines are flushed as they are logged and appended across opens") {
  mpitron::test::ScratchDir dir("jsonl");
  const std::string path = dir / "logs/metrics.jsonl";
  {
    MetricsJsonl m(path);
    m.log(10, {{"lm loss", 7.25}, {"learning rate", 3e-4}, {"grad norm", NAN}});
    auto lines = read_lines(path);  // visible before close
    REQUIRE(lines.size() == 1);
    CHECK(lines[0]["iteration"] == 10);
    CHECK(lines[0]["lm loss"] == 7.25);
    CHECK(lines[0]["learning rate"] == 3e-4);
    CHECK(lines[0]["grad norm"].is_null());
  }
  {
    MetricsJsonl m(path);
    m.log_json(20, {{"tokens per second", 1234.5}, {"skipped", 0}});
  }
  auto lines = read_lines(path);
  REQUIRE(lines.size() == 2);
  CHECK(lines[1]["iteration"] == 20);
  CHECK(lines[1]["tokens per second"] == 1234.5);
  // Written order: "iteration" first.
  std::ifstream in(path);
  std::string first;
  std::getline(in, first);
  CHECK(first.rfind("{\"iteration\":10,\"lm loss\":7.25", 0) == 0);
  { MetricsJsonl m(path, /*truncate=*/true); }
  CHECK(read_lines(path).empty());
}

TEST_CASE("metrics jsonl: a resumed run drops the rows after its checkpoint and a torn last line") {
  mpitron::test::ScratchDir dir("jsonl_resume");
  const std::string path = dir / "metrics.jsonl";
  {
    MetricsJsonl m(path);
    for (int it = 1; it <= 6; ++it) m.log(it, {{"lm loss", 10.0 - it}});
  }
  { std::ofstream(path, std::ios::app) << "{\"iteration\": 7, \"lm lo"; }  // a crash mid-line
  {
    MetricsJsonl m(path);
    m.drop_after(4);  // the checkpoint the run resumed: iteration 4
    m.log(5, {{"lm loss", 4.5}});
  }
  const auto lines = read_lines(path);
  REQUIRE(lines.size() == 5);
  for (int i = 0; i < 5; ++i) CHECK(lines[static_cast<size_t>(i)]["iteration"] == i + 1);
  CHECK(lines[4]["lm loss"] == 4.5);
  {
    MetricsJsonl m(path);
    m.drop_after(10);  // nothing after it: the file is left as it is
  }
  CHECK(read_lines(path).size() == 5);
}
