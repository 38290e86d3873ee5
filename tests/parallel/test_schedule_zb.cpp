// tests/parallel/test_schedule_zb.cpp — zero-bubble schedules as data: the W
// action, placements (round-robin, V, explicit), the built-ins zb-h1 and zbv
// (checked for many sizes, round-tripped through the text format), timed p2p,
// and bad files (W before its B, a missing W, a V placement that does not fit
// the chunk count, too many in flight) rejected with FILE:LINE:COLUMN.
#include <doctest/doctest.h>

#include <algorithm>

#include "core/error.h"
#include "parallel/schedule.h"
#include "parallel/schedule_check.h"

using namespace mpitron;
using namespace mpitron::parallel;

namespace {

std::string parse_error(const std::string& text) {
  try {
    parse_schedule(text, "t.sched");
  } catch (const Error& e) {
    return e.message();
  }
  return "";
}

std::string validate_error(const Schedule& s) {
  try {
    validate_schedule(s);
  } catch (const Error& e) {
    return e.message();
  }
  return "";
}

// Peak of (F run, W not yet) per rank, counted here without the checker.
std::vector<int> count_peaks_w(const Schedule& s) {
  std::vector<int> out;
  for (const auto& acts : s.ranks) {
    int cur = 0, peak = 0;
    for (const auto& a : acts) {
      if (a.op == Op::Forward) peak = std::max(peak, ++cur);
      if (a.op == Op::Weight) --cur;
    }
    out.push_back(peak);
  }
  return out;
}

int count_op(const std::vector<Action>& acts, Op op) {
  return static_cast<int>(std::count_if(acts.begin(), acts.end(), [&](const Action& a) { return a.op == op; }));
}

}  // namespace

TEST_CASE("placement: round-robin, V and explicit stage -> rank maps") {
  Schedule rr;
  rr.pp = 4;
  rr.virtual_stages = 2;
  CHECK(rr.stage(1, 1) == 5);
  CHECK(rr.rank_of_stage(5) == 1);
  CHECK(rr.chunk_of_stage(5) == 1);
  CHECK(rr.placement_kind() == "round-robin");

  Schedule v = rr;
  v.placement = v_placement(4);
  CHECK(v.placement == std::vector<int>{0, 1, 2, 3, 3, 2, 1, 0});
  CHECK(placement_error(v.placement, 4, 2).empty());
  CHECK(v.placement_kind() == "v");
  for (int r = 0; r < 4; ++r) {
    CHECK(v.stage(r, 0) == r);
    CHECK(v.stage(r, 1) == 7 - r);
    CHECK(v.rank_of_stage(r) == r);
    CHECK(v.rank_of_stage(7 - r) == r);
    CHECK(v.chunk_of_stage(r) == 0);
    CHECK(v.chunk_of_stage(7 - r) == 1);
  }

  Schedule e = rr;
  e.placement = {1, 0, 0, 2, 3, 1, 2, 3};
  CHECK(e.placement_kind() == "explicit");
  CHECK(e.stage(0, 0) == 1);
  CHECK(e.stage(0, 1) == 2);
  CHECK(e.chunk_of_stage(5) == 1);  // rank 1 holds stages 0 and 5
  CHECK(placement_error({0, 0, 0, 2, 3, 1, 2, 3}, 4, 2).find("rank 0 holds 3 stages") != std::string::npos);
  CHECK(placement_error({0, 1, 2}, 4, 2).find("lists 3 stages") != std::string::npos);
  CHECK(placement_error({0, 1, 2, 3, 3, 2, 1, 9}, 4, 2).find("outside pp 4") != std::string::npos);
}

TEST_CASE("V placement: p2p only between ranks, the turn on the last rank is local") {
  // A compute-only GPipe-like order over V placement, pp 2: rank 0 holds stages 0, 3; rank 1 stages 1, 2.
  Schedule s = parse_schedule(R"(pp 2
virtual-stages 2
micro-batches 1
placement v
rank 0: F0.0 F0.1 B0.1 B0.0
rank 1: F0.0 F0.1 B0.1 B0.0
)",
                              "v.sched");
  CHECK(s.placement == std::vector<int>{0, 1, 1, 0});
  CheckResult r = check_schedule(s);
  INFO(r.message());
  CHECK(r.ok);
  std::string rank1;
  for (const Action& a : s.ranks[1]) rank1 += to_string(a) + " ";
  // Stage 1 -> 2 and back stay on rank 1: no p2p between F0.0 and F0.1, nor between B0.1 and B0.0.
  CHECK(rank1 == "RA0.0<0 F0.0 F0.1 SA0.1>0 RG0.1<0 B0.1 B0.0 SG0.0>0 ");
  // The last stage (3) is on rank 0: its output is the loss, nothing is sent after F0.1 there.
  std::string rank0;
  for (const Action& a : s.ranks[0]) rank0 += to_string(a) + " ";
  CHECK(rank0 == "F0.0 SA0.0>1 RA0.1<1 F0.1 B0.1 SG0.1>1 RG0.0<1 B0.0 ");
}

