// parallel/schedule.cpp — schedule representation, built-ins, send/recv
// insertion, and the line format (parser with line:column errors, writer).
#include "parallel/schedule.h"

#include <algorithm>
#include <cctype>
#include <fstream>
#include <sstream>

#include "core/error.h"

namespace mpitron::parallel {

namespace {

const char* op_prefix(Op op) {
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

void check_sizes(const char* what, int pp, int m, int v) {
  MPT_CHECK(pp >= 1, str(what, ": pipeline-parallel size must be >= 1, got ", pp), "pass --pp 1 or more");
  MPT_CHECK(m >= 1, str(what, ": micro-batch count must be >= 1, got ", m), "pass --micro-batches 1 or more");
  MPT_CHECK(v >= 1, str(what, ": virtual stages per rank must be >= 1, got ", v), "pass --virtual-stages 1 or more");
  check_schedule_size(what, pp, m, v);
}

}  // namespace

void check_schedule_size(const std::string& what, int64_t pp, int64_t m, int64_t v) {
  MPT_CHECK(pp <= kMaxPipelineRanks, str(what, ": pipeline-parallel size ", pp, " exceeds ", kMaxPipelineRanks), "");
  MPT_CHECK(v <= kMaxVirtualStages, str(what, ": ", v, " virtual stages per rank exceed ", kMaxVirtualStages), "");
  MPT_CHECK(m <= kMaxScheduleForwards / std::max<int64_t>(1, pp * v),
            str(what, ": ", m, " micro-batches x pp ", pp, " x virtual stages ", v, " exceed ", kMaxScheduleForwards,
                " forwards per step"),
            "a schedule that large is not a training step: check the number (a pipeline step runs thousands of "
            "micro-batches at most)");
}

namespace {

Schedule empty_schedule(const std::string& name, int pp, int m, int v) {
  Schedule s;
  s.name = name;
  s.pp = pp;
  s.micro_batches = m;
  s.virtual_stages = v;
  s.ranks.resize(static_cast<size_t>(pp));
  return s;
}

Action compute(Op op, int mb, int chunk) {
  Action a;
  a.op = op;
  a.mb = mb;
  a.chunk = chunk;
  return a;
}

Action p2p(Op op, int mb, int chunk, int peer) {
  Action a = compute(op, mb, chunk);
  a.peer = peer;
  return a;
}

}  // namespace

std::string to_string(const Action& a) {
  std::string s = str(op_prefix(a.op), a.mb, ".", a.chunk);
  if (is_send(a.op)) s += str(">", a.peer);
  if (is_recv(a.op)) s += str("<", a.peer);
  return s;
}

std::string action_text(Op op, int mb, int chunk, int peer) {
  Action a;
  a.op = op;
  a.mb = mb;
  a.chunk = chunk;
  a.peer = peer;
  return to_string(a);
}

// ---- placement -------------------------------------------------------------------

int Schedule::stage(int rank, int chunk) const {
  if (placement.empty()) return chunk * pp + rank;
  int seen = 0;
  for (int st = 0; st < static_cast<int>(placement.size()); ++st)
    if (placement[st] == rank && seen++ == chunk) return st;
  return -1;  // no such chunk (placement_error says why)
}

int Schedule::rank_of_stage(int s) const {
  if (placement.empty()) return s % pp;
  return s >= 0 && s < static_cast<int>(placement.size()) ? placement[s] : -1;
}

int Schedule::chunk_of_stage(int s) const {
  if (placement.empty()) return s / pp;
  int chunk = 0;
  for (int st = 0; st < s && st < static_cast<int>(placement.size()); ++st) chunk += placement[st] == placement[s];
  return chunk;
}

std::vector<int> Schedule::stage_ranks() const {
  if (!placement.empty()) return placement;
  std::vector<int> out(static_cast<size_t>(std::max(stages(), 0)));
  for (int st = 0; st < stages(); ++st) out[st] = st % pp;
  return out;
}

std::string Schedule::placement_kind() const {
  bool round_robin = true;
  for (int st = 0; st < static_cast<int>(placement.size()); ++st) round_robin = round_robin && placement[st] == st % pp;
  if (round_robin) return "round-robin";
  if (virtual_stages == 2 && placement == v_placement(pp)) return "v";
  return "explicit";
}

std::vector<int> v_placement(int pp) {
  std::vector<int> out;
  for (int r = 0; r < pp; ++r) out.push_back(r);
  for (int r = pp - 1; r >= 0; --r) out.push_back(r);
  return out;
}

std::string placement_error(const std::vector<int>& placement, int pp, int v) {
  if (placement.empty()) return "";
  if (static_cast<int>(placement.size()) != pp * v)
    return str("the placement lists ", placement.size(), " stages but pp ", pp, " x virtual-stages ", v, " is ", pp * v);
  std::vector<int> count(static_cast<size_t>(std::max(pp, 0)), 0);
  for (size_t st = 0; st < placement.size(); ++st) {
    if (placement[st] < 0 || placement[st] >= pp)
      return str("stage ", st, " is placed on rank ", placement[st], ", outside pp ", pp);
    ++count[placement[st]];
  }
  for (int r = 0; r < pp; ++r)
    if (count[r] != v)
      return str("rank ", r, " holds ", count[r], " stages; with virtual-stages ", v, " every rank holds ", v);
  return "";
}

bool has_weight_actions(const Schedule& s) {
  for (const auto& r : s.ranks)
    for (const auto& a : r)
      if (a.op == Op::Weight) return true;
  return false;
}

size_t Schedule::action_count() const {
  size_t n = 0;
  for (const auto& r : ranks) n += r.size();
  return n;
}

bool operator==(const Schedule& a, const Schedule& b) {
  return a.pp == b.pp && a.virtual_stages == b.virtual_stages && a.micro_batches == b.micro_batches &&
         a.stage_ranks() == b.stage_ranks() && a.max_in_flight == b.max_in_flight && a.ranks == b.ranks;
}

// ---- built-ins ------------------------------------------------------------------

Schedule gpipe_schedule(int pp, int m) {
  check_sizes("gpipe", pp, m, 1);
  Schedule s = empty_schedule("gpipe", pp, m, 1);
  for (int r = 0; r < pp; ++r) {
    for (int mb = 0; mb < m; ++mb) s.ranks[r].push_back(compute(Op::Forward, mb, 0));
    for (int mb = 0; mb < m; ++mb) s.ranks[r].push_back(compute(Op::Backward, mb, 0));
  }
  return with_p2p(s);
}

Schedule one_f_one_b_schedule(int pp, int m) {
  check_sizes("1f1b", pp, m, 1);
  Schedule s = empty_schedule("1f1b", pp, m, 1);
  for (int r = 0; r < pp; ++r) {
    auto& acts = s.ranks[r];
    const int warmup = std::min(pp - r - 1, m);  // forwards in flight before the first backward
    const int steady = m - warmup;
    for (int i = 0; i < warmup; ++i) acts.push_back(compute(Op::Forward, i, 0));
    for (int i = 0; i < steady; ++i) {
      acts.push_back(compute(Op::Forward, warmup + i, 0));
      acts.push_back(compute(Op::Backward, i, 0));
    }
    for (int i = steady; i < m; ++i) acts.push_back(compute(Op::Backward, i, 0));
  }
  return with_p2p(s);
}

Schedule interleaved_schedule(int pp, int m, int v) {
  check_sizes("interleaved", pp, m, v);
  MPT_CHECK(m % pp == 0,
            str("interleaved schedule: number of micro-batches (", m,
                ") is not divisible by pipeline-model-parallel size (", pp, ")"),
            "as in Megatron-LM, the interleaved schedule needs --micro-batches to be a multiple of --pp");
  Schedule s = empty_schedule("interleaved", pp, m, v);
  const int total = m * v;  // (micro-batch, chunk) pairs per rank
  const int group = pp * v;
  // Megatron's virtual micro-batch k -> (micro-batch, chunk): groups of pp
  // micro-batches go through chunk 0, then chunk 1, ...; backward visits the
  // chunks in reverse.
  auto mb_of = [&](int k) { return (k / group) * pp + k % pp; };
  auto chunk_of = [&](int k, bool forward) {  // k may be negative (Megatron's lag): Python's modulo
    int c = (((k % group) + group) % group) / pp;
    return forward ? c : v - 1 - c;
  };
  // Megatron: with as many micro-batches as ranks the whole step is warm-up.
  auto warmup_of = [&](int r) { return m == pp ? total : std::min((pp - r - 1) * 2 + (v - 1) * pp, total); };
  if (pp == 1) {  // every stage is local: no send/recv at all
    auto& acts = s.ranks[0];
    const int warmup = warmup_of(0), steady = total - warmup;
    for (int k = 0; k < warmup; ++k) acts.push_back(compute(Op::Forward, mb_of(k), chunk_of(k, true)));
    for (int i = 0; i < steady; ++i) {
      acts.push_back(compute(Op::Forward, mb_of(warmup + i), chunk_of(warmup + i, true)));
      acts.push_back(compute(Op::Backward, mb_of(i), chunk_of(i, false)));
    }
    for (int k = steady; k < total; ++k) acts.push_back(compute(Op::Backward, mb_of(k), chunk_of(k, false)));
    return s;
  }
  // The send/recv pattern is Megatron's (forward_backward_pipelining_with_
  // interleaving, batched p2p): one batch after every warm-up forward, one
  // after every steady (F, B) pair, one after every cool-down backward; a
  // batch sends what was just computed and receives, from the previous and
  // next rank, whatever they send in the same batch. Received tensors queue
  // per chunk, so the j-th activation received for chunk c feeds the j-th
  // forward of chunk c (likewise gradients), which names each recv.
  for (int r = 0; r < pp; ++r) {
    auto& acts = s.ranks[r];
    const int prev = (r + pp - 1) % pp, next = (r + 1) % pp;
    const bool first_rank = r == 0, last_rank = r == pp - 1;
    const int warmup = warmup_of(r), steady = total - warmup;
    const bool all_warmup = warmup == total;
    std::vector<int> act_recvd(v, 0), grad_recvd(v, 0);  // recvs so far per chunk
    // The n-th forward (backward) of chunk c has micro-batch mb_of(k) for the n-th k of that chunk:
    // micro-batches of one chunk run in increasing order, so that is (n / pp) * pp + n % pp = n.
    auto fwd = [&](int k) { acts.push_back(compute(Op::Forward, mb_of(k), chunk_of(k, true))); };
    auto bwd = [&](int k) { acts.push_back(compute(Op::Backward, mb_of(k), chunk_of(k, false))); };
    // One batch: [SA of forward fk] [RA for chunk rc] [SG of backward bk] [RG for chunk gc]; -1 = none.
    auto batch = [&](int fk, int rc, int bk, int gc) {
      std::vector<Action> b;
      if (fk >= 0 && !(last_rank && chunk_of(fk, true) == v - 1))
        b.push_back(p2p(Op::SendAct, mb_of(fk), chunk_of(fk, true), next));
      if (rc >= 0) b.push_back(p2p(Op::RecvAct, act_recvd[rc]++, rc, prev));
      if (bk >= 0 && !(first_rank && chunk_of(bk, false) == 0))
        b.push_back(p2p(Op::SendGrad, mb_of(bk), chunk_of(bk, false), prev));
      if (gc >= 0) b.push_back(p2p(Op::RecvGrad, grad_recvd[gc]++, gc, next));
      for (size_t i = 0; i < b.size(); ++i) {
        b[i].batched = i > 0;
        acts.push_back(b[i]);
      }
    };
    if (!first_rank) batch(-1, 0, -1, -1);  // recv_forward for the first forward
    for (int k = 0; k < warmup; ++k) {
      fwd(k);
      const int next_chunk = chunk_of(k + 1, true);
      bool recv_prev = !(first_rank && next_chunk == 0) && k != total - 1;
      const bool recv_next = k == warmup - 1 && !all_warmup && !last_rank;
      batch(k, recv_prev ? next_chunk : -1, -1, recv_next ? v - 1 : -1);
    }
    for (int i = 0; i < steady; ++i) {
      const int fk = warmup + i, bk = i;
      fwd(fk);
      bwd(bk);
      bool recv_prev = true, recv_next = true;
      int next_fchunk, next_bchunk;
      if (first_rank) {  // rank 0 receives from the last rank, pp - 1 forwards behind
        next_fchunk = chunk_of(fk - (pp - 1), true);
        recv_prev = next_fchunk != v - 1;
        ++next_fchunk;
      } else {
        next_fchunk = chunk_of(fk + 1, true);
      }
      if (last_rank) {  // the last rank receives gradients from rank 0, pp - 1 backwards behind
        next_bchunk = chunk_of(bk - (pp - 1), false);
        recv_next = next_bchunk != 0;
        --next_bchunk;
      } else {
        next_bchunk = chunk_of(bk + 1, false);
      }
      if (i == steady - 1) recv_prev = false;
      batch(fk, recv_prev ? next_fchunk : -1, bk, recv_next ? next_bchunk : -1);
    }
    if (all_warmup && !last_rank) batch(-1, -1, -1, v - 1);  // recv_backward for the first backward
    for (int k = steady; k < total; ++k) {
      bwd(k);
      const int next_chunk = chunk_of(k + 1, false);
      bool recv_next = !(last_rank && next_chunk == v - 1) && k != total - 1;
      batch(-1, -1, k, recv_next ? next_chunk : -1);
    }
  }
  return s;
}

bool is_builtin_schedule(const std::string& name) {
  return name == "gpipe" || name == "1f1b" || name == "interleaved" || name == "zb-h1" || name == "zbv";
}

Schedule builtin_schedule(const std::string& name, int pp, int m, int v) {
  if (name == "gpipe" || name == "1f1b") {
    // GPipe over round-robin chunks with just-in-time send/recv deadlocks once
    // m > pp (the checker shows the cycle through the last rank -> rank 0 hop).
    MPT_CHECK(v == 1, str(name, " with ", v, " virtual stages per rank is not a built-in"),
              "use --schedule interleaved for virtual pipeline stages");
    return name == "gpipe" ? gpipe_schedule(pp, m) : one_f_one_b_schedule(pp, m);
  }
  if (name == "interleaved") return interleaved_schedule(pp, m, v);
  if (name == "zb-h1") {
    MPT_CHECK(v == 1, str("zb-h1 with ", v, " virtual stages per rank is not a built-in"),
              "zb-h1 runs one chunk per rank; use zbv for two chunks per rank (V placement)");
    return zb_h1_schedule(pp, m);
  }
  if (name == "zbv") {
    MPT_CHECK(v == 2, str("zbv needs 2 virtual stages per rank (V placement: rank r holds stages r and 2pp-1-r), got ", v),
              "pass --virtual-stages 2 (schedule_sim) or --num-layers-per-virtual-pipeline-stage = layers / (2 pp)");
    return zbv_schedule(pp, m);
  }
  MPT_THROW(str("unknown pipeline schedule '", name, "'"), "built-ins are gpipe, 1f1b, interleaved, zb-h1 and zbv");
}

// ---- send/recv -------------------------------------------------------------------

bool has_p2p(const Schedule& s) {
  for (const auto& r : s.ranks)
    for (const auto& a : r)
      if (!is_compute(a.op)) return true;
  return false;
}

Schedule with_p2p(const Schedule& s) {
  MPT_CHECK(!has_p2p(s), "with_p2p: the schedule already holds send/recv actions",
            "insert p2p actions only into a compute-only (p2p auto) schedule");
  const std::string bad = placement_error(s.placement, s.pp, s.virtual_stages);
  MPT_CHECK(bad.empty(), str("with_p2p: bad placement: ", bad), "see docs/pipeline-schedules.md, 'Placement'");
  Schedule out = s;
  const int S = s.stages();
  for (int r = 0; r < s.pp && r < static_cast<int>(s.ranks.size()); ++r) {
    std::vector<Action> acts;
    auto push_p2p = [&](Action a, const Action& from) {
      a.batched = !acts.empty() && !is_compute(acts.back().op);  // joins the run before it
      a.line = from.line;
      a.column = from.column;
      acts.push_back(a);
    };
    for (const Action& a : s.ranks[r]) {
      if (a.op == Op::Weight) {  // weight gradients stay on the rank
        acts.push_back(a);
        acts.back().batched = false;
        continue;
      }
      const int st = s.stage(r, a.chunk);
      const bool fwd = a.op == Op::Forward;
      // The neighbour stage this compute reads from, and the one it writes to.
      const int in_stage = fwd ? st - 1 : st + 1, out_stage = fwd ? st + 1 : st - 1;
      if (in_stage >= 0 && in_stage < S && s.rank_of_stage(in_stage) != r)
        push_p2p(p2p(fwd ? Op::RecvAct : Op::RecvGrad, a.mb, a.chunk, s.rank_of_stage(in_stage)), a);
      acts.push_back(a);
      acts.back().batched = false;
      if (out_stage >= 0 && out_stage < S && s.rank_of_stage(out_stage) != r)
        push_p2p(p2p(fwd ? Op::SendAct : Op::SendGrad, a.mb, a.chunk, s.rank_of_stage(out_stage)), a);
    }
    out.ranks[r] = std::move(acts);
  }
  return out;
}

Schedule compute_only(const Schedule& s) {
  Schedule out = s;
  for (auto& r : out.ranks) {
    std::vector<Action> keep;
    for (const auto& a : r)
      if (is_compute(a.op)) keep.push_back(a);
    r = std::move(keep);
  }
  return out;
}

// ---- text format -----------------------------------------------------------------

namespace {

struct Token {
  std::string text;
  int column;  // 1-based
};

std::vector<Token> tokenize(const std::string& line) {
  std::vector<Token> out;
  size_t i = 0;
  while (i < line.size()) {
    char c = line[i];
    if (c == '#') break;
    if (std::isspace(static_cast<unsigned char>(c))) {
      ++i;
      continue;
    }
    if (c == '[' || c == ']') {
      out.push_back({std::string(1, c), static_cast<int>(i) + 1});
      ++i;
      continue;
    }
    size_t j = i;
    while (j < line.size() && !std::isspace(static_cast<unsigned char>(line[j])) && line[j] != '[' &&
           line[j] != ']' && line[j] != '#')
      ++j;
    out.push_back({line.substr(i, j - i), static_cast<int>(i) + 1});
    i = j;
  }
  return out;
}

class Parser {
 public:
  explicit Parser(std::string source) : source_(std::move(source)) {}

