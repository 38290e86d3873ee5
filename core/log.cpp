#include "core/log.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>

namespace mpitron {

static LogLevel parse_level() {
  const char* s = std::getenv("MPITRON_LOG_LEVEL");
  if (!s) return LogLevel::Info;
  if (!std::strcmp(s, "debug")) return LogLevel::Debug;
  if (!std::strcmp(s, "warn")) return LogLevel::Warn;
  if (!std::strcmp(s, "error")) return LogLevel::Error;
  return LogLevel::Info;
}

LogLevel log_level() {
  static const LogLevel level = parse_level();
  return level;
}

void log_message(LogLevel level, const std::string& msg) {
  if (level < log_level()) return;
  const int rank = process_rank();
  static const bool all_ranks = std::getenv("MPITRON_LOG_ALL_RANKS") != nullptr;
  if (level <= LogLevel::Info && rank > 0 && !all_ranks) return;
  static std::mutex mu;
  std::lock_guard<std::mutex> lock(mu);
  FILE* f = level >= LogLevel::Warn ? stderr : stdout;
  const char* tag = level == LogLevel::Warn ? "warning: " : level == LogLevel::Error ? "error: " : "";
  if (rank >= 0 && (rank > 0 || all_ranks || level >= LogLevel::Warn))
    std::fprintf(f, "[rank %d] %s%s\n", rank, tag, msg.c_str());
  else
    std::fprintf(f, "%s%s\n", tag, msg.c_str());
  std::fflush(f);
}

}  // namespace mpitron