TEST_CASE("zb-h1 and zbv pass the checker; W for every (mb, chunk); peaks as promised") {
  int checked = 0;
  for (int p : {1, 2, 3, 4, 8})
    for (int m : {1, 2, p, p + 1, 2 * p, 3 * p}) {
      Schedule h = builtin_schedule("zb-h1", p, m);
      CheckResult rh = check_schedule(h);
      INFO("zb-h1 pp ", p, " m ", m, ": ", rh.message());
      REQUIRE(rh.ok);
      CHECK(rh.peak_in_flight == count_peaks_w(h));
      for (int r = 0; r < p; ++r) {
        CHECK(rh.peak_in_flight[r] == std::min(p, m));  // 1F1B's peak (rank 0's), on every rank
        CHECK(count_op(h.ranks[r], Op::Weight) == m);
      }
      Schedule v = builtin_schedule("zbv", p, m, 2);
      CheckResult rv = check_schedule(v);
      INFO("zbv pp ", p, " m ", m, ": ", rv.message());
      REQUIRE(rv.ok);
      CHECK(v.placement == v_placement(p));
      CHECK(rv.peak_in_flight == count_peaks_w(v));
      for (int r = 0; r < p; ++r) {
        CHECK(rv.peak_in_flight[r] <= 2 * p);  // 1F1B's memory: p micro-batches x 2 half-size chunks
        CHECK(count_op(v.ranks[r], Op::Weight) == 2 * m);
      }
      checked += 2;
    }
  CHECK(checked == 60);
}

TEST_CASE("zb-h1 order: warm-up as 1F1B, W deferred by the rank's index") {
  Schedule s = compute_only(zb_h1_schedule(4, 8));
  auto text = [&](int r) {
    std::string t;
    for (const Action& a : s.ranks[r]) t += to_string(a).substr(0, to_string(a).find('.')) + " ";
    return t;
  };
  CHECK(text(0) == "F0 F1 F2 F3 B0 W0 F4 B1 W1 F5 B2 W2 F6 B3 W3 F7 B4 W4 B5 W5 B6 W6 B7 W7 ");
  CHECK(text(3) == "F0 B0 F1 B1 F2 B2 F3 B3 W0 F4 B4 W1 F5 B5 W2 F6 B6 W3 F7 B7 W4 W5 W6 W7 ");
}

TEST_CASE("built-in names and their errors") {
  CHECK(is_builtin_schedule("zb-h1"));
  CHECK(is_builtin_schedule("zbv"));
  CHECK_THROWS_WITH_AS(builtin_schedule("zbv", 4, 8, 1), doctest::Contains("zbv needs 2 virtual stages per rank"),
                       Error);
  CHECK_THROWS_WITH_AS(builtin_schedule("zb-h1", 4, 8, 2), doctest::Contains("zb-h1 with 2 virtual stages"), Error);
  CHECK_THROWS_WITH_AS(builtin_schedule("zb-h2", 4, 8), doctest::Contains("zb-h1 and zbv"), Error);
}

TEST_CASE("text format: W, placement and max-in-flight round-trip") {
  for (int p : {1, 2, 4})
    for (int m : {p, 2 * p}) {
      for (const Schedule& s : {zb_h1_schedule(p, m), zbv_schedule(p, m)}) {
        const std::string text = write_schedule(s);
        INFO(s.name, " pp ", p, " m ", m, "\n", text);
        if (s.name == "zbv" && p > 1) CHECK(text.find("\nplacement v\n") != std::string::npos);
        CHECK(text.find(" W0") != std::string::npos);
        Schedule back = parse_schedule(text, "roundtrip");
        CHECK(back == s);
        CHECK(write_schedule(back) == text);
      }
    }
  Schedule e = parse_schedule(R"(pp 2
virtual-stages 2
micro-batches 1
placement 1 0 0 1    # rank 1 holds stages 0 and 3, rank 0 stages 1 and 2
max-in-flight 2
p2p timed
rank 0: F0.0 F0.1 B0.1 W0.1 B0.0 W0.0
rank 1: F0.0 F0.1 B0.1 W0.1 B0.0 W0.0
)",
                              "e.sched");
  CHECK(e.placement_kind() == "explicit");
  CHECK(e.max_in_flight == 2);
  CHECK(check_schedule(e).ok);
  const std::string text = write_schedule(e);
  CHECK(text.find("placement 1 0 0 1\n") != std::string::npos);
  CHECK(text.find("max-in-flight 2\n") != std::string::npos);
  CHECK(parse_schedule(text) == e);
}

