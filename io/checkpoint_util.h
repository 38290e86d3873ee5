// io/checkpoint_util.h — file-system and hyperslab helpers shared by the
// checkpoint writer and reader (internal to io/).
#pragma once
#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <regex>
#include <string>
#include <vector>

#include "core/error.h"
#include "io/hdf5_file.h"
#include "tensor/tensor.h"

namespace mpitron::io::detail {

// ---------------------------------------------------------------- file system helpers

inline std::string errno_str() { return std::strerror(errno); }

inline void fsync_path(const std::string& path, bool dir) {
  const int fd = ::open(path.c_str(), O_RDONLY | (dir ? O_DIRECTORY : 0));
  MPT_CHECK(fd >= 0, str("open '", path, "' for fsync: ", errno_str()), "");
  const int rc = ::fsync(fd);
  const std::string err = errno_str();
  ::close(fd);
  MPT_CHECK(rc == 0, str("fsync '", path, "': ", err), "the disk may be full or failing");
}

inline void rename_path(const std::string& from, const std::string& to) {
  MPT_CHECK(std::rename(from.c_str(), to.c_str()) == 0, str("rename '", from, "' -> '", to, "': ", errno_str()),
            "");
}

// Writes `text` to `path` atomically: temp file, fsync, rename, fsync the directory.
inline void replace_file(const std::string& path, const std::string& text) {
  const std::string tmp = path + ".tmp";
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  MPT_CHECK(fd >= 0, str("create '", tmp, "': ", errno_str()), "check that the save directory is writable");
  const ssize_t n = ::write(fd, text.data(), text.size());
  const bool ok = n == static_cast<ssize_t>(text.size()) && ::fsync(fd) == 0;
  const std::string err = errno_str();
  ::close(fd);
  MPT_CHECK(ok, str("write '", tmp, "': ", err), "the disk may be full");
  rename_path(tmp, path);
  fsync_path(std::filesystem::path(path).parent_path().string(), true);
}

// iter_N (committed) or iter_N.tmp; -1 for anything else.
inline int64_t parse_iter_dir(const std::string& name, bool* is_tmp) {
  static const std::regex re(R"(iter_(\d+)(\.tmp)?)");
  std::smatch m;
  if (!std::regex_match(name, m, re)) return -1;
  *is_tmp = m[2].matched;
  return std::stoll(m[1].str());
}

// ---------------------------------------------------------------- hyperslab runs

// The contiguous runs (in the global row-major byte array) of a hyperslab,
// in the order its elements sit in the local row-major buffer.
template <typename F>
void for_each_run(const Shape& global, const Shape& offset, const Shape& count, size_t esize, const F& fn) {
  const int nd = static_cast<int>(global.size());
  if (nd == 0) {
    fn(uint64_t{0}, static_cast<uint64_t>(esize));
    return;
  }
  if (shape_numel(count) == 0) return;
  const Shape gstride = contiguous_strides(global);
  int k = nd - 1;  // dims after k are fully covered, so one run spans count[k] rows of them
  while (k > 0 && count[k] == global[k]) --k;
  const uint64_t run_elems = static_cast<uint64_t>(count[k] * gstride[k]);
  std::vector<int64_t> idx(static_cast<size_t>(k), 0);
  while (true) {
    int64_t start = offset[k] * gstride[k];
    for (int d = 0; d < k; ++d) start += (offset[d] + idx[d]) * gstride[d];
    fn(static_cast<uint64_t>(start) * esize, run_elems * esize);
    int d = k - 1;
    while (d >= 0 && ++idx[d] == count[d]) idx[d--] = 0;
    if (d < 0) break;
  }
}


// True when any of the n elements at data (of a floating type) is NaN or Inf.
inline bool values_nonfinite(ElemType type, const void* data, uint64_t n) {
  switch (type) {
    case ElemType::F32: {
      const auto* p = static_cast<const float*>(data);
      for (uint64_t i = 0; i < n; ++i)
        if (!std::isfinite(p[i])) return true;
      return false;
    }
    case ElemType::F64: {
      const auto* p = static_cast<const double*>(data);
      for (uint64_t i = 0; i < n; ++i)
        if (!std::isfinite(p[i])) return true;
      return false;
    }
    case ElemType::BF16:
    case ElemType::F16: {  // exponent bits all ones: Inf or NaN
      const uint16_t mask = type == ElemType::BF16 ? 0x7F80 : 0x7C00;
      const auto* p = static_cast<const uint16_t*>(data);
      for (uint64_t i = 0; i < n; ++i)
        if ((p[i] & mask) == mask) return true;
      return false;
    }
    default:
      return false;
  }
}

}  // namespace mpitron::io::detail
