// parallel/schedule_sim.cpp — timeline prediction and drawing.
#include "parallel/schedule_sim.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <fstream>
#include <iomanip>
#include <sstream>

#include "core/error.h"
#include "core/number.h"
#include "parallel/schedule_check.h"
#include "parallel/schedule_replay.h"

namespace mpitron::parallel {

double Costs::cost(Op op, int stage, bool split) const {
  auto pick = [&](const std::vector<double>& v, double dflt) {
    return stage >= 0 && stage < static_cast<int>(v.size()) && v[stage] >= 0 ? v[stage] : dflt;
  };
  if (op == Op::Forward) return pick(stage_forward, forward);
  const double b = pick(stage_backward, backward), w = pick(stage_weight, weight);
  if (w < 0) return split ? b / 2 : b;  // b is the whole backward
  if (op == Op::Weight) return w;
  return split ? b : b + w;
}

Timeline simulate_schedule(const Schedule& s, const Costs& costs) {
  MPT_CHECK(costs.forward > 0 && costs.backward > 0 && costs.p2p >= 0,
            str("bad costs: forward ", costs.forward, ", backward ", costs.backward, ", p2p ", costs.p2p),
            "forward and backward costs must be > 0, p2p cost >= 0");
  CheckResult check = check_schedule(s);
  if (!check.ok) validate_schedule(s);  // throws with the checker's message
  const bool split = has_weight_actions(s);
  detail::ReplayCosts rc;
  rc.p2p = costs.p2p;
  for (int st = 0; st < s.stages(); ++st) {
    rc.stage_forward.push_back(costs.cost(Op::Forward, st, split));
    rc.stage_backward.push_back(costs.cost(Op::Backward, st, split));
    rc.stage_weight.push_back(costs.cost(Op::Weight, st, split));
    MPT_CHECK(rc.stage_forward.back() > 0 && rc.stage_backward.back() > 0 && (!split || rc.stage_weight.back() > 0),
              str("bad costs for stage ", st, ": F ", rc.stage_forward.back(), ", B ", rc.stage_backward.back(),
                  split ? str(", W ", rc.stage_weight.back()) : std::string()),
              "every F, B and W cost must be > 0");
  }
  detail::ReplayResult rr = detail::replay(s, rc);
  MPT_CHECK(rr.ok, str("schedule replay failed after the check passed: ", rr.why), "this is a bug in the checker");
  Timeline t;
  t.ranks.resize(s.pp);
  t.busy.assign(s.pp, 0.0);
  t.finish = rr.finish;
  t.peak_in_flight = check.peak_in_flight;
  for (int r = 0; r < s.pp; ++r) {
    for (const auto& sp : rr.spans[r]) {
      t.ranks[r].push_back(TimelineEntry{sp.first, sp.count, sp.compute, sp.start, sp.end});
      if (sp.compute) t.busy[r] += sp.end - sp.start;
    }
    t.total = std::max(t.total, t.finish[r]);
    t.ideal = std::max(t.ideal, t.busy[r]);
  }
  t.bubble_fraction = t.total > 0 ? (t.total - t.ideal) / t.total : 0.0;
  return t;
}

double formula_bubble_fraction(int pp, int m, int v) {
  return static_cast<double>(pp - 1) / (static_cast<double>(v) * m + pp - 1);
}

double analytic_bubble_fraction(const std::string& name, int pp, int m, int v) {
  const double p1 = pp - 1;
  if (name == "gpipe" || name == "1f1b") return p1 / (m + p1);
  if (name == "interleaved") return p1 / (static_cast<double>(v) * m + p1);
  if (name == "zb-h1") return p1 / (3.0 * m + p1);
  if (name == "zbv") return p1 / (6.0 * m + p1);
  return -1;
}

std::string analytic_bubble_formula(const std::string& name) {
  if (name == "gpipe" || name == "1f1b") return "(p-1)/(m+p-1)";
  if (name == "interleaved") return "(p-1)/(v*m+p-1)";
  if (name == "zb-h1") return "(p-1)/(3m+p-1)";
  if (name == "zbv") return "(p-1)/(6m+p-1)";
  return "";
}

// ---- costs files -------------------------------------------------------------------

Costs parse_costs(const std::string& text, const std::string& source) {
  Costs c;
  bool any_stage = false, any_weight = false, any_plain = false;
  std::istringstream in(text);
  std::string line;
  int line_no = 0;
  auto fail = [&](int col, const std::string& what) {
    MPT_THROW(str(source, ":", line_no, ":", col, ": ", what),
              "costs files read 'stage S F <ms> B <ms> [W <ms>]' and 'p2p <ms>' lines "
              "(docs/pipeline-schedules.md, 'Measured costs')");
  };
  while (std::getline(in, line)) {
    ++line_no;
    const size_t hash = line.find('#');
    if (hash != std::string::npos) line.resize(hash);
    std::vector<std::pair<std::string, int>> toks;  // (text, column)
    for (size_t i = 0; i < line.size();) {
      if (std::isspace(static_cast<unsigned char>(line[i]))) {
        ++i;
        continue;
      }
      size_t j = i;
      while (j < line.size() && !std::isspace(static_cast<unsigned char>(line[j]))) ++j;
      toks.push_back({line.substr(i, j - i), static_cast<int>(i) + 1});
      i = j;
    }
    if (toks.empty()) continue;
    auto number = [&](size_t k) {
      if (k >= toks.size()) fail(static_cast<int>(line.size()) + 1, "expected a number");
      const std::string& t = toks[k].first;
      double v = 0;
      if (!parse_decimal(t, &v) || v < 0)
        fail(toks[k].second, str("expected a time >= 0 in milliseconds, got '", t, "'"));
      return v;
    };
    if (toks[0].first == "p2p") {
      if (toks.size() != 2) fail(toks[0].second, "'p2p' takes one time");
      c.p2p = number(1);
      continue;
    }
    if (toks[0].first != "stage") fail(toks[0].second, str("unknown line '", toks[0].first, "' (expected stage or p2p)"));
    if (toks.size() < 2) fail(toks[0].second, "expected 'stage <index> F <ms> B <ms> [W <ms>]'");
    const double sd = number(1);
    if (sd != std::floor(sd) || sd > 100000) fail(toks[1].second, "the stage index must be a whole number");
    const size_t st = static_cast<size_t>(sd);
    auto grow = [&](std::vector<double>& v) {
      if (v.size() <= st) v.resize(st + 1, -1);
    };
    grow(c.stage_forward);
    grow(c.stage_backward);
    grow(c.stage_weight);
    bool f = false, b = false, w = false;
    for (size_t k = 2; k < toks.size(); k += 2) {
      const std::string& what = toks[k].first;
      if (what == "F") c.stage_forward[st] = number(k + 1), f = true;
      else if (what == "B") c.stage_backward[st] = number(k + 1), b = true;
      else if (what == "W") c.stage_weight[st] = number(k + 1), w = true;
      else fail(toks[k].second, str("unknown cost '", what, "' (expected F, B or W)"));
    }
    if (!f || !b) fail(toks[0].second, str("stage ", st, " needs both an F and a B time"));
    any_stage = true;
    (w ? any_weight : any_plain) = true;
  }
  if (!any_stage) MPT_THROW(str(source, ": no 'stage' line"), "write one 'stage S F <ms> B <ms> [W <ms>]' line per stage");
  if (any_weight && any_plain)
    MPT_THROW(str(source, ": some stages give W and some do not"),
              "measure every stage with the same schedule kind (split backward or not)");
  for (size_t st = 0; st < c.stage_forward.size(); ++st)
    if (c.stage_forward[st] < 0) MPT_THROW(str(source, ": stage ", st, " is missing"), "give one line per stage 0..S-1");
  // Scalars: the mean over stages, for anything the per-stage lists do not cover.
  double f = 0, b = 0, w = 0;
  const double n = static_cast<double>(c.stage_forward.size());
  for (size_t st = 0; st < c.stage_forward.size(); ++st) {
    f += c.stage_forward[st];
    b += c.stage_backward[st];
    w += c.stage_weight[st];
  }
  c.forward = f / n;
  c.backward = b / n;
  c.weight = any_weight ? w / n : -1;
  if (!any_weight) c.stage_weight.clear();
  return c;
}

Costs read_costs_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  MPT_CHECK(static_cast<bool>(f), str("cannot open pipeline costs file '", path, "'"),
            "write one with pretrain_gpt --profile-pipeline FILE, or by hand (docs/pipeline-schedules.md)");
  std::ostringstream os;
  os << f.rdbuf();
  return parse_costs(os.str(), path);
}

