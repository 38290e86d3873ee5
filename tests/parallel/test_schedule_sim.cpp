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

// ---- zero bubble: split backward, V placement, measured costs -----------------------

namespace {

Costs equal_fbw() {  // F = B = W = 1 per chunk; an unsplit backward costs B + W = 2
  Costs c;
  c.forward = 1;
  c.backward = 1;
  c.weight = 1;
  return c;
}

}  // namespace

TEST_CASE("zero bubble, pp 4, m 8, F = B = W: zb-h1 below 1F1B, zbv below interleaved (simulated)") {
  const Costs c = equal_fbw();
  const Timeline one = simulate_schedule(builtin_schedule("1f1b", 4, 8), c);
  const Timeline h1 = simulate_schedule(builtin_schedule("zb-h1", 4, 8), c);
  const Timeline il = simulate_schedule(builtin_schedule("interleaved", 4, 8, 2), c);
  const Timeline zv = simulate_schedule(builtin_schedule("zbv", 4, 8, 2), c);
  INFO("1f1b ", one.bubble_fraction, " zb-h1 ", h1.bubble_fraction, " interleaved ", il.bubble_fraction, " zbv ",
       zv.bubble_fraction);
  CHECK(h1.bubble_fraction < one.bubble_fraction);
  CHECK(zv.bubble_fraction < il.bubble_fraction);
  // Same work per rank, so the step times order the same way.
  CHECK(one.ideal == doctest::Approx(h1.ideal));
  CHECK(h1.total < one.total);
  CHECK(zv.total < il.total);
  // The analytic values (closed forms for equal costs) are what the simulator finds.
  CHECK(one.bubble_fraction == doctest::Approx(analytic_bubble_fraction("1f1b", 4, 8)).epsilon(1e-12));
  CHECK(h1.bubble_fraction == doctest::Approx(analytic_bubble_fraction("zb-h1", 4, 8)).epsilon(1e-12));
  CHECK(il.bubble_fraction == doctest::Approx(analytic_bubble_fraction("interleaved", 4, 8, 2)).epsilon(1e-12));
  CHECK(zv.bubble_fraction == doctest::Approx(analytic_bubble_fraction("zbv", 4, 8, 2)).epsilon(1e-12));
  // Memory: zb-h1 holds 1F1B's peak (rank 0's, pp) on every rank; zbv at most 2 pp chunks (pp micro-batches).
  CHECK(*std::max_element(h1.peak_in_flight.begin(), h1.peak_in_flight.end()) ==
        *std::max_element(one.peak_in_flight.begin(), one.peak_in_flight.end()));
  CHECK(*std::max_element(zv.peak_in_flight.begin(), zv.peak_in_flight.end()) <= 8);
}

TEST_CASE("zero-bubble closed forms hold for pp 2, 4, 8 and m = pp, 2pp, 3pp") {
  const Costs c = equal_fbw();
  for (int p : {2, 4, 8})
    for (int m : {p, 2 * p, 3 * p}) {
      INFO("pp ", p, " m ", m);
      const Timeline h1 = simulate_schedule(zb_h1_schedule(p, m), c);
      CHECK(h1.total == doctest::Approx(3 * m + p - 1));
      CHECK(h1.bubble_fraction == doctest::Approx(analytic_bubble_fraction("zb-h1", p, m)).epsilon(1e-12));
      const Timeline zv = simulate_schedule(zbv_schedule(p, m), c);
      CHECK(zv.total == doctest::Approx(6 * m + p - 1));
      CHECK(zv.bubble_fraction == doctest::Approx(analytic_bubble_fraction("zbv", p, m, 2)).epsilon(1e-12));
      const Timeline one = simulate_schedule(one_f_one_b_schedule(p, m), c);
      CHECK(one.total == doctest::Approx(3 * (m + p - 1)));
      const Timeline il = simulate_schedule(interleaved_schedule(p, m, 2), c);
      CHECK(il.total == doctest::Approx(3 * (2 * m + p - 1)));
    }
}

