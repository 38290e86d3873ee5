#include "model/training/straggler.h"

#include <algorithm>
#include <cstdio>
#include <numeric>

#include "core/error.h"
#include "parallel/failure_record.h"

namespace mpitron {

void StragglerDetector::add_step(double wall_s, double waited_s) {
  if (!enabled_) return;
  compute_s_ += std::max(0.0, wall_s - waited_s);
  waited_s_ += waited_s;
  ++steps_;
}

void StragglerDetector::report(LogFields& out) {
  if (!enabled_) return;
  const double n = static_cast<double>(std::max<int64_t>(steps_, 1));
  const double ms = 1e3 * compute_s_ / n;
  if (ms > 0) best_ms_ = best_ms_ > 0 ? std::min(best_ms_, ms) : ms;
  const double own = ms > 0 ? best_ms_ / ms : 1.0;
  // Per rank: compute ms/it, waiting ms/it, own-history score.
  const std::vector<double> all = groups_.world_gather({ms, 1e3 * waited_s_ / n, own});
  compute_s_ = waited_s_ = 0;
  steps_ = 0;
  const size_t ranks = all.size() / 3;
  double fastest = 0;
  for (size_t r = 0; r < ranks; ++r)
    if (all[3 * r] > 0) fastest = fastest > 0 ? std::min(fastest, all[3 * r]) : all[3 * r];
  std::vector<double> score(ranks, 1.0);
  for (size_t r = 0; r < ranks; ++r) score[r] = all[3 * r] > 0 && fastest > 0 ? fastest / all[3 * r] : 1.0;
  std::vector<size_t> order(ranks);
  std::iota(order.begin(), order.end(), size_t{0});
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return score[a] < score[b]; });
  const size_t k = std::min(ranks, static_cast<size_t>(minmax_));
  auto describe = [&](size_t r) {
    char buf[160];
    const std::string host = host_of_rank(static_cast<int>(r));
    std::snprintf(buf, sizeof buf, "rank %zu%s%s %.2f ms (score %.2f, own %.2f)", r, host.empty() ? "" : " on ",
                  host.c_str(), all[3 * r], score[r], all[3 * r + 2]);
    return std::string(buf);
  };
  std::string slow, fast;
  nlohmann::json slowest = nlohmann::json::array();
  for (size_t i = 0; i < k; ++i) {
    const size_t r = order[i], f = order[ranks - 1 - i];
    slow += str(i ? ", " : "", describe(r));
    fast += str(i ? ", " : "", describe(f));
    slowest.push_back({{"rank", r}, {"host", host_of_rank(static_cast<int>(r))}, {"score", score[r]},
                       {"own_score", all[3 * r + 2]}, {"compute_ms", all[3 * r]}, {"wait_ms", all[3 * r + 1]}});
  }
  out.text += str(" straggler: compute per iteration, slowest ", slow, "; fastest ", fast, " |");
  out.scalars.push_back({"straggler", "straggler-min-score", score[order[0]]});
  out.metrics["straggler_min_score"] = score[order[0]];
  out.metrics["straggler_slowest"] = slowest;
  out.metrics["straggler_scores"] = score;
}

}  // namespace mpitron
