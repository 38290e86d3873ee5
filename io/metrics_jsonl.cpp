// io/metrics_jsonl.cpp — MetricsJsonl.
#include "io/metrics_jsonl.h"

#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
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

void MetricsJsonl::drop_after(int64_t iteration) {
  std::fclose(f_);
  f_ = nullptr;
  std::string kept;
  int64_t dropped = 0;
  {
    std::ifstream in(path_);
    std::string line;
    while (std::getline(in, line)) {
      const nlohmann::json j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
      const bool keep = j.is_object() && (!j.contains("iteration") || !j["iteration"].is_number_integer() ||
                                          j["iteration"].get<int64_t>() <= iteration);
      if (keep) kept += line + "\n";
      else ++dropped;
    }
  }
  if (dropped > 0) {
    const std::string tmp = path_ + ".tmp";
    std::FILE* t = std::fopen(tmp.c_str(), "w");
    MPT_CHECK(t, str("rewrite metrics file '", path_, "': ", std::strerror(errno)), "check that the directory is writable");
    const bool ok = std::fwrite(kept.data(), 1, kept.size(), t) == kept.size() && std::fflush(t) == 0;
    std::fclose(t);
    MPT_CHECK(ok && std::rename(tmp.c_str(), path_.c_str()) == 0,
              str("rewrite metrics file '", path_, "': ", std::strerror(errno)), "the disk may be full");
  }
  f_ = std::fopen(path_.c_str(), "a");
  MPT_CHECK(f_, str("open metrics file '", path_, "': ", std::strerror(errno)), "check that the directory is writable");
}

void MetricsJsonl::write_line(const std::string& line) {
  const bool ok = std::fputs(line.c_str(), f_) >= 0 && std::fputc('\n', f_) != EOF && std::fflush(f_) == 0;
  MPT_CHECK(ok, str("write metrics file '", path_, "': ", std::strerror(errno)), "the disk may be full");
}

}  // namespace mpitron::io
