// core/files.h — files a user names: inputs that must not block or grow
// without bound, and outputs whose every byte is checked to reach the disk.
//
//   - check_regular_file: before opening an input that is read whole or by
//     seeking (a safetensors shard, a config), refuse a FIFO, a device or a
//     directory: opening a FIFO blocks until someone writes to it.
//   - LineReader: lines of a text input (JSONL, TSV, prompts), each at most
//     max_line_bytes; a longer one (a file with no newline: /dev/zero) is an
//     Error naming the file and line instead of unbounded memory.
//   - OutputFile: an output written with checks through close: write errors,
//     the flush, fsync and close each throw naming the file (a full disk is
//     often reported only by the flush or the close). Nothing is reported
//     written before close() returns.
#pragma once
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <string>
#include <string_view>

namespace mpitron {

// Throws naming `what` and `path` when path is missing or not a regular file.
void check_regular_file(const std::string& path, const std::string& what);

// The default line bound: far above a real document line, far below memory.
constexpr int64_t kMaxLineBytes = int64_t{256} << 20;

class LineReader {
 public:
  // Opens path ("-" is not special); `what` names it in errors ("--valid-data").
  LineReader(const std::string& path, const std::string& what, int64_t max_line_bytes = kMaxLineBytes);
  // The next line without its '\n' (and a '\r' before it); false at the end.
  bool next(std::string& line);
  int64_t line_no() const { return line_no_; }  // of the line last returned (1-based)
  std::string where() const;                    // "path:line"

 private:
  std::ifstream in_;
  std::string path_, what_;
  int64_t max_ = 0, line_no_ = 0;
};

class OutputFile {
 public:
  // Creates or truncates path; `what` names it in errors ("--genfile").
  OutputFile(const std::string& path, const std::string& what);
  ~OutputFile();  // closes without checks if close() was not called (an error path)
  OutputFile(const OutputFile&) = delete;
  OutputFile& operator=(const OutputFile&) = delete;

  void write(std::string_view bytes);
  // Pushes the bytes to the kernel (the point at which a pipe reader sees them); checked.
  void flush();
  // fflush, fsync (where the file supports it), fclose: each checked.
  void close();
  const std::string& path() const { return path_; }

 private:
  [[noreturn]] void fail(const char* step, int err);
  std::FILE* f_ = nullptr;
  std::string path_, what_;
};

// Writes `bytes` to path through an OutputFile.
void write_file_checked(const std::string& path, std::string_view bytes, const std::string& what);

}  // namespace mpitron
