#include "core/error.h"

#include <atomic>

namespace mpitron {

namespace {
std::atomic<int> g_rank{-1};  // identity of this process, not shared state between objects
}

int process_rank() { return g_rank.load(std::memory_order_relaxed); }
void set_process_rank(int rank) { g_rank.store(rank, std::memory_order_relaxed); }

static std::string format_error(const std::string& what, const std::string& hint, const char* file,
                                int line, int rank) {
  std::ostringstream os;
  if (rank >= 0) os << "[rank " << rank << "] ";
  os << "error: " << what << " (" << file << ":" << line << ")";
  if (!hint.empty()) os << "\n  hint: " << hint;
  return os.str();
}

Error::Error(std::string what, std::string hint, const char* file, int line)
    : std::runtime_error(format_error(what, hint, file, line, process_rank())),
      message_(std::move(what)),
      hint_(std::move(hint)),
      file_(file),
      line_(line),
      rank_(process_rank()) {}

namespace detail {
void check_failed(const char* cond, const char* file, int line, const std::string& what,
                  const std::string& hint) {
  throw Error(what.empty() ? str("check failed: ", cond) : what, hint, file, line);
}
}  // namespace detail

}  // namespace mpitron