TEST_CASE("p2p timed: user orders that p2p auto would deadlock run with timed p2p") {
  // ZB-V's order on pp 4 with just-in-time p2p is rejected (under V a rank pair
  // carries activations one way and gradients the other, and just-in-time
  // posting pairs them out of order); timed p2p is fine.
  Schedule order = compute_only(zbv_schedule(4, 8));
  std::string body = "virtual-stages 2\nplacement v\n";
  for (int r = 0; r < 4; ++r) {
    body += "rank " + std::to_string(r) + ":";
    for (const Action& a : order.ranks[r]) body += " " + to_string(a);
    body += "\n";
  }
  Schedule timed = parse_schedule("pp 4\nmicro-batches 8\np2p timed\n" + body, "timed.sched");
  CHECK(check_schedule(timed).ok);
  CHECK(timed == zbv_schedule(4, 8));
  Schedule jit = parse_schedule("pp 4\nmicro-batches 8\n" + body, "jit.sched");
  CheckResult r = check_schedule(jit);
  CHECK_FALSE(r.ok);
  INFO(r.message());
  CHECK(r.why.find("pairs with the wrong message") != std::string::npos);
  // An order that cannot run names where it is stuck.
  CHECK(parse_error("pp 2\nmicro-batches 1\np2p timed\nrank 0: B0 F0 W0\nrank 1: F0 B0 W0\n")
            .find("the compute order cannot run (p2p timed): rank 0 at action 0 (B0.0, line 4:9)") !=
        std::string::npos);
}

TEST_CASE("bad files: W before its B, a missing W, W twice, mixed, with FILE:LINE:COLUMN") {
  SUBCASE("W before its B") {
    Schedule s = parse_schedule("pp 1\nmicro-batches 2\nrank 0: F0 F1 B0 W1 B1 W0\n", "wb.sched");
    CheckResult r = check_schedule(s);
    CHECK_FALSE(r.ok);
    CHECK(r.action == "W1.0");
    CHECK(r.why.find("W before its B: B1.0") != std::string::npos);
    CHECK(validate_error(s).find("wb.sched:3:18: pipeline schedule") == 0);
  }
  SUBCASE("a missing W (the schedule has other Ws): named at its B by the parser") {
    CHECK(parse_error("pp 1\nmicro-batches 2\nrank 0: F0 F1 B0 W0 B1\n")
              .find("t.sched:3:21: B1.0 on rank 0 has no W1.0: this schedule splits the backward (W0.0 at line 3:18)") ==
          0);
  }
  SUBCASE("a missing W in a generated schedule: named by the checker at its B") {
    Schedule s = zb_h1_schedule(2, 2);
    auto& acts = s.ranks[1];
    acts.erase(std::find_if(acts.begin(), acts.end(), [](const Action& a) { return a.op == Op::Weight; }));
    CheckResult r = check_schedule(s);
    CHECK_FALSE(r.ok);
    CHECK(r.rank == 1);
    CHECK(r.action == "B0.0");
    CHECK(r.why.find("has no weight gradient: W0.0 is missing") != std::string::npos);
  }
  SUBCASE("W twice") {
    CheckResult r = check_schedule(parse_schedule("pp 1\nmicro-batches 1\nrank 0: F0 B0 W0 W0\n"));
    CHECK_FALSE(r.ok);
    CHECK(r.index == 3);
    CHECK(r.why.find("runs twice") != std::string::npos);
  }
  SUBCASE("W without its B anywhere") {
    CheckResult r = check_schedule(parse_schedule("pp 1\nmicro-batches 2\nrank 0: F0 B0 W0 F1 W1\n"));
    CHECK_FALSE(r.ok);
    CHECK(r.why.find("W before its B") != std::string::npos);
  }
  SUBCASE("an unknown action lists W") {
    CHECK(parse_error("pp 1\nmicro-batches 1\nrank 0: F0 B0 X0\n").find("t.sched:3:15: unknown action 'X0'") == 0);
    CHECK(parse_error("pp 1\nmicro-batches 1\nrank 0: F0 B0 W0.x\n").find("t.sched:3:18: expected a chunk number") ==
          0);
  }
}

