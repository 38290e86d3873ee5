// tests/parallel/test_schedule.cpp — pipeline schedules as data: the built-ins
// pass the checker for many (pp, micro-batches, virtual stages); broken
// schedules (missing B, B before F, crossing blocking sends, out-of-order
// messages, wrong peers) are rejected naming the first offending action; the
// text format round-trips and reports line:column.
#include <doctest/doctest.h>

#include <algorithm>
#include <sstream>

#include "core/error.h"
#include "parallel/schedule.h"
#include "parallel/schedule_check.h"

using namespace mpitron;
using namespace mpitron::parallel;

namespace {

// Index of the first action on rank r whose text is `text`; -1 if none.
int find_action(const Schedule& s, int r, const std::string& text) {
  for (size_t i = 0; i < s.ranks[r].size(); ++i)
    if (to_string(s.ranks[r][i]) == text) return static_cast<int>(i);
  return -1;
}

std::string parse_error(const std::string& text) {
  try {
    parse_schedule(text, "t.sched");
  } catch (const Error& e) {
    return e.message();
  }
  return "";
}

// The per-rank peak of forwards awaiting their backward, counted directly.
std::vector<int> count_peaks(const Schedule& s) {
  std::vector<int> out;
  for (const auto& acts : s.ranks) {
    int cur = 0, peak = 0;
    for (const auto& a : acts) {
      if (a.op == Op::Forward) peak = std::max(peak, ++cur);
      if (a.op == Op::Backward) --cur;
    }
    out.push_back(peak);
  }
  return out;
}

}  // namespace

TEST_CASE("built-in schedules pass the checker for many (pp, micro-batches, virtual stages)") {
  int checked = 0;
  for (int p = 1; p <= 8; ++p)
    for (int m = 1; m <= 12; ++m) {
      for (const char* name : {"gpipe", "1f1b"}) {
        Schedule s = builtin_schedule(name, p, m);
        CheckResult r = check_schedule(s);
        INFO(name, " pp ", p, " m ", m, ": ", r.message());
        CHECK(r.ok);
        ++checked;
      }
      for (int v = 1; v <= 4; ++v) {
        if (m % p == 0) {
          Schedule s = interleaved_schedule(p, m, v);
          CheckResult r = check_schedule(s);
          INFO("interleaved pp ", p, " m ", m, " v ", v, ": ", r.message());
          CHECK(r.ok);
          ++checked;
        }
      }
    }
  CHECK(checked > 250);
}

// GPipe over v round-robin chunks: all forwards chunk by chunk, then all
// backwards, with just-in-time send/recv (p2p auto).
static Schedule gpipe_over_chunks(int p, int m, int v) {
  Schedule s;
  s.name = "gpipe-chunks";
  s.pp = p;
  s.micro_batches = m;
  s.virtual_stages = v;
  s.ranks.resize(p);
  for (int r = 0; r < p; ++r) {
    for (int c = 0; c < v; ++c)
      for (int mb = 0; mb < m; ++mb) s.ranks[r].push_back(Action{Op::Forward, mb, c});
    for (int c = v - 1; c >= 0; --c)
      for (int mb = 0; mb < m; ++mb) s.ranks[r].push_back(Action{Op::Backward, mb, c});
  }
  return with_p2p(s);
}

TEST_CASE("checker: GPipe over chunks with just-in-time p2p deadlocks once m > pp") {
  // The last rank sends chunk 0's outputs to rank 0, which is still busy
  // sending its own chunk-0 outputs: a cycle around the ring.
  CHECK(check_schedule(gpipe_over_chunks(4, 4, 2)).ok);
  CHECK(check_schedule(gpipe_over_chunks(4, 3, 3)).ok);
  CheckResult r = check_schedule(gpipe_over_chunks(4, 12, 2));
  CHECK_FALSE(r.ok);
  CHECK(r.rank == 0);
  CHECK(r.action == "SA6.0>1");
  CHECK(r.why.find("rank 3 waits at action 2 (SA0.0>0) on rank 0") != std::string::npos);
}

