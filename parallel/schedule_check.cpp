// parallel/schedule_check.cpp — the schedule checker (phases 1-3 here, phase 4
// is the replay below it, shared with the simulator).
#include "parallel/schedule_check.h"

#include <algorithm>
#include <deque>
#include <map>

#include "core/error.h"
#include "parallel/schedule_replay.h"

namespace mpitron::parallel {

std::string CheckResult::located() const {
  if (ok || line <= 0 || source.empty()) return "";
  return str(source, ":", line, ":", column, ": ");
}

std::string CheckResult::message() const {
  if (ok) return "schedule ok";
  std::string where = index >= 0 ? str("rank ", rank, ", action ", index, " (", action)
                                 : str("rank ", rank, ", missing action (", action);
  if (line > 0) where += str(", line ", line, ":", column);
  return where + "): " + why;
}

namespace {

// Per-rank table indexed by (micro-batch, chunk): the action index where
// something happened on this rank, -1 when it has not.
struct Seen {
  int m, v;
  std::vector<int> at;
  Seen(int m_, int v_) : m(m_), v(v_), at(static_cast<size_t>(m_) * v_, -1) {}
  int& operator()(int mb, int chunk) { return at[static_cast<size_t>(mb) * v + chunk]; }
};

const char* op_name(Op op) {
  switch (op) {
    case Op::Forward: return "F";
    case Op::Backward: return "B";
    case Op::SendAct: return "SA";
    case Op::RecvAct: return "RA";
    case Op::SendGrad: return "SG";
    case Op::RecvGrad: return "RG";
    case Op::Weight: return "W";
  }
  return "?";
}


class Checker {
 public:
  explicit Checker(const Schedule& s) : s_(s) {}

  CheckResult run() {
    res_.source = s_.source;
    res_.peak_in_flight.assign(static_cast<size_t>(std::max(s_.pp, 0)), 0);
    if (s_.pp < 1 || s_.virtual_stages < 1 || s_.micro_batches < 1) {
      res_.ok = false;
      res_.why = str("bad sizes: pp ", s_.pp, ", virtual stages ", s_.virtual_stages, ", micro-batches ",
                     s_.micro_batches, " (each must be >= 1)");
      return res_;
    }
    if (static_cast<int>(s_.ranks.size()) != s_.pp) {
      res_.ok = false;
      res_.why = str("the schedule lists ", s_.ranks.size(), " ranks but pp is ", s_.pp);
      return res_;
    }
    const std::string bad = placement_error(s_.placement, s_.pp, s_.virtual_stages);
    if (!bad.empty()) {
      res_.ok = false;
      res_.why = "bad placement: " + bad;
      return res_;
    }
    split_ = has_weight_actions(s_);
    if (!per_action() || !per_rank() || !completeness() || !replay_p2p()) return res_;
    return res_;
  }

 private:
  bool fail(int rank, int index, const std::string& why) {
    res_.ok = false;
    res_.rank = rank;
    res_.index = index;
    res_.why = why;
    if (index >= 0) {
      const Action& a = s_.ranks[rank][index];
      res_.action = to_string(a);
      res_.line = a.line;
      res_.column = a.column;
    }
    return false;
  }

  bool fail_missing(int rank, const std::string& action, const std::string& why) {
    fail(rank, -1, why);
    res_.action = action;
    return false;
  }

