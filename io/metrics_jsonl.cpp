// io/metrics_jsonl.cpp — MetricsJsonl.
#include "io/metrics_jsonl.h"

#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "core/error.h"

namespace mpitron::io {

MetricsJsonl::MetricsJsonl(const std::string& path, bool truncate) : path_(path) {
  const std::filesystem::path parent = std::filesystem::path(path).parent_path();
  std::error_code ec;
  if (!parent.empty()) std::filesystem::create_directories(parent, ec);
  f_ = std::fopen(path.c_str(), truncate ? "w" : "a");
  MPT_CHECK(f_, str("open metrics file '", path, "': ", std::strerror(errno)), "check that the directory is writable");
}

MetricsJsonl::~MetricsJsonl() {
  if (f_) std::fclose(f_);
}

void MetricsJsonl::log(int64_t iteration, const std::vector<std::pair<std::string, double>>& values) {
  nlohmann::ordered_json j;
  j["iteration"] = iteration;
  for (const auto& [k, v] : values) j[k] = std::isfinite(v) ? nlohmann::ordered_json(v) : nlohmann::ordered_json();
  write_line(j.dump());
}

void MetricsJsonl::log_json(int64_t iteration, const nlohmann::json& fields) {
  MPT_CHECK(fields.is_object(), str("metrics for '", path_, "' must be a JSON object, got ", fields.type_name()), "");
  nlohmann::ordered_json j;
  j["iteration"] = iteration;
  for (auto it = fields.begin(); it != fields.end(); ++it) j[it.key()] = it.value();
  write_line(j.dump());
}

void MetricsJsonl::write_line(const std::string& line) {
  const bool ok = std::fputs(line.c_str(), f_) >= 0 && std::fputc('\n', f_) != EOF && std::fflush(f_) == 0;
  MPT_CHECK(ok, str("write metrics file '", path_, "': ", std::strerror(errno)), "the disk may be full");
}

}  // namespace mpitron::io
