// io/torch_zip.h — the zip container torch.save writes, read by pread.
//
// torch.save (torch >= 1.6) writes a zip of STORED (uncompressed) entries
// (caffe2/serialize/inline_container.cc, miniz underneath):
//   <archive>/data.pkl                the pickled object tree
//   <archive>/byteorder               "little" (torch >= 2.1; absent: little)
//   <archive>/data/<key>              one record per storage, its data 64-byte
//                                     aligned in the file (padding in the local
//                                     header's extra field)
//   <archive>/version, .format_version, .storage_alignment, .data/serialization_id, ...
// <archive> is the file's base name at save time ("archive" for a stream):
// callers take it from the entries, never from the current file name.
//
// Layout read here (APPNOTE.TXT 6.3):
//   local header   "PK\3\4" (30 bytes) + name + extra, then the data
//   central dir    "PK\1\2" (46 bytes) + name + extra + comment, per entry
//   [ZIP64 EOCD    "PK\6\6" (56 bytes) and its locator "PK\6\7" (20 bytes)]
//   EOCD           "PK\5\6" (22 bytes) + comment
// 32-bit fields that overflow are 0xFFFFFFFF with the value in the ZIP64
// extra field (id 0x0001: uncompressed size, compressed size, local header
// offset, in that order, only those that overflowed).
//
// Everything a damaged or hostile file could get wrong is checked before any
// read, and every failure throws a mpitron::Error naming the file (and the
// entry): EOCD missing or inconsistent, ZIP64 records out of place, the
// central directory past its bounds or with too many entries for its size,
// names too long or duplicated, compressed or encrypted entries, local headers
// that disagree with the central directory, data past the end or overlapping
// another entry's header or data. Nothing is allocated from a declared size
// that was not first checked against the bytes really there.
//
// An archive is a byte range [base, base + length) of a file: a whole .pt file,
// or one torch.save blob inside a torch_dist .distcp file. Offsets in the
// archive are relative to its base (torch's writer counts from its own start).
#pragma once
#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

namespace mpitron::io {

// A read-only file read with pread, counting the bytes it reads (so a caller
// can check that a lazy read touched only what it needed). Thread-safe.
class ReadOnlyFile {
 public:
  explicit ReadOnlyFile(const std::string& path);  // refuses a missing file, a FIFO, a directory
  ~ReadOnlyFile();
  ReadOnlyFile(const ReadOnlyFile&) = delete;
  ReadOnlyFile& operator=(const ReadOnlyFile&) = delete;

  const std::string& path() const { return path_; }
  uint64_t size() const { return size_; }
  // Reads exactly n bytes at offset into dst; throws naming the file and `what`
  // if the range is not inside the file or the read fails.
  void read(uint64_t offset, void* dst, uint64_t n, const std::string& what) const;
  uint64_t bytes_read() const { return bytes_read_.load(); }
  uint64_t reads() const { return reads_.load(); }  // pread calls made
  void reset_counters() const {
    bytes_read_ = 0;
    reads_ = 0;
  }

 private:
  std::string path_;
  int fd_ = -1;
  uint64_t size_ = 0;
  mutable std::atomic<uint64_t> bytes_read_{0}, reads_{0};
};

struct ZipEntry {
  std::string name;
  uint64_t header_offset = 0;  // local header, relative to the archive's base
  uint64_t data_offset = 0;    // first data byte, relative to the archive's base
  uint64_t size = 0;           // bytes (stored: compressed == uncompressed)
  uint32_t crc32 = 0;          // as recorded in the central directory
};

// Standard CRC-32 (IEEE 802.3, the zip one), continuing from `crc`.
uint32_t zip_crc32(const void* data, size_t n, uint32_t crc = 0);

class ZipArchive {
 public:
  // The archive in [base, base + length) of file; `label` names it in errors
  // (the path, or "path [offset +length]"). Parses and checks the directory.
  ZipArchive(std::shared_ptr<const ReadOnlyFile> file, uint64_t base, uint64_t length, std::string label);
  static ZipArchive open(const std::string& path);

  const std::vector<ZipEntry>& entries() const { return entries_; }
  const ZipEntry* find(const std::string& name) const;  // nullptr when absent
  const ZipEntry& at(const std::string& name) const;    // throws naming the archive and entry
  // n bytes at `offset` inside the entry's data; throws if past the entry's end.
  void read(const ZipEntry& e, uint64_t offset, void* dst, uint64_t n) const;
  // The whole entry, its CRC-32 checked; refuses entries over max_bytes.
  std::vector<uint8_t> read_all(const ZipEntry& e, uint64_t max_bytes = uint64_t{1} << 32) const;
  // Reads the entry in pieces and compares its CRC-32 (false on a mismatch).
  bool crc_ok(const ZipEntry& e) const;

  const std::string& label() const { return label_; }
  const ReadOnlyFile& file() const { return *file_; }
  const std::shared_ptr<const ReadOnlyFile>& file_ptr() const { return file_; }
  uint64_t base() const { return base_; }
  uint64_t length() const { return length_; }

 private:
  void parse();
  std::shared_ptr<const ReadOnlyFile> file_;
  uint64_t base_ = 0, length_ = 0;
  std::string label_;
  std::vector<ZipEntry> entries_;
  std::unordered_map<std::string, size_t> by_name_;
};

}  // namespace mpitron::io