  // Phase 1: each action alone.
  bool per_action() {
    const int S = s_.stages();
    for (int r = 0; r < s_.pp; ++r) {
      const auto& acts = s_.ranks[r];
      for (int i = 0; i < static_cast<int>(acts.size()); ++i) {
        const Action& a = acts[i];
        if (a.mb < 0 || a.mb >= s_.micro_batches)
          return fail(r, i, str("micro-batch ", a.mb, " is out of range [0, ", s_.micro_batches, ")"));
        if (a.chunk < 0 || a.chunk >= s_.virtual_stages)
          return fail(r, i, str("chunk ", a.chunk, " is out of range [0, ", s_.virtual_stages,
                                ") (chunks are local to the rank: chunk c is the rank's c-th stage, placement ",
                                s_.placement_kind(), ")"));
        if (a.batched && (is_compute(a.op) || i == 0 || is_compute(acts[i - 1].op)))
          return fail(r, i, "only sends and receives can share a batch, and a batch continues a send/recv");
        if (is_compute(a.op)) continue;
        const int st = s_.stage(r, a.chunk);
        const bool up = a.op == Op::SendAct || a.op == Op::RecvGrad;  // talks to stage + 1
        const int other = up ? st + 1 : st - 1;
        if (other < 0 || other >= S)
          return fail(r, i, str("stage ", st, " is the ", up ? "last" : "first", " stage: ", op_name(a.op), " has no ",
                                up ? "next" : "previous", " stage to talk to"));
        const int want = s_.rank_of_stage(other);
        if (want == r)
          return fail(r, i, str("stage ", other, " is on this rank too: no send/recv is needed between stages ", st,
                                " and ", other));
        if (a.peer != want)
          return fail(r, i, str("peer rank ", a.peer, " is wrong: stage ", other, " lives on rank ", want,
                                " (placement ", s_.placement_kind(), ")"));
      }
    }
    return true;
  }

  // Phase 2: local data flow, rank by rank; also the peak in-flight count.
  bool per_rank() {
    const int S = s_.stages(), m = s_.micro_batches, v = s_.virtual_stages;
    for (int r = 0; r < s_.pp; ++r) {
      Seen f(m, v), b(m, v), w(m, v), sa(m, v), ra(m, v), sg(m, v), rg(m, v);
      int in_flight = 0, peak = 0;
      const auto& acts = s_.ranks[r];
      for (int i = 0; i < static_cast<int>(acts.size()); ++i) {
        const Action& a = acts[i];
        const int st = s_.stage(r, a.chunk);
        Seen* table = nullptr;
        switch (a.op) {
          case Op::Forward: table = &f; break;
          case Op::Backward: table = &b; break;
          case Op::SendAct: table = &sa; break;
          case Op::RecvAct: table = &ra; break;
          case Op::SendGrad: table = &sg; break;
          case Op::RecvGrad: table = &rg; break;
          case Op::Weight: table = &w; break;
        }
        int& prev = (*table)(a.mb, a.chunk);
        if (prev >= 0)
          return fail(r, i, str("runs twice: the same action is already at index ", prev,
                                " (each happens once per step)"));
        if (a.op == Op::Forward && st > 0) {
          const int from = s_.rank_of_stage(st - 1);
          if (from == r) {
            if (f(a.mb, s_.chunk_of_stage(st - 1)) < 0)
              return fail(r, i, str("F of stage ", st, " before ", action_text(Op::Forward, a.mb, s_.chunk_of_stage(st - 1)),
                                    " (stage ", st - 1, ", same rank) produced its input"));
          } else if (ra(a.mb, a.chunk) < 0) {
            return fail(r, i, str("its input activation comes from stage ", st - 1, " on rank ", from, ": no ",
                                  action_text(Op::RecvAct, a.mb, a.chunk, from), " before it"));
          }
        }
        if (a.op == Op::Backward) {
          if (f(a.mb, a.chunk) < 0)
            return fail(r, i, str("B before its F: ", action_text(Op::Forward, a.mb, a.chunk),
                                  " has not run on this rank"));
          if (st < S - 1) {
            const int from = s_.rank_of_stage(st + 1);
            if (from == r) {
              if (b(a.mb, s_.chunk_of_stage(st + 1)) < 0)
                return fail(r, i, str("B of stage ", st, " before ", action_text(Op::Backward, a.mb, s_.chunk_of_stage(st + 1)),
                                      " (stage ", st + 1, ", same rank) produced its output gradient"));
            } else if (rg(a.mb, a.chunk) < 0) {
              return fail(r, i, str("its output gradient comes from stage ", st + 1, " on rank ", from, ": no ",
                                    action_text(Op::RecvGrad, a.mb, a.chunk, from), " before it"));
            }
          }
        }
        if (a.op == Op::Weight && b(a.mb, a.chunk) < 0)
          return fail(r, i, str("W before its B: ", action_text(Op::Backward, a.mb, a.chunk),
                                " (the input gradient, which saves what W needs) has not run on this rank"));
        if (a.op == Op::SendAct && f(a.mb, a.chunk) < 0)
          return fail(r, i, str("sends an activation not yet computed: ", action_text(Op::Forward, a.mb, a.chunk),
                                " must come before it"));
        if (a.op == Op::SendGrad && b(a.mb, a.chunk) < 0)
          return fail(r, i, str("sends a gradient not yet computed: ", action_text(Op::Backward, a.mb, a.chunk),
                                " must come before it"));
        prev = i;
        // In flight: F has run, and W (or B, when the backward is not split) not yet.
        if (a.op == Op::Forward) {
          peak = std::max(peak, ++in_flight);
          if (s_.max_in_flight > 0 && in_flight > s_.max_in_flight)
            return fail(r, i, str(in_flight, " forwards in flight on this rank (run, their ", split_ ? "W" : "B",
                                  " not yet), above the schedule's max-in-flight ", s_.max_in_flight,
                                  ": run a ", split_ ? "W" : "B", " before this F or raise the bound"));
        }
        if (a.op == (split_ ? Op::Weight : Op::Backward)) --in_flight;
      }
      res_.peak_in_flight[r] = peak;
    }
    return true;
  }

