// io/checkpoint_manifest.cpp — write and verify manifest.json (see the header).
#include "io/checkpoint_manifest.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "io/checkpoint.h"
#include "io/crc32c.h"

namespace fs = std::filesystem;

namespace mpitron::io {

namespace {

constexpr const char* kManifestFormat = "mpitron-ckpt-manifest";
constexpr uint64_t kMetaBlock = uint64_t{1} << 20;  // metadata ranges are cut into CRC blocks of this size
constexpr uint64_t kMaxManifestBytes = uint64_t{256} << 20;
const char* const kHint =
    "the file is damaged (disk or copy error, or an interrupted copy); the loader falls back to an older checkpoint";

std::string manifest_path(const std::string& h5_path) {
  return (fs::path(h5_path).parent_path() / kManifestFileName).string();
}

[[noreturn]] void damaged(const std::string& what) { throw CheckpointDamaged(what, kHint, __FILE__, __LINE__); }

struct File {
  int fd = -1;
  ~File() {
    if (fd >= 0) ::close(fd);
  }
};

// CRC-32C of [off, off + len) of fd, or nullopt-like false on a short read / error (errno kept in *err).
bool crc_range(int fd, uint64_t off, uint64_t len, std::vector<uint8_t>& buf, uint32_t* crc, std::string* err) {
  uint32_t c = 0;
  while (len > 0) {
    const size_t want = static_cast<size_t>(std::min<uint64_t>(len, buf.size()));
    const ssize_t r = ::pread(fd, buf.data(), want, static_cast<off_t>(off));
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) {
      *err = r < 0 ? std::strerror(errno) : str("the file ends at byte ", off);
      return false;
    }
    c = crc32c_extend(c, buf.data(), static_cast<size_t>(r));
    off += static_cast<uint64_t>(r);
    len -= static_cast<uint64_t>(r);
  }
  *crc = c;
  return true;
}

std::string hex32(uint32_t v) {
  char b[16];
  std::snprintf(b, sizeof b, "0x%08x", v);
  return b;
}

}  // namespace

void write_checkpoint_manifest(const std::string& h5_path, std::vector<std::pair<uint64_t, uint64_t>> data,
                               const std::string& run) {
  File f;
  f.fd = ::open(h5_path.c_str(), O_RDONLY | O_CLOEXEC);
  MPT_CHECK(f.fd >= 0, str("open '", h5_path, "' to checksum it: ", std::strerror(errno)), "");
  struct stat st {};
  MPT_CHECK(::fstat(f.fd, &st) == 0, str("stat '", h5_path, "': ", std::strerror(errno)), "");
  const uint64_t size = static_cast<uint64_t>(st.st_size);
  data.erase(std::remove_if(data.begin(), data.end(), [](const auto& r) { return r.second == 0; }), data.end());
  std::sort(data.begin(), data.end());
  nlohmann::json jd = nlohmann::json::array(), jm = nlohmann::json::array();
  std::vector<uint8_t> buf(kMetaBlock);
  uint64_t at = 0;
  auto meta_upto = [&](uint64_t end) {
    while (at < end) {
      const uint64_t len = std::min(kMetaBlock, end - at);
      uint32_t crc = 0;
      std::string err;
      MPT_CHECK(crc_range(f.fd, at, len, buf, &crc, &err), str("read '", h5_path, "' at byte ", at, ": ", err), "");
      jm.push_back({at, len, crc});
      at += len;
    }
  };
  for (const auto& [off, len] : data) {
    MPT_CHECK(off >= at && off + len <= size,
              str("internal: dataset bytes [", off, ", ", off + len, ") of '", h5_path, "' overlap another dataset or ",
                  "lie past the end of the file (", size, " bytes)"),
              "");
    meta_upto(off);
    jd.push_back({off, len});
    at = off + len;
  }
  meta_upto(size);
  nlohmann::json j = {{"format", kManifestFormat},
                      {"version", 1},
                      {"file", fs::path(h5_path).filename().string()},
                      {"bytes", size},
                      {"checksum", "crc32c"},
                      {"data", jd},
                      {"meta", jm}};
  if (!run.empty()) j["run"] = run;
  const std::string line = j.dump();
  const std::string text = line + "\ncrc32c " + hex32(crc32c(line.data(), line.size())) + "\n";
  const std::string path = manifest_path(h5_path);
  File out;
  out.fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  MPT_CHECK(out.fd >= 0, str("create '", path, "': ", std::strerror(errno)), "check that the save directory is writable");
  const ssize_t n = ::write(out.fd, text.data(), text.size());
  const bool ok = n == static_cast<ssize_t>(text.size()) && ::fsync(out.fd) == 0;
  MPT_CHECK(ok, str("write '", path, "': ", n < 0 || n == static_cast<ssize_t>(text.size()) ? std::strerror(errno) : "short write"),
            "the disk may be full");
}