std::string write_costs(const Costs& c) {
  std::ostringstream os;
  os << std::setprecision(6);
  os << "# mpitron pipeline costs in milliseconds (schedule_sim --costs FILE; docs/pipeline-schedules.md)\n";
  for (size_t st = 0; st < c.stage_forward.size(); ++st) {
    os << "stage " << st << " F " << c.stage_forward[st] << " B "
       << (st < c.stage_backward.size() ? c.stage_backward[st] : c.backward);
    if (st < c.stage_weight.size() && c.stage_weight[st] >= 0) os << " W " << c.stage_weight[st];
    os << "\n";
  }
  os << "p2p " << c.p2p << "\n";
  return os.str();
}

void write_costs_file(const Costs& c, const std::string& path) {
  std::ofstream f(path, std::ios::binary);
  MPT_CHECK(static_cast<bool>(f), str("cannot write pipeline costs file '", path, "'"), "check the directory exists");
  f << write_costs(c);
  MPT_CHECK(static_cast<bool>(f), str("writing pipeline costs file '", path, "' failed"), "");
}

Costs fit_costs_to_stages(const Costs& c, int stages) {
  const int from = static_cast<int>(c.stage_forward.size());
  if (from == 0 || from == stages) return c;
  Costs out = c;
  out.stage_forward.assign(static_cast<size_t>(stages), 0);
  out.stage_backward.assign(static_cast<size_t>(stages), 0);
  if (!c.stage_weight.empty()) out.stage_weight.assign(static_cast<size_t>(stages), 0);
  auto get = [](const std::vector<double>& v, int i) { return i < static_cast<int>(v.size()) ? v[i] : 0.0; };
  if (stages % from == 0) {
    const int k = stages / from;
    for (int st = 0; st < stages; ++st) {
      out.stage_forward[st] = get(c.stage_forward, st / k) / k;
      out.stage_backward[st] = get(c.stage_backward, st / k) / k;
      if (!c.stage_weight.empty()) out.stage_weight[st] = get(c.stage_weight, st / k) / k;
    }
  } else if (from % stages == 0) {
    const int k = from / stages;
    for (int st = 0; st < from; ++st) {
      out.stage_forward[st / k] += get(c.stage_forward, st);
      out.stage_backward[st / k] += get(c.stage_backward, st);
      if (!c.stage_weight.empty()) out.stage_weight[st / k] += get(c.stage_weight, st);
    }
  } else {
    MPT_THROW(str("the costs were measured for ", from, " stages; the schedule has ", stages),
              "measure with a layout whose stage count divides (or is divided by) the schedule's");
  }
  out.forward = c.forward * from / stages;
  out.backward = c.backward * from / stages;
  if (c.weight >= 0) out.weight = c.weight * from / stages;
  return out;
}