  [[noreturn]] void fail(int line, int column, const std::string& what) const {
    MPT_THROW(str(source_, ":", line, ":", column, ": ", what),
              "see docs/pipeline-schedules.md for the schedule format");
  }

  // A non-negative decimal integer at t[pos...]; advances pos.
  int number(const Token& t, size_t& pos, int line, const char* what) const {
    size_t start = pos;
    long long v = 0;
    while (pos < t.text.size() && std::isdigit(static_cast<unsigned char>(t.text[pos]))) {
      v = v * 10 + (t.text[pos] - '0');
      if (v > 1000000000) fail(line, t.column + static_cast<int>(start), str(what, " is too large"));
      ++pos;
    }
    if (pos == start)
      fail(line, t.column + static_cast<int>(start), str("expected ", what, " in '", t.text, "'"));
    return static_cast<int>(v);
  }

  int whole_number(const Token& t, int line, const char* what) const {
    size_t pos = 0;
    int v = number(t, pos, line, what);
    if (pos != t.text.size()) fail(line, t.column + static_cast<int>(pos), str("expected ", what, ", got '", t.text, "'"));
    return v;
  }

  Action action(const Token& t, int line) const {
    static const std::pair<const char*, Op> prefixes[] = {{"SA", Op::SendAct}, {"RA", Op::RecvAct},
                                                          {"SG", Op::SendGrad}, {"RG", Op::RecvGrad},
                                                          {"F", Op::Forward},   {"B", Op::Backward},
                                                          {"W", Op::Weight}};
    Action a;
    a.line = line;
    a.column = t.column;
    size_t pos = 0;
    bool found = false;
    for (const auto& [p, op] : prefixes) {
      std::string ps(p);
      if (t.text.compare(0, ps.size(), ps) == 0) {
        a.op = op;
        pos = ps.size();
        found = true;
        break;
      }
    }
    if (!found)
      fail(line, t.column,
           str("unknown action '", t.text,
               "' (expected F<mb>.<chunk>, B…, W…, SA…>peer, RA…<peer, SG…>peer, RG…<peer)"));
    a.mb = number(t, pos, line, "a micro-batch number");
    if (pos < t.text.size() && t.text[pos] == '.') {
      ++pos;
      a.chunk = number(t, pos, line, "a chunk number");
    }
    if (is_send(a.op) || is_recv(a.op)) {
      const char want = is_send(a.op) ? '>' : '<';
      if (pos >= t.text.size() || t.text[pos] != want)
        fail(line, t.column + static_cast<int>(pos),
             str("'", t.text, "' needs its peer rank: write ", op_prefix(a.op), a.mb, ".", a.chunk, want, "<rank>"));
      ++pos;
      a.peer = number(t, pos, line, "a peer rank");
    }
    if (pos != t.text.size())
      fail(line, t.column + static_cast<int>(pos), str("unexpected '", t.text.substr(pos), "' in action '", t.text, "'"));
    return a;
  }