std::string checkpoint_run(const std::string& iter_dir) {
  std::ifstream f(fs::path(iter_dir) / kManifestFileName, std::ios::binary);
  std::string line;
  if (!f.good() || !std::getline(f, line) || line.size() > kMaxManifestBytes) return "";
  const nlohmann::json j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
  return j.is_object() && j.contains("run") && j["run"].is_string() ? j["run"].get<std::string>() : "";
}

bool verify_checkpoint_manifest(const std::string& h5_path) {
  const std::string path = manifest_path(h5_path);
  File mf;
  mf.fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (mf.fd < 0) {
    if (errno == ENOENT) return false;
    damaged(str("cannot open the manifest '", path, "': ", std::strerror(errno)));
  }
  struct stat ms {};
  if (::fstat(mf.fd, &ms) != 0) damaged(str("stat '", path, "': ", std::strerror(errno)));
  if (static_cast<uint64_t>(ms.st_size) > kMaxManifestBytes)
    damaged(str("the manifest '", path, "' is ", ms.st_size, " bytes, more than any manifest"));
  std::string text(static_cast<size_t>(ms.st_size), '\0');
  for (size_t got = 0; got < text.size();) {
    const ssize_t r = ::pread(mf.fd, text.data() + got, text.size() - got, static_cast<off_t>(got));
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) damaged(str("read the manifest '", path, "': ", r < 0 ? std::strerror(errno) : "short read"));
    got += static_cast<size_t>(r);
  }
  // "<json>\ncrc32c 0x........\n"
  const size_t nl = text.find('\n');
  const std::string line = text.substr(0, nl == std::string::npos ? text.size() : nl);
  const std::string want_tail = "crc32c " + hex32(crc32c(line.data(), line.size())) + "\n";
  if (nl == std::string::npos || text.compare(nl + 1, std::string::npos, want_tail) != 0)
    damaged(str("the manifest '", path, "' is damaged (its own checksum line does not match)"));
  nlohmann::json j;
  uint64_t size = 0;
  std::vector<std::pair<uint64_t, uint64_t>> data;
  struct Meta {
    uint64_t off, len;
    uint32_t crc;
  };
  std::vector<Meta> meta;
  try {
    j = nlohmann::json::parse(line);
    if (j.at("format").get<std::string>() != kManifestFormat || j.at("version").get<int64_t>() != 1 ||
        j.at("checksum").get<std::string>() != "crc32c")
      damaged(str("the manifest '", path, "' has an unknown format, version or checksum"));
    size = j.at("bytes").get<uint64_t>();
    for (const auto& r : j.at("data")) data.emplace_back(r.at(0).get<uint64_t>(), r.at(1).get<uint64_t>());
    for (const auto& r : j.at("meta")) meta.push_back({r.at(0).get<uint64_t>(), r.at(1).get<uint64_t>(), r.at(2).get<uint32_t>()});
  } catch (const nlohmann::json::exception& e) {
    damaged(str("the manifest '", path, "' is not valid: ", e.what()));
  }
  // The ranges must tile [0, size): a manifest that passed its checksum always does.
  {
    std::vector<std::pair<uint64_t, uint64_t>> all = data;
    for (const Meta& m : meta) all.emplace_back(m.off, m.len);
    std::sort(all.begin(), all.end());
    uint64_t at = 0;
    for (const auto& [off, len] : all) {
      if (off != at) damaged(str("the manifest '", path, "' does not cover bytes [", std::min(at, off), ", ", std::max(at, off), ")"));
      at = off + len;
    }
    if (at != size) damaged(str("the manifest '", path, "' covers ", at, " bytes of ", size));
  }
  File f;
  f.fd = ::open(h5_path.c_str(), O_RDONLY | O_CLOEXEC);
  if (f.fd < 0) damaged(str("open checkpoint file '", h5_path, "': ", std::strerror(errno)));
  struct stat st {};
  if (::fstat(f.fd, &st) != 0) damaged(str("stat '", h5_path, "': ", std::strerror(errno)));
  const uint64_t have = static_cast<uint64_t>(st.st_size);
  if (have != size)
    damaged(str("checkpoint file '", h5_path, "' is ", have, " bytes, its manifest says ", size,
                have < size ? ": the file is truncated" : ": the file has grown"));
  std::vector<uint8_t> buf(kMetaBlock);
  for (const Meta& m : meta) {
    uint32_t crc = 0;
    std::string err;
    if (!crc_range(f.fd, m.off, m.len, buf, &crc, &err))
      damaged(str("reading checkpoint file '", h5_path, "' at byte ", m.off, ": ", err));
    if (crc != m.crc)
      damaged(str("checksum mismatch in the HDF5 metadata of checkpoint file '", h5_path, "', bytes [", m.off, ", ",
                  m.off + m.len, "): stored ", hex32(m.crc), ", computed ", hex32(crc)));
  }
  return true;
}

}  // namespace mpitron::io
