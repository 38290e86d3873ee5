// parallel/schedule_sim.cpp — timeline prediction and drawing.
#include "parallel/schedule_sim.h"

#include <algorithm>
#include <cmath>
#include <iomanip>
#include <sstream>

#include "core/error.h"
#include "parallel/schedule_check.h"
#include "parallel/schedule_replay.h"

namespace mpitron::parallel {

Timeline simulate_schedule(const Schedule& s, const Costs& costs) {
  MPT_CHECK(costs.forward > 0 && costs.backward > 0 && costs.p2p >= 0,
            str("bad costs: forward ", costs.forward, ", backward ", costs.backward, ", p2p ", costs.p2p),
            "forward and backward costs must be > 0, p2p cost >= 0");
  CheckResult check = check_schedule(s);
  if (!check.ok) validate_schedule(s);  // throws with the checker's message
  detail::ReplayResult rr = detail::replay(s, detail::ReplayCosts{costs.forward, costs.backward, costs.p2p});
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

namespace {

// "F3" when the schedule has one chunk per rank, "F3.1" otherwise.
std::string box_label(const Schedule& s, const Action& a) {
  std::string l = str(a.op == Op::Forward ? "F" : "B", a.mb);
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
      std::string l = cell == 1 ? std::string(1, a.op == Op::Forward ? 'F' : 'B') : box_label(s, a);
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
  os << "; F forward, B backward, '.' idle or waiting on p2p\n";
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
      const char* fill = (a.op == Op::Forward ? kForward : kBackward)[a.chunk % 4];
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
