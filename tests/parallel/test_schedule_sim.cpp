// tests/parallel/test_schedule_sim.cpp — the schedule simulator: bubble
// fractions of the built-ins equal the textbook formulas, timelines respect
// every dependency with p2p costs, the SVG is well-formed, and the
// schedule_sim app (run as built, <build>/apps/schedule_sim) prints, draws and
// rejects.
#include <doctest/doctest.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include "core/error.h"
#include "parallel/schedule.h"
#include "parallel/schedule_sim.h"

using namespace mpitron;
using namespace mpitron::parallel;

namespace {

std::string app_path(const std::string& name) {
  for (const char* dir : {"apps/", "../apps/", "../../apps/"}) {
    std::string p = std::string(dir) + name;
    if (std::filesystem::exists(p)) return std::filesystem::absolute(p).string();
  }
  return "";
}

int run_command(const std::string& cmd, std::string* output) {
  FILE* p = popen((cmd + " 2>&1").c_str(), "r");
  if (!p) return -1;
  char buf[4096];
  size_t n;
  output->clear();
  while ((n = fread(buf, 1, sizeof buf, p)) > 0) output->append(buf, n);
  int st = pclose(p);
  return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

std::string read_all(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::ostringstream os;
  os << f.rdbuf();
  return os.str();
}

// A small XML well-formedness check: declaration, balanced tags, one root
// <svg>, quoted attributes. Returns "" or what is wrong; counts elements by name.
std::string xml_problem(const std::string& xml, std::map<std::string, int>* counts) {
  std::vector<std::string> stack;
  size_t i = 0;
  bool root_seen = false;
  while ((i = xml.find('<', i)) != std::string::npos) {
    size_t j = xml.find('>', i);
    if (j == std::string::npos) return "unterminated tag";
    std::string tag = xml.substr(i + 1, j - i - 1);
    i = j + 1;
    if (tag.empty()) return "empty tag";
    if (tag[0] == '?') continue;  // declaration
    if (tag[0] == '/') {
      if (stack.empty() || stack.back() != tag.substr(1)) return "mismatched </" + tag.substr(1) + ">";
      stack.pop_back();
      continue;
    }
    const bool self_closing = tag.back() == '/';
    std::string name = tag.substr(0, tag.find_first_of(" /"));
    if (stack.empty()) {
      if (root_seen) return "second root element <" + name + ">";
      if (name != "svg") return "root is <" + name + ">, not <svg>";
      root_seen = true;
    }
    size_t quotes = std::count(tag.begin(), tag.end(), '"');
    if (quotes % 2) return "odd quotes in <" + name + ">";
    ++(*counts)[name];
    if (!self_closing) stack.push_back(name);
  }
  if (!stack.empty()) return "unclosed <" + stack.back() + ">";
  if (!root_seen) return "no <svg> root";
  return "";
}

}  // namespace

TEST_CASE("bubble of GPipe and 1F1B is (p-1)/(m+p-1) with equal stage costs") {
  for (int p = 1; p <= 8; ++p)
    for (int m = 1; m <= 16; ++m)
      for (const Costs& c : {Costs{1, 2, 0}, Costs{1, 1, 0}, Costs{0.5, 1.75, 0}}) {
        for (const Schedule& s : {gpipe_schedule(p, m), one_f_one_b_schedule(p, m)}) {
          Timeline t = simulate_schedule(s, c);
          INFO(s.name, " pp ", p, " m ", m, " F ", c.forward, " B ", c.backward);
          CHECK(t.bubble_fraction == doctest::Approx(formula_bubble_fraction(p, m)).epsilon(1e-12));
          CHECK(t.total == doctest::Approx((m + p - 1) * (c.forward + c.backward)));
          CHECK(t.ideal == doctest::Approx(m * (c.forward + c.backward)));
        }
      }
}

TEST_CASE("interleaved bubble is (p-1)/(v*m + p-1): v times smaller in bubble time") {
  int checked = 0;
  for (int p = 2; p <= 8; ++p)
    for (int v = 1; v <= 4; ++v)
      for (int m = p; m <= 4 * p; m += p)
        for (const Costs& c : {Costs{1, 2, 0}, Costs{1, 3, 0}}) {
          Timeline t = simulate_schedule(interleaved_schedule(p, m, v), c);
          INFO("pp ", p, " m ", m, " v ", v, " F ", c.forward, " B ", c.backward);
          CHECK(t.bubble_fraction == doctest::Approx(formula_bubble_fraction(p, m, v)).epsilon(1e-12));
          // Per-chunk costs: total = (v*m + p - 1) chunk-steps of (F + B).
          CHECK(t.total == doctest::Approx((v * m + p - 1) * (c.forward + c.backward)));
          ++checked;
        }
  CHECK(checked > 100);
  // Same model, same per-stage cost: splitting into v chunks shrinks the bubble.
  const double b1 = simulate_schedule(one_f_one_b_schedule(4, 8), {1, 2, 0}).bubble_fraction;
  const double b2 = simulate_schedule(interleaved_schedule(4, 8, 2), {0.5, 1, 0}).bubble_fraction;
  CHECK(b2 < b1);
  CHECK(b1 == doctest::Approx(3.0 / 11));
  CHECK(b2 == doctest::Approx(3.0 / 19));
}

TEST_CASE("timelines respect every dependency, with p2p costs") {
  const Costs c{1, 2, 0.25};
  for (const Schedule& s : {gpipe_schedule(4, 6), one_f_one_b_schedule(4, 6), interleaved_schedule(4, 8, 2),
                            interleaved_schedule(2, 4, 3), one_f_one_b_schedule(3, 2)}) {
    INFO(s.name, " pp ", s.pp, " m ", s.micro_batches, " v ", s.virtual_stages);
    Timeline t = simulate_schedule(s, c);
    // end time of F and B per (micro-batch, global stage)
    std::map<std::pair<int, int>, double> f_end, b_end, f_start, b_start;
    for (int r = 0; r < s.pp; ++r) {
      double last = 0;
      for (const auto& e : t.ranks[r]) {
        CHECK(e.start >= last - 1e-12);  // a rank does one thing at a time
        CHECK(e.end >= e.start);
        last = e.end;
        if (!e.compute) continue;
        const Action& a = s.ranks[r][e.first];
        const auto key = std::make_pair(a.mb, s.stage(r, a.chunk));
        (a.op == Op::Forward ? f_end : b_end)[key] = e.end;
        (a.op == Op::Forward ? f_start : b_start)[key] = e.start;
      }
      CHECK(t.finish[r] == doctest::Approx(last));
    }
    const int S = s.stages();
    for (int mb = 0; mb < s.micro_batches; ++mb)
      for (int st = 0; st < S; ++st) {
        if (st > 0) CHECK(f_start[{mb, st}] >= f_end[{mb, st - 1}] + c.p2p - 1e-9);
        if (st < S - 1) CHECK(b_start[{mb, st}] >= b_end[{mb, st + 1}] + c.p2p - 1e-9);
        CHECK(b_start[{mb, st}] >= f_end[{mb, st}]);
      }
    // p2p costs only add time.
    CHECK(t.total > simulate_schedule(s, {1, 2, 0}).total);
  }
}

TEST_CASE("simulate rejects a bad schedule with the checker's message; bad costs") {
  Schedule s = parse_schedule("pp 1\nmicro-batches 2\nrank 0: F0 B1 F1 B0\n", "bad.sched");
  CHECK_THROWS_WITH_AS(simulate_schedule(s), doctest::Contains("rank 0, action 1 (B1.0, line 3:12): B before its F"),
                       Error);
  CHECK_THROWS_AS(simulate_schedule(one_f_one_b_schedule(2, 2), {0, 2, 0}), Error);
}

TEST_CASE("text timeline and list") {
  Schedule s = one_f_one_b_schedule(2, 2);
  Timeline t = simulate_schedule(s);
  // F = 1, B = 2: rank 0 waits 2 units for B0's gradient (rank 1 runs F0, B0), then 1 for B1's.
  const std::string text = timeline_text(s, t);
  CHECK(text.find("rank 0 |F0 F1 ......B0    ...B1    |\n") != std::string::npos);
  CHECK(text.find("rank 1 |...F0 B0    F1 B1    ......|\n") != std::string::npos);
  CHECK(text.find("one time unit = 3 characters") != std::string::npos);
  const std::string list = timeline_list(s, t);
  CHECK(list.find("rank 0: F0.0[0,1) F1.0[1,2) SA1.0>1+RG0.0<1[2,4) B0.0[4,6) RG1.0<1[6,7) B1.0[7,9)\n") == 0);
  CHECK(list.find("rank 1: RA0.0<0[0,1) F0.0[1,2) B0.0[2,4) F1.0[4,5) B1.0[5,7)\n") != std::string::npos);
  // Too wide for labelled boxes: one character per unit.
  const std::string narrow = timeline_text(s, t, 20);
  CHECK(narrow.find("rank 0 |FF..BB.BB|") != std::string::npos);
  CHECK(narrow.find("rank 1 |.FBBFBB..|") != std::string::npos);
}

TEST_CASE("SVG timeline is well-formed, one box per F/B") {
  for (const Schedule& s : {one_f_one_b_schedule(4, 8), interleaved_schedule(4, 8, 2)}) {
    Timeline t = simulate_schedule(s, {1, 2, 0.1});
    const std::string svg = timeline_svg(s, t);
    CHECK(svg.rfind("<?xml", 0) == 0);
    std::map<std::string, int> counts;
    CHECK(xml_problem(svg, &counts) == "");
    int boxes = 0, waits = 0;
    for (const auto& row : t.ranks)
      for (const auto& e : row) {
        if (e.compute) ++boxes;
        else if (e.end > e.start) ++waits;
      }
    CHECK(boxes == 2 * s.micro_batches * s.virtual_stages * s.pp);
    CHECK(counts["rect"] == 1 + boxes + waits);  // background + boxes + p2p waits
    CHECK(counts["title"] == boxes + waits);
  }
}

TEST_CASE("schedule_sim app: prints, draws, writes schedules, rejects") {
  const std::string app = app_path("schedule_sim");
  REQUIRE_MESSAGE(!app.empty(), "schedule_sim not found under <build>/apps: build it (cmake --build <build> --target "
                                "schedule_sim) before running this test");
  const std::string dir = (std::filesystem::temp_directory_path() / "mpitron_test_schedule_sim").string();
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  std::string out;

  SUBCASE("a built-in, with SVG and the schedule written out") {
    REQUIRE(run_command(app + " --schedule interleaved --pp 4 --micro-batches 8 --virtual-stages 2 --svg " + dir +
                            "/t.svg --write-schedule " + dir + "/t.sched",
                        &out) == 0);
    CHECK(out.find("check: ok") != std::string::npos);
    CHECK(out.find("bubble fraction   0.1579") != std::string::npos);
    CHECK(out.find("formula           0.1579") != std::string::npos);
    CHECK(out.find("rank 3 |") != std::string::npos);
    std::map<std::string, int> counts;
    const std::string svg = read_all(dir + "/t.svg");
    CHECK(xml_problem(svg, &counts) == "");
    int boxes = 0;
    for (size_t at = 0; (at = svg.find("<title>", at)) != std::string::npos; ++at)
      if (svg.compare(at + 7, 1, "F") == 0 || svg.compare(at + 7, 1, "B") == 0) ++boxes;
    CHECK(boxes == 2 * 8 * 2 * 4);  // F and B of 8 micro-batches x 2 chunks x 4 ranks
    // The written schedule reads back and simulates the same.
    REQUIRE(run_command(app + " --schedule-file " + dir + "/t.sched", &out) == 0);
    CHECK(out.find("bubble fraction   0.1579") != std::string::npos);
  }
  SUBCASE("a bad file is rejected with the checker's message") {
    std::ofstream(dir + "/bad.sched") << "pp 2\nmicro-batches 2\np2p explicit\n"
                                         "rank 0: F0 SA0.0>1 F1 SA1.0>1 RG0.0<1 B0 RG1.0<1 B1\n"
                                         "rank 1: RA0.0<0 F0 B0 SG0.0>0 RA1.0<0 F1 B1 SG1.0>0\n";
    CHECK(run_command(app + " --schedule-file " + dir + "/bad.sched", &out) == 1);
    CHECK(out.find("rejected: rank 0, action 3 (SA1.0>1, line 4:23): deadlock") != std::string::npos);
  }
  SUBCASE("Megatron's micro-batch rule and usage errors") {
    CHECK(run_command(app + " --schedule interleaved --pp 4 --micro-batches 6 --virtual-stages 2", &out) == 1);
    CHECK(out.find("not divisible") != std::string::npos);
    CHECK(run_command(app + " --pp 4 --micro-batches 6", &out) == 2);
    CHECK(run_command(app + " --schedule 1f1b --pp 4", &out) == 2);
  }
  std::filesystem::remove_all(dir);
}