TEST_CASE("bad files: placements that do not fit the chunk count, with line and column") {
  CHECK(parse_error("pp 2\nvirtual-stages 3\nmicro-batches 1\nplacement v\nrank 0: F0\nrank 1: F0\n")
            .find("t.sched:4:11: placement v needs virtual-stages 2") == 0);
  // virtual-stages may come after the placement: the check waits for it.
  CHECK(parse_error("pp 2\nplacement v\nmicro-batches 1\nrank 0: F0\nrank 1: F0\n")
            .find("t.sched:2:11: placement v needs virtual-stages 2 (rank r holds stages r and 2pp-1-r), but "
                  "virtual-stages is 1") == 0);
  CHECK(parse_error("pp 2\nvirtual-stages 2\nmicro-batches 1\nplacement 0 1 1 0 0\nrank 0: F0\nrank 1: F0\n")
            .find("t.sched:4:19: placement lists 5 stages, but pp 2 x virtual-stages 2 is 4") == 0);
  CHECK(parse_error("pp 2\nvirtual-stages 2\nmicro-batches 1\nplacement 0 1 1\nrank 0: F0\nrank 1: F0\n")
            .find("t.sched:4:15: placement lists 3 stages") == 0);
  CHECK(parse_error("pp 2\nvirtual-stages 2\nmicro-batches 1\nplacement 0 1 1 1\nrank 0: F0\nrank 1: F0\n")
            .find("t.sched:4:11: placement puts 1 stages on rank 0; with virtual-stages 2 every rank holds exactly 2") ==
        0);
  CHECK(parse_error("pp 2\nvirtual-stages 2\nmicro-batches 1\nplacement 0 1 2 1\nrank 0: F0\nrank 1: F0\n")
            .find("t.sched:4:15: rank 2 is outside pp 2") == 0);
  CHECK(parse_error("pp 2\nmicro-batches 1\nplacement zigzag\nrank 0: F0\nrank 1: F0\n")
            .find("t.sched:3:11: placement must be 'round-robin', 'v' or a list of ranks") == 0);
  CHECK(parse_error("pp 2\nmicro-batches 1\nplacement v 1\nrank 0: F0\nrank 1: F0\n")
            .find("t.sched:3:13: 'placement v' takes no further value") == 0);
  // A generated schedule with a bad placement: the checker and the executor's sizes check refuse it.
  Schedule s = zbv_schedule(2, 2);
  s.placement = {0, 0, 1, 1, 1};
  CheckResult r = check_schedule(s);
  CHECK_FALSE(r.ok);
  CHECK(r.why.find("bad placement: the placement lists 5 stages") != std::string::npos);
}

TEST_CASE("checker: peak in flight counts until W; max-in-flight is enforced at the F that exceeds it") {
  const std::string body = "pp 1\nmicro-batches 3\n";
  Schedule s = parse_schedule(body + "rank 0: F0 F1 B0 B1 W0 F2 B2 W1 W2\n");
  CheckResult r = check_schedule(s);
  CHECK(r.ok);
  CHECK(r.peak_in_flight == std::vector<int>{2});  // F2 runs after W0: F1 and F2 in flight
  Schedule nb = parse_schedule(body + "rank 0: F0 F1 B0 B1 F2 B2\n");
  CHECK(check_schedule(nb).peak_in_flight == std::vector<int>{2});  // no W: counted until B
  Schedule bound = parse_schedule(body + "max-in-flight 2\nrank 0: F0 F1 B0 B1 F2 W0 B2 W1 W2\n", "b.sched");
  CheckResult rb = check_schedule(bound);
  CHECK_FALSE(rb.ok);
  CHECK(rb.action == "F2.0");
  CHECK(rb.why.find("3 forwards in flight on this rank (run, their W not yet), above the schedule's max-in-flight 2") !=
        std::string::npos);
  CHECK(validate_error(bound).find("b.sched:4:21: pipeline schedule") == 0);
  CHECK(parse_error(body + "max-in-flight 0\n").find("t.sched:3:15: max-in-flight must be >= 1") == 0);
}

TEST_CASE("the workflow example of docs/pipeline-schedules.md checks, with W deferred on rank 1") {
  Schedule s = parse_schedule(R"(# my.sched: ZB-H1-like, W of rank 1 one micro-batch late
pp 2
micro-batches 4
p2p timed
rank 0: F0 F1 B0 W0 F2 B1 W1 F3 B2 W2 B3 W3
rank 1: F0 B0 F1 B1 W0 F2 B2 W1 F3 B3 W2 W3
)",
                              "my.sched");
  CheckResult r = check_schedule(s);
  INFO(r.message());
  CHECK(r.ok);
  CHECK(r.peak_in_flight == std::vector<int>{2, 2});
  CHECK(has_p2p(s));
  CHECK(s == zb_h1_schedule(2, 4));  // it is zb-h1 for pp 2
}