  // Phase 3: every F/B present; every send/recv has its partner.
  bool completeness() {
    const int m = s_.micro_batches, v = s_.virtual_stages;
    std::vector<Seen> f(s_.pp, Seen(m, v)), b(s_.pp, Seen(m, v)), w(s_.pp, Seen(m, v));
    // sent[r] / received[r]: (kind, mb, stage of the SENDER) -> count, per rank pair.
    std::map<std::tuple<int, int, int, int, int>, int> sends, recvs;  // (src, dst, grad?, mb, src stage)
    for (int r = 0; r < s_.pp; ++r) {
      const auto& acts = s_.ranks[r];
      for (int i = 0; i < static_cast<int>(acts.size()); ++i) {
        const Action& a = acts[i];
        const int st = s_.stage(r, a.chunk);
        if (a.op == Op::Forward) f[r](a.mb, a.chunk) = i;
        if (a.op == Op::Backward) b[r](a.mb, a.chunk) = i;
        if (a.op == Op::Weight) w[r](a.mb, a.chunk) = i;
        if (a.op == Op::SendAct) ++sends[{r, a.peer, 0, a.mb, st}];
        if (a.op == Op::SendGrad) ++sends[{r, a.peer, 1, a.mb, st}];
        if (a.op == Op::RecvAct) ++recvs[{a.peer, r, 0, a.mb, st - 1}];
        if (a.op == Op::RecvGrad) ++recvs[{a.peer, r, 1, a.mb, st + 1}];
      }
    }
    for (int r = 0; r < s_.pp; ++r) {
      const auto& acts = s_.ranks[r];
      for (int i = 0; i < static_cast<int>(acts.size()); ++i) {
        const Action& a = acts[i];
        if (a.op == Op::Forward && b[r](a.mb, a.chunk) < 0)
          return fail(r, i, str("has no backward: ", action_text(Op::Backward, a.mb, a.chunk),
                                " is missing on this rank (every forward needs its backward in the same step)"));
        if (split_ && a.op == Op::Backward && w[r](a.mb, a.chunk) < 0)
          return fail(r, i, str("has no weight gradient: ", action_text(Op::Weight, a.mb, a.chunk),
                                " is missing on this rank (the schedule has W actions, so B computes only the input "
                                "gradient and every B needs its W once)"));
      }
      for (int mb = 0; mb < m; ++mb)
        for (int c = 0; c < v; ++c)
          if (f[r](mb, c) < 0)
            return fail_missing(r, action_text(Op::Forward, mb, c),
                                str("rank ", r, " never runs ", action_text(Op::Forward, mb, c), " (stage ",
                                    s_.stage(r, c), " of micro-batch ", mb, ")"));
    }
    for (int r = 0; r < s_.pp; ++r) {
      const auto& acts = s_.ranks[r];
      for (int i = 0; i < static_cast<int>(acts.size()); ++i) {
        const Action& a = acts[i];
        if (is_compute(a.op)) continue;
        const int st = s_.stage(r, a.chunk);
        if (is_recv(a.op)) {
          const bool grad = a.op == Op::RecvGrad;
          const int src_stage = grad ? st + 1 : st - 1;
          if (!sends.count({a.peer, r, grad, a.mb, src_stage}))
            return fail(r, i, str("nothing sends it: rank ", a.peer, " has no ",
                                  action_text(grad ? Op::SendGrad : Op::SendAct, a.mb, s_.chunk_of_stage(src_stage), r)));
        } else {
          const bool grad = a.op == Op::SendGrad;
          if (!recvs.count({r, a.peer, grad, a.mb, st}))
            return fail(r, i, str("nothing receives it: rank ", a.peer, " has no ",
                                  action_text(grad ? Op::RecvGrad : Op::RecvAct, a.mb,
                                           s_.chunk_of_stage(grad ? st - 1 : st + 1), r)));
        }
      }
    }
    return true;
  }