TEST_CASE("costs: B and W of split and unsplit schedules; per-stage costs move the timeline") {
  Costs legacy;  // backward 2, weight unset
  CHECK(legacy.cost(Op::Backward, 0, false) == 2);
  CHECK(legacy.cost(Op::Backward, 0, true) == 1);
  CHECK(legacy.cost(Op::Weight, 0, true) == 1);
  Costs c = equal_fbw();
  c.backward = 1.5;
  c.weight = 0.5;
  CHECK(c.cost(Op::Backward, 3, false) == 2);
  CHECK(c.cost(Op::Backward, 3, true) == 1.5);
  CHECK(c.cost(Op::Weight, 3, true) == 0.5);
  // A slow last stage: every rank waits for it.
  Schedule s = zb_h1_schedule(4, 8);
  Costs slow = equal_fbw();
  slow.stage_forward = {1, 1, 1, 2};
  slow.stage_backward = {1, 1, 1, 2};
  slow.stage_weight = {1, 1, 1, 2};
  const Timeline t = simulate_schedule(s, slow);
  CHECK(t.ideal == doctest::Approx(8 * 6));
  CHECK(t.total > simulate_schedule(s, equal_fbw()).total);
  CHECK(t.busy[3] == doctest::Approx(48));
  CHECK(t.busy[0] == doctest::Approx(24));
  // Timelines keep W after its B and B after the next stage's B.
  std::map<std::pair<int, int>, double> b_end, w_start;
  for (int r = 0; r < s.pp; ++r)
    for (const auto& e : t.ranks[r]) {
      if (!e.compute) continue;
      const Action& a = s.ranks[r][e.first];
      if (a.op == Op::Backward) b_end[{a.mb, r}] = e.end;
      if (a.op == Op::Weight) w_start[{a.mb, r}] = e.start;
    }
  for (const auto& [k, ws] : w_start) CHECK(ws >= b_end[k]);
}

TEST_CASE("costs files: parse, write, errors with line and column, fit to a stage count") {
  const Costs c = parse_costs("# measured\nstage 0 F 1.5 B 1.25 W 1\nstage 1 F 2 B 1.75 W 1.5  # slow\np2p 0.25\n",
                              "m.costs");
  REQUIRE(c.stage_forward.size() == 2);
  CHECK(c.stage_forward[1] == 2);
  CHECK(c.stage_weight[0] == 1);
  CHECK(c.p2p == 0.25);
  CHECK(c.forward == doctest::Approx(1.75));
  const Costs back = parse_costs(write_costs(c));
  CHECK(back.stage_backward == c.stage_backward);
  CHECK(back.stage_weight == c.stage_weight);
  CHECK(back.p2p == c.p2p);
  // Without W: B is the whole backward.
  const Costs plain = parse_costs("stage 0 F 1 B 2\nstage 1 F 1 B 2\n");
  CHECK(plain.stage_weight.empty());
  CHECK(plain.cost(Op::Backward, 1, true) == 1);
  auto error = [](const std::string& text) {
    try {
      parse_costs(text, "e.costs");
    } catch (const Error& e) {
      return e.message();
    }
    return std::string();
  };
  CHECK(error("stage 0 F 1 B x\n").find("e.costs:1:15: expected a time >= 0 in milliseconds, got 'x'") == 0);
  CHECK(error("stage 0 F 1 B 1 Q 2\n").find("e.costs:1:17: unknown cost 'Q'") == 0);
  CHECK(error("stage 0 F 1\n").find("e.costs:1:1: stage 0 needs both an F and a B time") == 0);
  CHECK(error("p2p 1\nlatency 2\n").find("e.costs:2:1: unknown line 'latency'") == 0);
  CHECK(error("stage 1 F 1 B 1\n").find("e.costs: stage 0 is missing") == 0);
  CHECK(error("stage 0 F 1 B 1 W 1\nstage 1 F 1 B 1\n").find("some stages give W and some do not") != std::string::npos);
  CHECK(error("p2p 1\n").find("no 'stage' line") != std::string::npos);
  // 2 measured stages used for 4 (each split in two) and for 1 (summed).
  const Costs four = fit_costs_to_stages(c, 4);
  CHECK(four.stage_forward == std::vector<double>{0.75, 0.75, 1, 1});
  CHECK(four.stage_weight == std::vector<double>{0.5, 0.5, 0.75, 0.75});
  const Costs one = fit_costs_to_stages(c, 1);
  CHECK(one.stage_forward == std::vector<double>{3.5});
  CHECK_THROWS_WITH_AS(fit_costs_to_stages(c, 3), doctest::Contains("measured for 2 stages; the schedule has 3"), Error);
}

