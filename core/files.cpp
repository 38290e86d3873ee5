#include "core/files.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "core/error.h"

namespace mpitron {

void check_regular_file(const std::string& path, const std::string& what) {
  struct stat st{};
  if (::stat(path.c_str(), &st) != 0)
    MPT_THROW(str("cannot open ", what, " '", path, "': ", std::strerror(errno)), "check the path");
  const char* kind = S_ISREG(st.st_mode)    ? nullptr
                     : S_ISDIR(st.st_mode)  ? "a directory"
                     : S_ISFIFO(st.st_mode) ? "a FIFO (named pipe)"
                     : S_ISCHR(st.st_mode)  ? "a character device"
                     : S_ISBLK(st.st_mode)  ? "a block device"
                     : S_ISSOCK(st.st_mode) ? "a socket"
                                            : "not a regular file";
  if (kind) MPT_THROW(str(what, " '", path, "' is ", kind, ", not a regular file"), "pass the path of a regular file");
}

LineReader::LineReader(const std::string& path, const std::string& what, int64_t max_line_bytes)
    : in_(path, std::ios::binary), path_(path), what_(what), max_(max_line_bytes) {
  MPT_CHECK(in_.good(), str("cannot open ", what, " '", path, "'"), "check the path");
}

std::string LineReader::where() const { return str(path_, ":", line_no_); }

bool LineReader::next(std::string& line) {
  line.clear();
  std::streambuf* sb = in_.rdbuf();
  bool any = false;
  for (;;) {
    const int c = sb->sbumpc();
    if (c == std::char_traits<char>::eof()) break;
    any = true;
    if (c == '\n') break;
    line.push_back(static_cast<char>(c));
    if (static_cast<int64_t>(line.size()) > max_)
      MPT_THROW(str(what_, " '", path_, "' line ", line_no_ + 1, " is longer than ", max_, " bytes (no newline)"),
                "is it a text file with one record per line?");
  }
  if (!any) return false;
  ++line_no_;
  if (!line.empty() && line.back() == '\r') line.pop_back();
  return true;
}

OutputFile::OutputFile(const std::string& path, const std::string& what) : path_(path), what_(what) {
  f_ = std::fopen(path.c_str(), "wb");
  if (!f_) MPT_THROW(str("cannot create ", what, " '", path, "': ", std::strerror(errno)),
                     "check that the directory exists and is writable");
}

OutputFile::~OutputFile() {
  if (f_) std::fclose(f_);
}

void OutputFile::fail(const char* step, int err) {
  if (f_) std::fclose(f_);
  f_ = nullptr;
  MPT_THROW(str(what_, " '", path_, "': ", step, " failed: ", std::strerror(err)),
            err == ENOSPC || err == EDQUOT ? "the disk is full (or over quota): free space and run again" : "");
}

void OutputFile::write(std::string_view bytes) {
  MPT_CHECK(f_, str(what_, " '", path_, "' is already closed"), "");
  if (!bytes.empty() && std::fwrite(bytes.data(), 1, bytes.size(), f_) != bytes.size()) fail("write", errno);
}

void OutputFile::flush() {
  MPT_CHECK(f_, str(what_, " '", path_, "' is already closed"), "");
  if (std::fflush(f_) != 0) fail("write", errno);
}

void OutputFile::close() {
  if (!f_) return;
  if (std::fflush(f_) != 0) fail("write", errno);
  // fsync is refused by pipes, terminals and some devices (EINVAL, ENOTSUP, EROFS): nothing to make durable there.
  if (::fsync(fileno(f_)) != 0 && errno != EINVAL && errno != ENOTSUP && errno != EROFS) fail("fsync", errno);
  std::FILE* f = f_;
  f_ = nullptr;
  if (std::fclose(f) != 0) {
    const int err = errno;
    MPT_THROW(str(what_, " '", path_, "': close failed: ", std::strerror(err)),
              err == ENOSPC || err == EDQUOT ? "the disk is full (or over quota): free space and run again" : "");
  }
}

void write_file_checked(const std::string& path, std::string_view bytes, const std::string& what) {
  OutputFile f(path, what);
  f.write(bytes);
  f.close();
}

}  // namespace mpitron
