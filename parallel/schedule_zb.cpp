// parallel/schedule_zb.cpp — zero-bubble built-ins (ZB-H1, ZB-V) and the
// timed send/recv insertion they use (with_timed_p2p, schedule.h).
//
// Zero bubble (Qi et al. 2023): a backward splits into B (the input gradient,
// on the critical path between stages) and W (the weight gradient, needed by
// nobody else this step). W can wait, so it fills the bubbles 1F1B leaves.
#include <algorithm>
#include <deque>
#include <limits>
#include <map>
#include <tuple>

#include "core/error.h"
#include "parallel/schedule.h"

namespace mpitron::parallel {

namespace {

Action make(Op op, int mb, int chunk, int peer = -1) {
  Action a;
  a.op = op;
  a.mb = mb;
  a.chunk = chunk;
  a.peer = peer;
  return a;
}

void check_sizes(const char* what, int pp, int m) {
  MPT_CHECK(pp >= 1, str(what, ": pipeline-parallel size must be >= 1, got ", pp), "pass --pp 1 or more");
  MPT_CHECK(m >= 1, str(what, ": micro-batch count must be >= 1, got ", m), "pass --micro-batches 1 or more");
  check_schedule_size(what, pp, m, 2);  // zbv holds two chunks per rank; zb-h1 one (bounded the same)
}

// Key of one compute: (op, micro-batch, global stage).
using Key = std::tuple<int, int, int>;
Key key(Op op, int mb, int stage) { return {static_cast<int>(op), mb, stage}; }

}  // namespace

// ---- timed send/recv ------------------------------------------------------------

Schedule with_timed_p2p(const Schedule& s) {
  MPT_CHECK(!has_p2p(s), "with_timed_p2p: the schedule already holds send/recv actions",
            "insert p2p actions only into a compute-only schedule");
  const std::string bad = placement_error(s.placement, s.pp, s.virtual_stages);
  MPT_CHECK(bad.empty(), str("with_timed_p2p: bad placement: ", bad), "see docs/pipeline-schedules.md, 'Placement'");
  const int P = s.pp, S = s.stages();
  MPT_CHECK(static_cast<int>(s.ranks.size()) == P, str("with_timed_p2p: ", s.ranks.size(), " ranks listed, pp is ", P),
            "");
  for (int r = 0; r < P; ++r)
    for (const Action& a : s.ranks[r])
      MPT_CHECK(a.mb >= 0 && a.mb < s.micro_batches && a.chunk >= 0 && a.chunk < s.virtual_stages,
                str("with_timed_p2p: rank ", r, ": ", to_string(a), " is out of range (micro-batches ",
                    s.micro_batches, ", virtual stages ", s.virtual_stages, ")"),
                "");
  // 1. Unit-cost timeline: each rank runs its next compute as soon as its inputs exist.
  std::map<Key, int> done;  // compute -> the time it finishes
  auto ready = [&](const Key& k, int t) {
    auto it = done.find(k);
    return it != done.end() && it->second <= t;
  };
  std::vector<size_t> pc(P, 0);
  std::vector<std::vector<int>> start(P);  // per rank: start time of each compute, in order
  size_t left = s.action_count();
  for (int t = 0; left > 0; ++t) {
    bool moved = false;
    for (int r = 0; r < P; ++r) {
      if (pc[r] >= s.ranks[r].size()) continue;
      const Action& a = s.ranks[r][pc[r]];
      const int st = s.stage(r, a.chunk);
      bool ok = true;
      if (a.op == Op::Forward) ok = st == 0 || ready(key(Op::Forward, a.mb, st - 1), t);
      if (a.op == Op::Backward)
        ok = ready(key(Op::Forward, a.mb, st), t) && (st == S - 1 || ready(key(Op::Backward, a.mb, st + 1), t));
      if (a.op == Op::Weight) ok = ready(key(Op::Backward, a.mb, st), t);
      if (!ok) continue;
      done[key(a.op, a.mb, st)] = t + 1;
      start[r].push_back(t);
      ++pc[r];
      --left;
      moved = true;
    }
    if (!moved) {  // everything that ran before t has finished by t: nothing will ever move
      std::string stuck;
      for (int r = 0; r < P; ++r)
        if (pc[r] < s.ranks[r].size()) {
          const Action& a = s.ranks[r][pc[r]];
          stuck += str(stuck.empty() ? "" : "; ", "rank ", r, " at action ", pc[r], " (", to_string(a));
          if (a.line > 0) stuck += str(", line ", a.line, ":", a.column);
          stuck += ")";
        }
      MPT_THROW(str(s.source.empty() ? "" : s.source + ": ", s.name.empty() ? "" : "schedule '" + s.name + "': ",
                    "the compute order cannot run (p2p timed): ", stuck, " wait for inputs no rank will produce"),
                "each F needs the previous stage's F, each B its F and the next stage's B, each W its B");
    }
  }
  // 2. Messages: produced at the end of their compute, sent and received at that time.
  struct Msg {
    int time;
    Action act;
  };
  std::vector<std::vector<Msg>> msgs(P);
  std::map<Key, const Action*> consumer;  // (op, mb, stage) -> the compute, for line numbers
  for (int r = 0; r < P; ++r)
    for (const Action& a : s.ranks[r]) consumer[key(a.op, a.mb, s.stage(r, a.chunk))] = &a;
  for (int r = 0; r < P; ++r)
    for (size_t i = 0; i < s.ranks[r].size(); ++i) {
      const Action& a = s.ranks[r][i];
      if (a.op == Op::Weight) continue;
      const int st = s.stage(r, a.chunk);
      const bool fwd = a.op == Op::Forward;
      const int to_stage = fwd ? st + 1 : st - 1;
      if (to_stage < 0 || to_stage >= S) continue;
      const int q = s.rank_of_stage(to_stage);
      if (q == r) continue;  // a local hand-off
      const int t = start[r][i] + 1;
      Action send = make(fwd ? Op::SendAct : Op::SendGrad, a.mb, a.chunk, q);
      send.line = a.line;
      send.column = a.column;
      Action recv = make(fwd ? Op::RecvAct : Op::RecvGrad, a.mb, s.chunk_of_stage(to_stage), r);
      const Action* c = consumer[key(fwd ? Op::Forward : Op::Backward, a.mb, to_stage)];
      if (c) {
        recv.line = c->line;
        recv.column = c->column;
      }
      msgs[r].push_back({t, send});
      msgs[q].push_back({t, recv});
    }
  // 3. Merge: the batch of time t goes after the computes that end by t, before those that start at t.
  Schedule out = s;
  for (int r = 0; r < P; ++r) {
    auto& m = msgs[r];
    std::stable_sort(m.begin(), m.end(), [](const Msg& x, const Msg& y) {
      if (x.time != y.time) return x.time < y.time;
      return is_send(x.act.op) && !is_send(y.act.op);  // sends first, then receives (by production order)
    });
    std::vector<Action> acts;
    size_t k = 0;
    auto flush_until = [&](int t) {
      while (k < m.size() && m[k].time <= t) {
        const int bt = m[k].time;
        bool first = true;
        while (k < m.size() && m[k].time == bt) {
          Action a = m[k++].act;
          a.batched = !first;
          first = false;
          acts.push_back(a);
        }
      }
    };
    for (size_t i = 0; i < s.ranks[r].size(); ++i) {
      flush_until(start[r][i]);
      acts.push_back(s.ranks[r][i]);
      acts.back().batched = false;
    }
    flush_until(std::numeric_limits<int>::max());
    out.ranks[r] = std::move(acts);
  }
  return out;
}

// ---- ZB-H1 ------------------------------------------------------------------------

Schedule zb_h1_schedule(int pp, int m) {
  check_sizes("zb-h1", pp, m);
  Schedule s;
  s.name = "zb-h1";
  s.pp = pp;
  s.micro_batches = m;
  s.virtual_stages = 1;
  s.ranks.resize(static_cast<size_t>(pp));
  for (int r = 0; r < pp; ++r) {
    auto& acts = s.ranks[r];
    const int warmup = std::min(pp - r - 1, m);  // as 1F1B
    const int defer = r;                         // W runs `defer` micro-batches behind B
    int w = 0;
    for (int k = 0; k < warmup; ++k) acts.push_back(make(Op::Forward, k, 0));
    for (int k = 0; k < m; ++k) {
      if (k + warmup < m) acts.push_back(make(Op::Forward, k + warmup, 0));
      acts.push_back(make(Op::Backward, k, 0));
      if (k - defer >= 0) acts.push_back(make(Op::Weight, w++, 0));
    }
    while (w < m) acts.push_back(make(Op::Weight, w++, 0));  // the cool-down: deferred Ws fill the bubble
  }
  return with_timed_p2p(s);
}

// ---- ZB-V -------------------------------------------------------------------------

Schedule zbv_schedule(int pp, int m) {
  check_sizes("zbv", pp, m);
  Schedule s;
  s.name = "zbv";
  s.pp = pp;
  s.micro_batches = m;
  s.virtual_stages = 2;
  s.placement = v_placement(pp);
  s.ranks.resize(static_cast<size_t>(pp));
  const int S = 2 * pp;
  const int cap = 2 * pp;  // chunks in flight: 1F1B's pp micro-batches of a whole rank
  // Finish times of F and B per (micro-batch, stage); -1: not run.
  std::vector<int> fdone(static_cast<size_t>(m) * S, -1), bdone(static_cast<size_t>(m) * S, -1);
  auto at = [&](std::vector<int>& v, int mb, int st) -> int& { return v[static_cast<size_t>(mb) * S + st]; };
  auto by = [&](std::vector<int>& v, int mb, int st, int t) { return at(v, mb, st) >= 0 && at(v, mb, st) <= t; };
  std::vector<int> next_f(S, 0), next_b(S, 0);  // micro-batches run in order per stage
  std::vector<int> in_flight(pp, 0);
  std::vector<std::deque<std::pair<int, int>>> pending_w(pp);  // (mb, stage), oldest first
  int left = 3 * m * S;
  const int limit = 4 * left + 4 * S + 16;
  for (int t = 0; left > 0; ++t) {
    MPT_CHECK(t < limit, str("zbv: the list scheduler did not finish for pp ", pp, ", m ", m), "this is a bug");
    for (int r = 0; r < pp; ++r) {
      const int later = S - 1 - r, earlier = r;  // this rank's stages; the later one first
      auto chunk_of = [&](int st) { return st < pp ? 0 : 1; };
      bool ran = false;
      if (in_flight[r] < cap)
        for (int st : {later, earlier}) {
          const int mb = next_f[st];
          if (mb < m && (st == 0 || by(fdone, mb, st - 1, t))) {
            s.ranks[r].push_back(make(Op::Forward, mb, chunk_of(st)));
            at(fdone, mb, st) = t + 1;
            ++next_f[st];
            ++in_flight[r];
            ran = true;
            break;
          }
        }
      if (!ran)
        for (int st : {later, earlier}) {
          const int mb = next_b[st];
          if (mb < m && by(fdone, mb, st, t) && (st == S - 1 || by(bdone, mb, st + 1, t))) {
            s.ranks[r].push_back(make(Op::Backward, mb, chunk_of(st)));
            at(bdone, mb, st) = t + 1;
            ++next_b[st];
            pending_w[r].push_back({mb, st});
            ran = true;
            break;
          }
        }
      if (!ran && !pending_w[r].empty()) {
        const auto [mb, st] = pending_w[r].front();
        pending_w[r].pop_front();
        s.ranks[r].push_back(make(Op::Weight, mb, chunk_of(st)));
        --in_flight[r];
        ran = true;
      }
      left -= ran;
    }
  }
  return with_timed_p2p(s);
}

}  // namespace mpitron::parallel