TEST_CASE("built-ins: shapes, send/recv pattern and peak in-flight activations") {
  SUBCASE("1f1b warm-up is pp - rank - 1 forwards; peak in flight min(pp - rank, m)") {
    for (int p : {2, 4, 8})
      for (int m : {1, 3, 8, 16}) {
        Schedule s = one_f_one_b_schedule(p, m);
        CheckResult r = check_schedule(s);
        REQUIRE(r.ok);
        for (int rank = 0; rank < p; ++rank) {
          CHECK(r.peak_in_flight[rank] == std::min(p - rank, m));
          Schedule c = compute_only(s);
          int warm = 0;
          while (c.ranks[rank][warm].op == Op::Forward && warm < static_cast<int>(c.ranks[rank].size()) - 1) ++warm;
          CHECK(warm == std::min(p - rank - 1, m) + (m > p - rank - 1 ? 1 : 0));  // warm-up + the first steady F
        }
      }
  }
  SUBCASE("gpipe keeps every micro-batch in flight") {
    CheckResult r = check_schedule(gpipe_schedule(4, 6));
    REQUIRE(r.ok);
    CHECK(r.peak_in_flight == std::vector<int>{6, 6, 6, 6});
  }
  SUBCASE("interleaved peak in flight is Megatron's warm-up + 1 (all when m == pp)") {
    for (int p : {2, 3, 4})
      for (int v : {2, 3})
        for (int m : {p, 2 * p, 4 * p}) {
          Schedule s = interleaved_schedule(p, m, v);
          CheckResult r = check_schedule(s);
          REQUIRE(r.ok);
          CHECK(r.peak_in_flight == count_peaks(s));
          for (int rank = 0; rank < p; ++rank) {
            const int total = m * v;
            const int warm = m == p ? total : std::min((p - rank - 1) * 2 + (v - 1) * p, total);
            CHECK(r.peak_in_flight[rank] == std::min(warm + 1, total));
          }
        }
  }
  SUBCASE("1f1b pairs send_forward_recv_backward in one batch, like Megatron") {
    Schedule s = one_f_one_b_schedule(2, 2);
    // rank 0: F0 SA0 F1 [SA1 RG0] B0 RG1 B1
    REQUIRE(s.ranks[0].size() == 8);
    CHECK(to_string(s.ranks[0][3]) == "SA1.0>1");
    CHECK(to_string(s.ranks[0][4]) == "RG0.0<1");
    CHECK(s.ranks[0][4].batched);
    CHECK_FALSE(s.ranks[0][3].batched);
  }
  SUBCASE("interleaved needs micro-batches to be a multiple of pp, as Megatron") {
    CHECK_THROWS_WITH_AS(interleaved_schedule(4, 6, 2), doctest::Contains("not divisible"), Error);
    CHECK_THROWS_AS(builtin_schedule("1f1b", 2, 4, 2), Error);
    CHECK_THROWS_AS(builtin_schedule("zero-bubble", 2, 4), Error);
  }
}

TEST_CASE("checker: a missing backward is named by its forward, or by the send that needs it") {
  Schedule s = one_f_one_b_schedule(4, 8);
  SUBCASE("on rank 0 (nothing sent after B): the F without B") {
    const int b = find_action(s, 0, "B3.0");
    REQUIRE(b >= 0);
    s.ranks[0].erase(s.ranks[0].begin() + b);
    CheckResult r = check_schedule(s);
    CHECK_FALSE(r.ok);
    CHECK(r.rank == 0);
    CHECK(r.index == find_action(s, 0, "F3.0"));
    CHECK(r.action == "F3.0");
    CHECK(r.why.find("has no backward") != std::string::npos);
    CHECK(r.message().find("rank 0, action ") == 0);
  }
  SUBCASE("on rank 2: the SG that would send the gradient") {
    const int b = find_action(s, 2, "B3.0");
    REQUIRE(b >= 0);
    s.ranks[2].erase(s.ranks[2].begin() + b);
    CheckResult r = check_schedule(s);
    CHECK_FALSE(r.ok);
    CHECK(r.rank == 2);
    CHECK(r.action == "SG3.0>1");
    CHECK(r.index == find_action(s, 2, "SG3.0>1"));
    CHECK(r.why.find("not yet computed") != std::string::npos);
  }
}