  Schedule parse(const std::string& text) {
    Schedule s;
    s.pp = -1;
    s.micro_batches = -1;
    int line_no = 0, last_line = 0;
    int size_line = 0, size_col = 1;  // the last pp / virtual-stages / micro-batches line
    std::string p2p_mode;  // "", "auto", "explicit", "timed"
    int p2p_line = 0, first_p2p_line = 0, first_p2p_col = 0;
    std::string placement_mode;         // "", "round-robin", "v", "explicit"
    std::vector<Token> placement_toks;  // the explicit list
    int placement_line = 0, placement_col = 0;
    std::vector<std::vector<Action>> ranks;
    std::vector<int> rank_lines;  // first line of each rank's actions (0 = none)
    std::istringstream in(text);
    std::string line;
    while (std::getline(in, line)) {
      ++line_no;
      if (!line.empty() && line.back() == '\r') line.pop_back();
      std::vector<Token> toks = tokenize(line);
      if (toks.empty()) continue;
      last_line = line_no;
      std::string key = toks[0].text;
      if (key.size() > 1 && key.back() == ':') key.pop_back();
      size_t first = 1;
      if (toks.size() > 1 && toks[1].text == ":") first = 2;
      auto value = [&](const char* what) -> const Token& {
        if (toks.size() != first + 1)
          fail(line_no, toks[0].column, str("'", key, "' takes exactly one value (", what, ")"));
        return toks[first];
      };
      if (key == "schedule") {
        s.name = value("a name").text;
      } else if (key == "pp") {
        s.pp = whole_number(value("the pipeline-parallel size"), line_no, "the pipeline-parallel size");
        if (s.pp < 1) fail(line_no, toks[first].column, "pp must be >= 1");
        if (s.pp > kMaxPipelineRanks) fail(line_no, toks[first].column, str("pp ", s.pp, " exceeds ", kMaxPipelineRanks));
        size_line = line_no, size_col = toks[first].column;
      } else if (key == "virtual-stages") {
        s.virtual_stages = whole_number(value("chunks per rank"), line_no, "the virtual stages per rank");
        if (s.virtual_stages < 1) fail(line_no, toks[first].column, "virtual-stages must be >= 1");
        size_line = line_no, size_col = toks[first].column;
      } else if (key == "micro-batches") {
        s.micro_batches = whole_number(value("the micro-batch count"), line_no, "the micro-batch count");
        if (s.micro_batches < 1) fail(line_no, toks[first].column, "micro-batches must be >= 1");
        size_line = line_no, size_col = toks[first].column;
      } else if (key == "max-in-flight") {
        s.max_in_flight = whole_number(value("a count"), line_no, "the most forwards in flight per rank");
        if (s.max_in_flight < 1) fail(line_no, toks[first].column, "max-in-flight must be >= 1");
      } else if (key == "placement") {
        // placement round-robin | placement v | placement 0 1 2 3 3 2 1 0
        if (toks.size() <= first)
          fail(line_no, toks[0].column, "'placement' needs a value: round-robin, v, or one rank per stage");
        placement_line = line_no;
        placement_col = toks[first].column;
        const std::string& v = toks[first].text;
        if (v == "round-robin" || v == "v") {
          if (toks.size() != first + 1)
            fail(line_no, toks[first + 1].column, str("'placement ", v, "' takes no further value"));
          placement_mode = v;
        } else {
          placement_mode = "explicit";
          placement_toks.assign(toks.begin() + static_cast<long>(first), toks.end());
          for (const Token& t : placement_toks)
            if (t.text.empty() || !std::isdigit(static_cast<unsigned char>(t.text[0])))
              fail(line_no, t.column,
                   str("placement must be 'round-robin', 'v' or a list of ranks (one per stage), got '", t.text, "'"));
        }
      } else if (key == "p2p") {
        const Token& v = value("auto, explicit or timed");
        if (v.text != "auto" && v.text != "explicit" && v.text != "timed")
          fail(line_no, v.column, str("p2p must be 'auto', 'explicit' or 'timed', got '", v.text, "'"));
        p2p_mode = v.text;
        p2p_line = line_no;
      } else if (key == "rank") {
        // rank R: actions...   (the colon may stand apart or be glued to R)
        if (toks.size() < 2) fail(line_no, toks[0].column, "expected 'rank <r>:'");
        Token rt = toks[1];
        size_t next = 2;
        bool colon = false;
        if (!rt.text.empty() && rt.text.back() == ':') {
          rt.text.pop_back();
          colon = true;
        } else if (toks.size() > 2 && toks[2].text == ":") {
          colon = true;
          next = 3;
        }
        if (!colon) fail(line_no, rt.column + static_cast<int>(rt.text.size()), "expected ':' after the rank number");
        int r = whole_number(rt, line_no, "a rank number");
        if (r >= kMaxPipelineRanks) fail(line_no, rt.column, str("rank ", r, " exceeds the largest pp, ", kMaxPipelineRanks));
        if (r >= static_cast<int>(ranks.size())) {
          ranks.resize(static_cast<size_t>(r) + 1);
          rank_lines.resize(static_cast<size_t>(r) + 1, 0);
        }
        if (rank_lines[r] == 0) rank_lines[r] = line_no;
        int open_col = 0;  // column of an open '[' (0: none)
        int in_batch = 0;  // actions in the open batch
        for (size_t i = next; i < toks.size(); ++i) {
          const Token& t = toks[i];
          if (t.text == "[") {
            if (open_col) fail(line_no, t.column, "nested '[': batches do not nest");
            open_col = t.column;
            in_batch = 0;
            continue;
          }
          if (t.text == "]") {
            if (!open_col) fail(line_no, t.column, "']' without '['");
            if (in_batch == 0) fail(line_no, open_col, "empty batch '[]'");
            open_col = 0;
            continue;
          }
          Action a = action(t, line_no);
          if (!is_compute(a.op) && first_p2p_line == 0) {
            first_p2p_line = line_no;
            first_p2p_col = t.column;
          }
          if (open_col) {
            if (is_compute(a.op))
              fail(line_no, t.column, str("'", t.text, "' inside a batch: only sends and receives can be batched"));
            a.batched = in_batch > 0;
            ++in_batch;
          }
          ranks[r].push_back(a);
        }
        if (open_col) fail(line_no, open_col, "'[' is not closed on this line (a batch must fit on one line)");
      } else {
        fail(line_no, toks[0].column,
             str("unknown line '", key,
                 "' (expected schedule, pp, virtual-stages, micro-batches, placement, max-in-flight, p2p or rank)"));
      }
    }
    if (s.pp < 0) fail(last_line + 1, 1, "missing 'pp <size>' line");
    if (s.micro_batches < 0) fail(last_line + 1, 1, "missing 'micro-batches <count>' line");
    try {
      check_schedule_size("the schedule", s.pp, s.micro_batches, s.virtual_stages);
    } catch (const Error& e) {  // at the last of the lines that set the sizes
      fail(size_line, size_col, e.message());
    }
    if (static_cast<int>(ranks.size()) > s.pp) {
      for (size_t r = s.pp; r < ranks.size(); ++r)
        if (rank_lines[r]) fail(rank_lines[r], 1, str("rank ", r, " is outside pp ", s.pp));
    }
    ranks.resize(static_cast<size_t>(s.pp));
    rank_lines.resize(static_cast<size_t>(s.pp), 0);
    for (int r = 0; r < s.pp; ++r)
      if (rank_lines[r] == 0) fail(last_line + 1, 1, str("no 'rank ", r, ":' line (pp is ", s.pp, ")"));
    s.ranks = std::move(ranks);
    placement(s, placement_mode, placement_toks, placement_line, placement_col);
    weight_split(s);
    if ((p2p_mode == "auto" || p2p_mode == "timed") && first_p2p_line)
      fail(first_p2p_line, first_p2p_col,
           str("send/recv action in a 'p2p ", p2p_mode, "' schedule (line ", p2p_line,
               "): write 'p2p explicit' to give every send/recv yourself"));
    s.source = source_;
    if (p2p_mode == "timed") return with_timed_p2p(s);
    const bool automatic = p2p_mode == "auto" || (p2p_mode.empty() && first_p2p_line == 0);
    if (automatic) return with_p2p(s);
    return s;
  }

