// core/log.h — rank-aware logging.
//
// By default only rank 0 (or a process with no rank) prints INFO; every rank
// prints WARN and ERROR, prefixed with its rank. MPITRON_LOG_ALL_RANKS=1 makes
// every rank print INFO; MPITRON_LOG_LEVEL=debug|info|warn|error filters.
#pragma once
#include "core/error.h"

namespace mpitron {

enum class LogLevel { Debug = 0, Info = 1, Warn = 2, Error = 3 };

void log_message(LogLevel level, const std::string& msg);
LogLevel log_level();

template <typename... Args> void log_debug(const Args&... a) { log_message(LogLevel::Debug, str(a...)); }
template <typename... Args> void log_info(const Args&... a) { log_message(LogLevel::Info, str(a...)); }
template <typename... Args> void log_warn(const Args&... a) { log_message(LogLevel::Warn, str(a...)); }
template <typename... Args> void log_error(const Args&... a) { log_message(LogLevel::Error, str(a...)); }

}  // namespace mpitron