TEST_CASE("checker: B before its F, duplicates, missing forwards, ranges, wrong peers") {
  SUBCASE("B before F") {
    Schedule s = parse_schedule("pp 1\nmicro-batches 2\nrank 0: F0 B1 F1 B0\n");
    CheckResult r = check_schedule(s);
    CHECK_FALSE(r.ok);
    CHECK(r.rank == 0);
    CHECK(r.index == 1);
    CHECK(r.action == "B1.0");
    CHECK(r.line == 3);
    CHECK(r.column == 12);
    CHECK(r.why.find("B before its F") != std::string::npos);
    CHECK(r.message() == "rank 0, action 1 (B1.0, line 3:12): " + r.why);
  }
  SUBCASE("an action twice") {
    CheckResult r = check_schedule(parse_schedule("pp 1\nmicro-batches 1\nrank 0: F0 F0 B0\n"));
    CHECK(r.index == 1);
    CHECK(r.why.find("runs twice") != std::string::npos);
  }
  SUBCASE("a forward never run") {
    CheckResult r = check_schedule(parse_schedule("pp 1\nmicro-batches 2\nrank 0: F0 B0\n"));
    CHECK_FALSE(r.ok);
    CHECK(r.index == -1);
    CHECK(r.action == "F1.0");
    CHECK(r.message().find("missing action (F1.0)") != std::string::npos);
  }
  SUBCASE("chunks run in stage order on one rank") {
    // pp 1, two chunks: stage 1 (chunk 1) needs stage 0's forward first.
    CheckResult r = check_schedule(parse_schedule("pp 1\nvirtual-stages 2\nmicro-batches 1\nrank 0: F0.1 F0.0 B0.1 B0.0\n"));
    CHECK(r.index == 0);
    CHECK(r.why.find("F0.0") != std::string::npos);
    CHECK(check_schedule(parse_schedule("pp 1\nvirtual-stages 2\nmicro-batches 1\nrank 0: F0.0 F0.1 B0.1 B0.0\n")).ok);
  }
  SUBCASE("out of range and wrong peers") {
    CheckResult r = check_schedule(parse_schedule("pp 1\nmicro-batches 1\nrank 0: F0 B0 F1 B1\n"));
    CHECK(r.index == 2);
    CHECK(r.why.find("out of range") != std::string::npos);
    Schedule s = one_f_one_b_schedule(4, 4);
    const int i = find_action(s, 1, "SA0.0>2");
    REQUIRE(i >= 0);
    s.ranks[1][i].peer = 3;
    r = check_schedule(s);
    CHECK(r.rank == 1);
    CHECK(r.index == i);
    CHECK(r.why.find("lives on rank 2") != std::string::npos);
  }
  SUBCASE("a forward without its received input") {
    Schedule s = one_f_one_b_schedule(2, 2);
    const int i = find_action(s, 1, "RA0.0<0");
    s.ranks[1].erase(s.ranks[1].begin() + i);
    CheckResult r = check_schedule(s);
    CHECK(r.rank == 1);
    CHECK(r.action == "F0.0");
    CHECK(r.why.find("no RA0.0<0 before it") != std::string::npos);
  }
}

// Two ranks that both send first, with blocking sends: rank 0 sends the second
// activation while rank 1 sends the first gradient; neither receives.
static const char* kCrossingSends = R"(# crossing blocking sends
pp 2
micro-batches 2
p2p explicit
rank 0: F0 SA0.0>1 F1 SA1.0>1 RG0.0<1 B0 RG1.0<1 B1
rank 1: RA0.0<0 F0 B0 SG0.0>0 RA1.0<0 F1 B1 SG1.0>0
)";