  // Phase 4: blocking point-to-point replay.
  bool replay_p2p() {
    detail::ReplayResult rr = detail::replay(s_, detail::ReplayCosts{});
    if (!rr.ok) return fail(rr.rank, rr.index, rr.why);
    return true;
  }

  const Schedule& s_;
  CheckResult res_;
  bool split_ = false;  // the schedule has W actions
};

}  // namespace

CheckResult check_schedule(const Schedule& s) { return Checker(s).run(); }

void validate_schedule(const Schedule& s) {
  CheckResult r = check_schedule(s);
  if (!r.ok)
    MPT_THROW(str(r.located(), "pipeline schedule '", s.name, "' rejected: ", r.message()),
              "fix the schedule (docs/pipeline-schedules.md), or run apps/schedule_sim --schedule-file to inspect it");
}

// ---- the replay ------------------------------------------------------------------

namespace detail {

namespace {

struct Posted {
  int rank, index;
  double post;
  bool matched = false;
  double done = 0;
};

}  // namespace

ReplayResult replay(const Schedule& s, const ReplayCosts& costs) {
  ReplayResult res;
  const int P = s.pp;
  res.spans.resize(P);
  res.finish.assign(P, 0.0);
  std::vector<int> pc(P, 0);          // next action to run
  std::vector<double> clock(P, 0.0);  // when the rank is free
  std::vector<int> group_end(P, -1);  // end of the posted batch; -1: none posted
  std::vector<std::vector<int>> group_ops(P);
  std::vector<Posted> ops;
  std::map<std::pair<int, int>, std::pair<std::deque<int>, std::deque<int>>> channels;  // (src,dst): sends, recvs

  auto fail = [&](int rank, int index, std::string why) {
    if (!res.ok) return;
    res.ok = false;
    res.rank = rank;
    res.index = index;
    res.why = std::move(why);
  };
  // Pairs heads of the (src, dst) channel while both sides have posted.
  auto match = [&](int src, int dst) {
    auto& [sq, rq] = channels[{src, dst}];
    while (res.ok && !sq.empty() && !rq.empty()) {
      Posted& so = ops[sq.front()];
      Posted& ro = ops[rq.front()];
      sq.pop_front();
      rq.pop_front();
      const Action& sa = s.ranks[so.rank][so.index];
      const Action& ra = s.ranks[ro.rank][ro.index];
      const bool grad = sa.op == Op::SendGrad;
      const int want_stage = s.stage(so.rank, sa.chunk) + (grad ? -1 : 1);
      const bool same = (ra.op == (grad ? Op::RecvGrad : Op::RecvAct)) && ra.mb == sa.mb &&
                        s.stage(ro.rank, ra.chunk) == want_stage;
      if (!same) {
        // Name whichever of the pair was posted by the lower rank: it is the
        // first of the two in the report's rank order.
        const bool recv_first = ro.rank < so.rank;
        const Posted& me = recv_first ? ro : so;
        fail(me.rank, me.index,
             str("pairs with the wrong message: rank ", so.rank, "'s ", to_string(sa), " (action ", so.index,
                 ") meets rank ", ro.rank, "'s ", to_string(ra), " (action ", ro.index,
                 "); sends and receives between two ranks pair in the order they are posted (no tags, as in NCCL),"
                 " so both ranks must post these messages in the same order"));
        return;
      }
      so.matched = ro.matched = true;
      so.done = ro.done = std::max(so.post, ro.post) + costs.p2p;
    }
  };

  bool progress = true;
  while (progress && res.ok) {
    progress = false;
    for (int r = 0; r < P && res.ok; ++r) {
      const auto& acts = s.ranks[r];
      const int n = static_cast<int>(acts.size());
      while (pc[r] < n && res.ok) {
        const Action& a = acts[pc[r]];
        if (is_compute(a.op)) {
          const double cost = costs.cost(a.op, s.stage(r, a.chunk));
          res.spans[r].push_back(Span{pc[r], 1, true, clock[r], clock[r] + cost});
          clock[r] += cost;
          ++pc[r];
          progress = true;
          continue;
        }
        if (group_end[r] < 0) {  // post the whole batch
          int end = pc[r] + 1;
          while (end < n && acts[end].batched) ++end;
          group_end[r] = end;
          group_ops[r].clear();
          for (int i = pc[r]; i < end; ++i) {
            const Action& b = acts[i];
            const int id = static_cast<int>(ops.size());
            ops.push_back(Posted{r, i, clock[r]});
            group_ops[r].push_back(id);
            if (is_send(b.op)) {
              channels[{r, b.peer}].first.push_back(id);
              match(r, b.peer);
            } else {
              channels[{b.peer, r}].second.push_back(id);
              match(b.peer, r);
            }
          }
          progress = true;
        }
        double done = clock[r];
        bool all = true;
        for (int id : group_ops[r]) {
          all = all && ops[id].matched;
          if (ops[id].matched) done = std::max(done, ops[id].done);
        }
        if (!all) break;  // blocked; another rank must move first
        res.spans[r].push_back(Span{pc[r], group_end[r] - pc[r], false, clock[r], done});
        clock[r] = done;
        pc[r] = group_end[r];
        group_end[r] = -1;
        progress = true;
      }
    }
  }
  if (!res.ok) return res;

  // Deadlock: ranks left, none can move. Each blocked rank waits on the peer of
  // its first unmatched op; follow the waits from the lowest blocked rank.
  std::vector<int> blocked_op(P, -1);  // op id each rank waits on
  int lowest = -1;
  for (int r = 0; r < P; ++r) {
    if (pc[r] >= static_cast<int>(s.ranks[r].size())) continue;
    for (int id : group_ops[r])
      if (!ops[id].matched) {
        blocked_op[r] = id;
        break;
      }
    if (lowest < 0) lowest = r;
  }
  if (lowest >= 0) {
    std::vector<int> order;
    std::vector<int> seen_at(P, -1);
    int r = lowest;
    while (r >= 0 && blocked_op[r] >= 0 && seen_at[r] < 0) {
      seen_at[r] = static_cast<int>(order.size());
      order.push_back(r);
      r = s.ranks[r][ops[blocked_op[r]].index].peer;
    }
    auto describe = [&](int rank) {
      const Posted& o = ops[blocked_op[rank]];
      return str("rank ", rank, " waits at action ", o.index, " (", to_string(s.ranks[rank][o.index]), ")");
    };
    if (r >= 0 && blocked_op[r] >= 0) {  // a cycle: report its lowest rank
      std::vector<int> cycle(order.begin() + seen_at[r], order.end());
      const int first = *std::min_element(cycle.begin(), cycle.end());
      std::string chain;
      for (size_t k = 0; k < cycle.size(); ++k) chain += describe(cycle[k]) + " on rank " +
                                                         std::to_string(s.ranks[cycle[k]][ops[blocked_op[cycle[k]]].index].peer) + "; ";
      fail(first, ops[blocked_op[first]].index,
           str("deadlock: blocks forever under blocking send/recv: ", chain,
               "no rank can move. Post the crossing sends and receives in one batch [..] or swap their order"));
    } else {  // the chain ends at a rank that has nothing left to post
      const int last = order.back();
      fail(last, ops[blocked_op[last]].index,
           str("blocks forever: rank ", r, " has finished and never posts the matching ",
               is_send(s.ranks[last][ops[blocked_op[last]].index].op) ? "receive" : "send",
               " (it was posted there for an earlier message, or too few are posted)"));
    }
    return res;
  }
  for (int r = 0; r < P; ++r) res.finish[r] = clock[r];
  return res;
}

}  // namespace detail

}  // namespace mpitron::parallel