namespace {

char op_letter(Op op) { return op == Op::Forward ? 'F' : op == Op::Backward ? 'B' : 'W'; }

// "F3" when the schedule has one chunk per rank, "F3.1" otherwise.
std::string box_label(const Schedule& s, const Action& a) {
  std::string l = str(std::string(1, op_letter(a.op)), a.mb);
  if (s.virtual_stages > 1) l += str(".", a.chunk);
  return l;
}

std::string fmt(double x) {
  std::ostringstream os;
  os << std::setprecision(6) << x;
  return os.str();
}

std::string xml_escape(const std::string& in) {
  std::string out;
  for (char c : in) {
    switch (c) {
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '&': out += "&amp;"; break;
      case '"': out += "&quot;"; break;
      case '\'': out += "&apos;"; break;
      default: out += c;
    }
  }
  return out;
}

}  // namespace

std::string timeline_text(const Schedule& s, const Timeline& t, size_t max_width) {
  double unit = 0;  // time of one cell group: the shortest compute
  size_t label = 1;
  for (int r = 0; r < s.pp; ++r)
    for (const auto& e : t.ranks[r]) {
      if (!e.compute) continue;
      const double d = e.end - e.start;
      if (d > 0 && (unit == 0 || d < unit)) unit = d;
      label = std::max(label, box_label(s, s.ranks[r][e.first]).size());
    }
  if (unit <= 0) unit = 1;
  const std::string head_fmt = str("rank ", s.pp - 1, " |");
  const size_t head = head_fmt.size();
  size_t cell = label + 1;  // characters per unit: room for a label and a gap
  auto width_for = [&](size_t c) { return static_cast<size_t>(std::llround(t.total / unit * c)); };
  if (head + width_for(cell) > max_width) cell = 1;  // too wide: one character per unit, F/B only
  const size_t width = width_for(cell);
  std::ostringstream os;
  for (int r = 0; r < s.pp; ++r) {
    std::string row(width, '.');
    for (const auto& e : t.ranks[r]) {
      if (!e.compute) continue;
      const size_t x0 = static_cast<size_t>(std::llround(e.start / unit * cell));
      size_t x1 = static_cast<size_t>(std::llround(e.end / unit * cell));
      x1 = std::min(std::max(x1, x0 + 1), width);
      const Action& a = s.ranks[r][e.first];
      std::string l = cell == 1 ? std::string(1, op_letter(a.op)) : box_label(s, a);
      const size_t len = x1 - x0;  // keep a blank after the label so neighbours stay apart
      const size_t show = cell == 1 ? 1 : std::min(l.size(), len > 1 ? len - 1 : size_t{1});
      for (size_t k = 0; k < len; ++k) row[x0 + k] = k < show ? l[k] : (cell == 1 ? l[0] : ' ');
    }
    std::string name = str("rank ", r);
    name.resize(head - 2, ' ');
    std::string line = name + " |" + row + "|";
    if (line.size() > max_width) line = line.substr(0, max_width - 3) + "...";
    os << line << "\n";
  }
  os << std::string(head - 2, ' ') << "  one time unit = " << (cell == 1 ? "1 character" : str(cell, " characters"));
  if (unit != 1) os << " (a time unit here is " << fmt(unit) << ")";
  os << "; F forward, B backward" << (has_weight_actions(s) ? " (input gradient), W weight gradient" : "")
     << ", '.' idle or waiting on p2p\n";
  return os.str();
}