TEST_CASE("checker: crossing blocking sends deadlock; batching them fixes it") {
  Schedule s = parse_schedule(kCrossingSends, "crossing.sched");
  CheckResult r = check_schedule(s);
  CHECK_FALSE(r.ok);
  CHECK(r.rank == 0);
  CHECK(r.index == 3);
  CHECK(r.action == "SA1.0>1");
  CHECK(r.line == 5);
  CHECK(r.why.find("deadlock") != std::string::npos);
  CHECK(r.why.find("rank 1 waits at action 3 (SG0.0>0)") != std::string::npos);
  CHECK_THROWS_WITH_AS(validate_schedule(s), doctest::Contains("rank 0, action 3 (SA1.0>1, line 5:23)"), Error);

  // Megatron's fix: send_forward_recv_backward / send_backward_recv_forward as one batch each.
  std::string fixed = kCrossingSends;
  fixed.replace(fixed.find("SA1.0>1 RG0.0<1"), 15, "[SA1.0>1 RG0.0<1]");
  fixed.replace(fixed.find("SG0.0>0 RA1.0<0"), 15, "[SG0.0>0 RA1.0<0]");
  CHECK(check_schedule(parse_schedule(fixed)).ok);
  // Or only reorder one rank: rank 1 receives before it sends.
  std::string reordered = kCrossingSends;
  reordered.replace(reordered.find("SG0.0>0 RA1.0<0"), 15, "RA1.0<0 SG0.0>0");
  CHECK(check_schedule(parse_schedule(reordered)).ok);
}

TEST_CASE("checker: messages between two ranks pair in posting order") {
  // Rank 0 sends micro-batch 1 before 0; rank 1 receives 0 first.
  Schedule s = parse_schedule(R"(pp 2
micro-batches 2
p2p explicit
rank 0: F0 F1 SA1.0>1 SA0.0>1 RG0.0<1 B0 RG1.0<1 B1
rank 1: RA0.0<0 F0 B0 SG0.0>0 RA1.0<0 F1 B1 SG1.0>0
)");
  CheckResult r = check_schedule(s);
  CHECK_FALSE(r.ok);
  CHECK(r.rank == 0);
  CHECK(r.action == "SA1.0>1");
  CHECK(r.why.find("wrong message") != std::string::npos);
}

TEST_CASE("checker: a send nobody receives, a receive nobody sends") {
  Schedule s = one_f_one_b_schedule(2, 2);
  const int i = find_action(s, 1, "RA1.0<0");
  REQUIRE(i >= 0);
  // Rank 0 never sends micro-batch 1's activation that rank 1 receives.
  Schedule t = s;
  const int sa = find_action(t, 0, "SA1.0>1");
  t.ranks[0].erase(t.ranks[0].begin() + sa);
  t.ranks[0][sa].batched = false;  // its batch partner RG0.0<1 now stands alone
  CheckResult r = check_schedule(t);
  CHECK(r.rank == 1);
  CHECK(r.index == i);
  CHECK(r.why.find("nothing sends it") != std::string::npos);
}

TEST_CASE("text format: round trip of every built-in, auto p2p, wrapping") {
  for (int p : {1, 2, 3, 4})
    for (int m : {p, 2 * p, 3 * p + (p > 1 ? 0 : 1)}) {
      std::vector<Schedule> all = {gpipe_schedule(p, m), one_f_one_b_schedule(p, m), interleaved_schedule(p, m, 2),
                                   interleaved_schedule(p, m, 3)};
      for (const Schedule& s : all) {
        const std::string text = write_schedule(s);
        Schedule back = parse_schedule(text, "roundtrip");
        INFO(s.name, " pp ", p, " m ", m, "\n", text);
        CHECK(back == s);
        CHECK(back.name == s.name);
        CHECK(write_schedule(back) == text);
        // The compute-only form re-derives the same p2p for the just-in-time built-ins.
        if (s.name != "interleaved") {
          const std::string auto_text = write_schedule(compute_only(s));
          CHECK(auto_text.find("p2p auto") != std::string::npos);
          CHECK(parse_schedule(auto_text) == s);
        }
      }
    }
  // Long ranks are wrapped onto several 'rank r:' lines, no line much over 100 characters.
  const std::string text = write_schedule(interleaved_schedule(4, 16, 4));
  std::istringstream in(text);
  std::string line;
  int rank0_lines = 0;
  while (std::getline(in, line)) {
    CHECK(line.size() <= 100);
    if (line.rfind("rank 0:", 0) == 0) ++rank0_lines;
  }
  CHECK(rank0_lines > 1);
}

