#include "tensor/path_stats.h"

#include <mutex>

namespace mpitron {

namespace {
std::mutex g_mu;
std::map<std::string, int64_t, std::less<>>& counters() {
  static auto* m = new std::map<std::string, int64_t, std::less<>>();  // never destroyed: counted at exit too
  return *m;
}
}  // namespace

void path_count_add(std::string_view op, std::string_view path) {
  std::string name;
  name.reserve(op.size() + 1 + path.size());
  name.append(op).append(".").append(path);
  std::lock_guard<std::mutex> lock(g_mu);
  auto& m = counters();
  auto it = m.find(name);
  if (it == m.end()) it = m.emplace(std::move(name), 0).first;
  ++it->second;
}

int64_t path_count(const std::string& name) {
  std::lock_guard<std::mutex> lock(g_mu);
  auto it = counters().find(name);
  return it == counters().end() ? 0 : it->second;
}

std::map<std::string, int64_t> path_counts() {
  std::lock_guard<std::mutex> lock(g_mu);
  return {counters().begin(), counters().end()};
}

void path_counts_reset() {
  std::lock_guard<std::mutex> lock(g_mu);
  counters().clear();
}

int64_t PathProbe::delta(const std::string& name) const {
  auto it = start_.find(name);
  return path_count(name) - (it == start_.end() ? 0 : it->second);
}

std::string PathProbe::taken() const {
  std::string s;
  for (const auto& [name, v] : path_counts()) {
    auto it = start_.find(name);
    const int64_t d = v - (it == start_.end() ? 0 : it->second);
    if (d == 0) continue;
    if (!s.empty()) s += ", ";
    s += name + "+" + std::to_string(d);
  }
  return s.empty() ? "(none)" : s;
}

}  // namespace mpitron