std::string timeline_list(const Schedule& s, const Timeline& t) {
  std::ostringstream os;
  for (int r = 0; r < s.pp; ++r) {
    os << "rank " << r << ":";
    for (const auto& e : t.ranks[r]) {
      std::string what;
      for (int i = e.first; i < e.first + e.count; ++i) what += (i > e.first ? "+" : "") + to_string(s.ranks[r][i]);
      if (!e.compute && e.end <= e.start) continue;  // instant p2p: nothing to show
      os << " " << what << "[" << fmt(e.start) << "," << fmt(e.end) << ")";
    }
    os << "\n";
  }
  return os.str();
}

std::string timeline_svg(const Schedule& s, const Timeline& t) {
  static const char* kForward[] = {"#4e79a7", "#76b7b2", "#2f5d8a", "#a0cbe8"};
  static const char* kBackward[] = {"#59a14f", "#8cd17d", "#3b7a34", "#b6992d"};
  static const char* kWeight[] = {"#f28e2b", "#ffbe7d", "#c0661a", "#e15759"};
  const double left = 70, top = 48, row_h = 28, gap = 8, right = 20;
  const double total = t.total > 0 ? t.total : 1;
  const double px = std::clamp(1400.0 / total, 2.0, 48.0);  // pixels per time unit
  const double width = left + total * px + right;
  const double height = top + s.pp * (row_h + gap) + 30;
  std::ostringstream os;
  os << "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n";
  os << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << fmt(width) << "\" height=\"" << fmt(height)
     << "\" viewBox=\"0 0 " << fmt(width) << " " << fmt(height) << "\" font-family=\"monospace\" font-size=\"11\">\n";
  os << "<rect x=\"0\" y=\"0\" width=\"" << fmt(width) << "\" height=\"" << fmt(height) << "\" fill=\"white\"/>\n";
  os << "<text x=\"" << fmt(left) << "\" y=\"20\" font-size=\"13\">"
     << xml_escape(str(s.name.empty() ? "schedule" : s.name, ": pp ", s.pp, ", micro-batches ", s.micro_batches,
                       ", virtual stages ", s.virtual_stages, ", total ", fmt(t.total), ", bubble ",
                       fmt(100.0 * t.bubble_fraction), "%"))
     << "</text>\n";
  // Time axis: a tick every `step` units.
  double step = 1;
  for (double base = 1; total / step > 25; base *= 10)
    for (double k : {1.0, 2.0, 5.0})
      if (total / step > 25) step = base * k;
  const double axis_y = top + s.pp * (row_h + gap) + 4;
  for (double x = 0; x <= total + 1e-9; x += step) {
    os << "<line x1=\"" << fmt(left + x * px) << "\" y1=\"" << fmt(top - 4) << "\" x2=\"" << fmt(left + x * px)
       << "\" y2=\"" << fmt(axis_y) << "\" stroke=\"#dddddd\" stroke-width=\"1\"/>\n";
    os << "<text x=\"" << fmt(left + x * px) << "\" y=\"" << fmt(axis_y + 14) << "\" text-anchor=\"middle\">" << fmt(x)
       << "</text>\n";
  }
  for (int r = 0; r < s.pp; ++r) {
    const double y = top + r * (row_h + gap);
    os << "<text x=\"8\" y=\"" << fmt(y + row_h / 2 + 4) << "\">rank " << r << "</text>\n";
    for (const auto& e : t.ranks[r]) {
      const double x = left + e.start * px, w = (e.end - e.start) * px;
      if (!e.compute) {
        if (w <= 0) continue;
        os << "<rect x=\"" << fmt(x) << "\" y=\"" << fmt(y + row_h - 4) << "\" width=\"" << fmt(w)
           << "\" height=\"3\" fill=\"#bbbbbb\"><title>" << xml_escape(str("p2p wait ", fmt(e.start), "-", fmt(e.end)))
           << "</title></rect>\n";
        continue;
      }
      const Action& a = s.ranks[r][e.first];
      const char* fill = (a.op == Op::Forward ? kForward : a.op == Op::Backward ? kBackward : kWeight)[a.chunk % 4];
      const std::string label = box_label(s, a);
      os << "<rect x=\"" << fmt(x) << "\" y=\"" << fmt(y) << "\" width=\"" << fmt(w) << "\" height=\"" << fmt(row_h)
         << "\" fill=\"" << fill << "\" stroke=\"white\" stroke-width=\"1\"><title>"
         << xml_escape(str(to_string(a), " rank ", r, " [", fmt(e.start), ", ", fmt(e.end), ")")) << "</title></rect>\n";
      if (w >= 7.0 * label.size())
        os << "<text x=\"" << fmt(x + w / 2) << "\" y=\"" << fmt(y + row_h / 2 + 4)
           << "\" text-anchor=\"middle\" fill=\"white\">" << xml_escape(label) << "</text>\n";
    }
  }
  os << "</svg>\n";
  return os.str();
}

}  // namespace mpitron::parallel