TEST_CASE("text and SVG timelines show W") {
  Schedule s = zb_h1_schedule(2, 2);
  Timeline t = simulate_schedule(s, equal_fbw());
  const std::string text = timeline_text(s, t);
  CHECK(text.find("rank 0 |F0 F1 ...B0 W0 B1 W1 |\n") != std::string::npos);
  CHECK(text.find("rank 1 |...F0 B0 F1 B1 W0 W1 |\n") != std::string::npos);
  CHECK(text.find("W weight gradient") != std::string::npos);
  CHECK(timeline_text(s, t, 20).find("rank 0 |FF.BWBW|") != std::string::npos);
  const std::string svg = timeline_svg(s, t);
  std::map<std::string, int> counts;
  CHECK(xml_problem(svg, &counts) == "");
  int w = 0;
  for (size_t at = 0; (at = svg.find("<title>W", at)) != std::string::npos; ++at) ++w;
  CHECK(w == 4);
}

TEST_CASE("schedule_sim app: zero-bubble built-ins, analytic line, measured costs") {
  const std::string app = app_path("schedule_sim");
  REQUIRE(!app.empty());
  const std::string dir = (std::filesystem::temp_directory_path() / "mpitron_test_schedule_sim_zb").string();
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  std::string out;
  REQUIRE(run_command(app + " --schedule zb-h1 --pp 4 --micro-batches 8 --backward-cost 1 --weight-cost 1", &out) == 0);
  CHECK(out.find("bubble fraction   0.1111") != std::string::npos);
  CHECK(out.find("analytic          0.1111  ((p-1)/(3m+p-1)") != std::string::npos);
  CHECK(out.find("rank 0 |F0 F1 F2 F3 .........B0 W0 F4") != std::string::npos);
  REQUIRE(run_command(app + " --schedule zbv --pp 4 --micro-batches 8 --virtual-stages 2 --width 400 --write-schedule " +
                          dir + "/zbv.sched",
                      &out) == 0);
  CHECK(out.find("placement v, split backward") != std::string::npos);
  CHECK(out.find("bubble fraction   0.0588") != std::string::npos);
  CHECK(out.find("analytic          0.0588  ((p-1)/(6m+p-1)") != std::string::npos);
  CHECK(read_all(dir + "/zbv.sched").find("placement v\n") != std::string::npos);
  CHECK(run_command(app + " --schedule zbv --pp 4 --micro-batches 8", &out) == 1);
  CHECK(out.find("zbv needs 2 virtual stages per rank") != std::string::npos);
  // Measured costs (4 stages, as --profile-pipeline writes them for pp 4) drive the zbv file's 8 stages.
  std::ofstream(dir + "/m.costs") << "stage 0 F 2 B 2 W 2\nstage 1 F 2 B 2 W 2\nstage 2 F 2 B 2 W 2\nstage 3 F 4 B 4 W 4\n"
                                     "p2p 0\n";
  REQUIRE(run_command(app + " --schedule-file " + dir + "/zbv.sched --costs " + dir + "/m.costs", &out) == 0);
  CHECK(out.find("measured stages split or summed to 8") != std::string::npos);
  // Measured stage k holds the layers of stages 2k and 2k+1 here (each at half the cost).
  CHECK(out.find("  stage 0 F 1 B 1 W 1\n") != std::string::npos);
  CHECK(out.find("  stage 6 F 2 B 2 W 2\n") != std::string::npos);
  CHECK(out.find("  stage 7 F 2 B 2 W 2\n") != std::string::npos);
  CHECK(run_command(app + " --schedule 1f1b --pp 2 --micro-batches 2 --costs " + dir + "/m.costs --forward-cost 2", &out) ==
        2);
  // A bad file: FILE:LINE:COLUMN first.
  std::ofstream(dir + "/wb.sched") << "pp 1\nmicro-batches 2\nrank 0: F0 F1 B0 W1 B1 W0\n";
  CHECK(run_command(app + " --schedule-file " + dir + "/wb.sched", &out) == 1);
  CHECK(out.find(dir + "/wb.sched:3:18: schedule") != std::string::npos);
  CHECK(out.find("W before its B") != std::string::npos);
  std::filesystem::remove_all(dir);
}
