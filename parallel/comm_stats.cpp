#include "parallel/comm_stats.h"

#include <atomic>
#include <cstdint>
#include <chrono>

namespace mpitron {

namespace {
std::atomic<int64_t> g_wait_ns{0};
std::atomic<int> g_active{0};
double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}
}  // namespace

double comm_wait_seconds() { return static_cast<double>(g_wait_ns.load()) * 1e-9; }
bool comm_waiting_now() { return g_active.load() > 0; }

CommWaitScope::CommWaitScope() : start_(now_s()) { ++g_active; }

CommWaitScope::~CommWaitScope() {
  g_wait_ns += static_cast<int64_t>((now_s() - start_) * 1e9);
  --g_active;
}

}  // namespace mpitron
