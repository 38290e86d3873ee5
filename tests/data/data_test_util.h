// tests/data/data_test_util.h — helpers shared by the data tests: asset paths,
// the reference "line" definition, temp dirs, running the built apps.
#pragma once
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

namespace mpitron::testing {

inline std::string source_path(const std::string& rel) { return std::string(MPITRON_SOURCE_DIR) + "/" + rel; }

inline std::string read_all(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) throw std::runtime_error("cannot open " + path);
  std::ostringstream os;
  os << f.rdbuf();
  return os.str();
}

inline void write_all(const std::string& path, const std::string& bytes) {
  std::ofstream f(path, std::ios::binary);
  f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

// A "line" as tests/reference/tokenize_ref.py defines it: split on '\n', the
// text without its '\n'; no empty line after a final '\n'.
inline std::vector<std::string> split_lines(const std::string& data) {
  std::vector<std::string> lines;
  size_t pos = 0;
  while (pos < data.size()) {
    size_t nl = data.find('\n', pos);
    if (nl == std::string::npos) nl = data.size();
    lines.emplace_back(data.substr(pos, nl - pos));
    pos = nl + 1;
  }
  if (!data.empty() && data.back() == '\n') {
    // the loop already stopped before the empty string after the last '\n'
  }
  return lines;
}

// FNV-1a 64 over the ids as little-endian uint32 (same as the reference).
inline uint64_t fnv1a_ids(const std::vector<int32_t>& ids) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (int32_t id : ids) {
    uint32_t v = static_cast<uint32_t>(id);
    for (int k = 0; k < 4; ++k) {
      h ^= (v >> (8 * k)) & 0xFF;
      h *= 1099511628211ull;
    }
  }
  return h;
}

// A fresh directory under the system temp dir, removed by the destructor.
struct TempDir {
  std::filesystem::path path;
  explicit TempDir(const std::string& tag) {
    std::random_device rd;
    path = std::filesystem::temp_directory_path() /
           ("mpitron_" + tag + "_" + std::to_string(rd()) + std::to_string(rd()));
    std::filesystem::create_directories(path);
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
  std::string operator/(const std::string& name) const { return (path / name).string(); }
};

// Path of a built app: tests run in the build dir, apps are in <build>/apps/.
inline std::string app_path(const std::string& name) {
  for (const char* dir : {"apps/", "../apps/", "../../apps/"}) {
    std::string p = std::string(dir) + name;
    if (std::filesystem::exists(p)) return std::filesystem::absolute(p).string();
  }
  return "";
}

// Runs a shell command; returns its exit status and fills `output` (stdout+stderr).
inline int run_command(const std::string& cmd, std::string* output = nullptr) {
  FILE* p = popen((cmd + " 2>&1").c_str(), "r");
  if (!p) return -1;
  std::string out;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
  int status = pclose(p);
  if (output) *output = out;
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

}  // namespace mpitron::testing
