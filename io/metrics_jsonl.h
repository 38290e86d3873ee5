// io/metrics_jsonl.h — training metrics as JSON Lines, one object per log step.
//
//   {"iteration": 10, "lm loss": 7.21, "learning rate": 0.0003, ...}
// Keys in the order given; each line is flushed when written, so a crash
// loses at most the line being written. Non-finite numbers become null (JSON
// has no NaN). Not collective: open it on the rank that logs.
#pragma once
#include <cstdint>
#include <cstdio>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <utility>
#include <vector>

namespace mpitron::io {

class MetricsJsonl {
 public:
  // Opens `path` for appending (truncate = true starts it afresh); creates parent directories.
  explicit MetricsJsonl(const std::string& path, bool truncate = false);
  ~MetricsJsonl();
  MetricsJsonl(const MetricsJsonl&) = delete;
  MetricsJsonl& operator=(const MetricsJsonl&) = delete;

  void log(int64_t iteration, const std::vector<std::pair<std::string, double>>& values);
  // Any JSON object; "iteration" is added first.
  void log_json(int64_t iteration, const nlohmann::json& fields);
  const std::string& path() const { return path_; }
  // A resumed run: the rows after `iteration` (written by a run that failed before its next
  // checkpoint, and about to be written again) are dropped, and a torn last line with them,
  // so the file goes on without gaps or duplicates. Rows without "iteration" stay.
  void drop_after(int64_t iteration);

 private:
  void write_line(const std::string& line);
  std::string path_;
  std::FILE* f_ = nullptr;
};

}  // namespace mpitron::io