  // The placement header, checked against pp and virtual-stages (which may come after it).
  void placement(Schedule& s, const std::string& mode, const std::vector<Token>& toks, int line, int col) const {
    if (mode.empty() || mode == "round-robin") return;
    if (mode == "v") {
      if (s.virtual_stages != 2)
        fail(line, col,
             str("placement v needs virtual-stages 2 (rank r holds stages r and 2pp-1-r), but virtual-stages is ",
                 s.virtual_stages));
      s.placement = v_placement(s.pp);
      return;
    }
    const int want = s.pp * s.virtual_stages;
    if (static_cast<int>(toks.size()) != want) {
      const Token& at = static_cast<int>(toks.size()) > want ? toks[static_cast<size_t>(want)] : toks.back();
      fail(line, at.column,
           str("placement lists ", toks.size(), " stages, but pp ", s.pp, " x virtual-stages ", s.virtual_stages,
               " is ", want, " (give one rank per stage)"));
    }
    std::vector<int> map;
    for (const Token& t : toks) {
      const int r = whole_number(t, line, "a rank number");
      if (r >= s.pp) fail(line, t.column, str("rank ", r, " is outside pp ", s.pp));
      map.push_back(r);
    }
    std::vector<int> count(static_cast<size_t>(s.pp), 0);
    for (int r : map) ++count[r];
    for (int r = 0; r < s.pp; ++r)
      if (count[r] != s.virtual_stages)
        fail(line, col,
             str("placement puts ", count[r], " stages on rank ", r, "; with virtual-stages ", s.virtual_stages,
                 " every rank holds exactly ", s.virtual_stages));
    s.placement = std::move(map);
  }