TEST_CASE("text format: user files with comments, glued colons, batches; p2p auto") {
  Schedule s = parse_schedule(R"(# 1F1B for 2 ranks, written by hand
schedule: mine
pp: 2
micro-batches 2
rank 0 : F0 F1 B0 B1   # GPipe-like on rank 0
rank 1: F0 B0
rank 1: F1 B1          # a second line appends to rank 1
)",
                              "mine.sched");
  CHECK(s.name == "mine");
  CHECK(s.pp == 2);
  CHECK(s.ranks[1].size() == 8);  // RA F B SG, twice (batched in between)
  CHECK(to_string(s.ranks[1][3]) == "SG0.0>0");
  CHECK(to_string(s.ranks[1][4]) == "RA1.0<0");
  CHECK(s.ranks[1][4].batched);
  CHECK(s.ranks[1][1].line == 6);
  CHECK(s.ranks[1][1].column == 9);
  CHECK(check_schedule(s).ok);
}

TEST_CASE("text format: errors carry line and column") {
  CHECK(parse_error("pp 1\nmicro-batches 1\nrank 0: F0 X3 B0\n") ==
        "t.sched:3:12: unknown action 'X3' (expected F<mb>.<chunk>, B…, W…, SA…>peer, RA…<peer, SG…>peer, RG…<peer)");
  CHECK(parse_error("pp 1\nmicro-batches 1\nrank 0: F0.x B0\n").find("t.sched:3:12: expected a chunk number") == 0);
  CHECK(parse_error("pp 2\nmicro-batches 1\np2p explicit\nrank 0: F0 SA0.0 B0\nrank 1: F0 B0\n")
            .find("t.sched:4:17: 'SA0.0' needs its peer rank") == 0);
  CHECK(parse_error("pp 1\nmicro-batches 1\nrank 0 F0 B0\n").find("t.sched:3:7: expected ':'") == 0);
  CHECK(parse_error("pp 2\nmicro-batches 1\nrank 0: [SA0.0>1 [RG0.0<1]]\n").find("t.sched:3:18: nested '['") == 0);
  CHECK(parse_error("pp 2\nmicro-batches 1\nrank 0: [F0 SA0.0>1]\n").find("t.sched:3:10: 'F0' inside a batch") == 0);
  CHECK(parse_error("pp 2\nmicro-batches 1\nrank 0: [SA0.0>1\n").find("t.sched:3:9: '[' is not closed") == 0);
  CHECK(parse_error("pp 1\nmicro-batches 1\nrank 0: F0 B0 ]\n").find("t.sched:3:15: ']' without '['") == 0);
  CHECK(parse_error("pp 1\nmicro-batches 1\nrank 1: F0 B0\n").find("t.sched:3:1: rank 1 is outside pp 1") == 0);
  CHECK(parse_error("pp 2\nmicro-batches 1\nrank 0: F0 B0\n").find("t.sched:4:1: no 'rank 1:' line") == 0);
  CHECK(parse_error("micro-batches 1\nrank 0: F0 B0\n").find("t.sched:3:1: missing 'pp") == 0);
  CHECK(parse_error("pp 0\n").find("t.sched:1:4: pp must be >= 1") == 0);
  CHECK(parse_error("pp 1\nmicro-batches 1\nwidth 3\n").find("t.sched:3:1: unknown line 'width'") == 0);
  CHECK(parse_error("pp 2\nmicro-batches 1\np2p auto\nrank 0: F0 SA0.0>1 B0\nrank 1: F0 B0\n")
            .find("t.sched:4:12: send/recv action in a 'p2p auto' schedule") == 0);
  CHECK(parse_error("pp 1\nmicro-batches 1\np2p maybe\n").find("t.sched:3:5: p2p must be") == 0);
  CHECK_THROWS_WITH_AS(read_schedule_file("/nonexistent/x.sched"), doctest::Contains("cannot open pipeline schedule"),
                       Error);
}