  // A schedule has W for every (micro-batch, chunk) of every rank, or none: the
  // first action that breaks this is named.
  void weight_split(const Schedule& s) const {
    const Action* first_w = nullptr;
    for (const auto& acts : s.ranks)
      for (const auto& a : acts)
        if (a.op == Op::Weight && !first_w) first_w = &a;
    if (!first_w) return;
    for (int r = 0; r < s.pp; ++r) {
      const auto& acts = s.ranks[r];
      for (const Action& b : acts) {
        if (b.op != Op::Backward) continue;
        bool found = false;
        for (const Action& w : acts) found = found || (w.op == Op::Weight && w.mb == b.mb && w.chunk == b.chunk);
        if (!found)
          fail(b.line, b.column,
               str("B", b.mb, ".", b.chunk, " on rank ", r, " has no W", b.mb, ".", b.chunk, ": this schedule splits the backward (W",
                   first_w->mb, ".", first_w->chunk, " at line ", first_w->line, ":", first_w->column,
                   "), so every B needs its W on the same rank (or write no W at all)"));
      }
    }
  }

 private:
  std::string source_;
};

}  // namespace

Schedule parse_schedule(const std::string& text, const std::string& source) {
  Schedule s = Parser(source).parse(text);
  s.source = source;
  return s;
}

Schedule read_schedule_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  MPT_CHECK(static_cast<bool>(f), str("cannot open pipeline schedule '", path, "'"),
            "check the --pipeline-schedule / --schedule-file path");
  std::ostringstream os;
  os << f.rdbuf();
  Schedule s = parse_schedule(os.str(), path);
  if (s.name.empty()) s.name = path;
  s.source = path;
  return s;
}

std::string write_schedule(const Schedule& s) {
  std::ostringstream os;
  os << "# mpitron pipeline schedule (format: docs/pipeline-schedules.md)\n";
  bool simple_name = !s.name.empty();
  for (char c : s.name)
    if (std::isspace(static_cast<unsigned char>(c)) || c == '#') simple_name = false;
  if (simple_name) os << "schedule " << s.name << "\n";
  os << "pp " << s.pp << "\n";
  os << "virtual-stages " << s.virtual_stages << "\n";
  os << "micro-batches " << s.micro_batches << "\n";
  const std::string kind = s.placement_kind();
  if (kind == "v") os << "placement v\n";
  if (kind == "explicit") {
    os << "placement";
    for (int r : s.stage_ranks()) os << " " << r;
    os << "\n";
  }
  if (s.max_in_flight > 0) os << "max-in-flight " << s.max_in_flight << "\n";
  os << "p2p " << (has_p2p(s) ? "explicit" : "auto") << "\n";
  constexpr size_t kWidth = 100;  // wrap long ranks onto more 'rank r:' lines
  for (size_t r = 0; r < s.ranks.size(); ++r) {
    const auto& acts = s.ranks[r];
    const std::string head = str("rank ", r, ":");
    std::string cur = head;
    size_t i = 0;
    bool wrote = false;
    while (i < acts.size()) {
      // One unit: a single action, or a whole batch.
      size_t j = i + 1;
      while (j < acts.size() && acts[j].batched) ++j;
      std::string unit;
      if (j - i > 1) unit += "[";
      for (size_t k = i; k < j; ++k) unit += (k > i ? " " : "") + to_string(acts[k]);
      if (j - i > 1) unit += "]";
      if (cur.size() > head.size() && cur.size() + 1 + unit.size() > kWidth) {
        os << cur << "\n";
        wrote = true;
        cur = head;
      }
      cur += " " + unit;
      i = j;
    }
    if (cur.size() > head.size() || !wrote) os << cur << "\n";
  }
  return os.str();
}

void write_schedule_file(const Schedule& s, const std::string& path) {
  std::ofstream f(path, std::ios::binary);
  MPT_CHECK(static_cast<bool>(f), str("cannot write pipeline schedule '", path, "'"), "check the directory exists");
  f << write_schedule(s);
  MPT_CHECK(static_cast<bool>(f), str("writing pipeline schedule '", path, "' failed"), "");
}

}  // namespace mpitron::parallel
