#include "io/torch_zip.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstring>

#include "core/error.h"

namespace mpitron::io {

// ---------------------------------------------------------------------------------------------
// ReadOnlyFile
// ---------------------------------------------------------------------------------------------
ReadOnlyFile::ReadOnlyFile(const std::string& path) : path_(path) {
  // O_NONBLOCK so that naming a FIFO cannot block here; it is refused just below.
  fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd_ < 0) MPT_THROW(str("cannot open ", path, ": ", std::strerror(errno)), "check the path");
  struct stat st {};
  if (::fstat(fd_, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd_);
    fd_ = -1;
    MPT_THROW(str(path, " is not a regular file"), "name a checkpoint file, not a directory, FIFO or device");
  }
  size_ = static_cast<uint64_t>(st.st_size);
}

ReadOnlyFile::~ReadOnlyFile() {
  if (fd_ >= 0) ::close(fd_);
}

void ReadOnlyFile::read(uint64_t offset, void* dst, uint64_t n, const std::string& what) const {
  if (offset > size_ || n > size_ - offset)
    MPT_THROW(str(path_, ": ", what, ": bytes [", offset, ", ", offset, " + ", n, ") are past the end of the file (",
                  size_, " bytes)"),
              "the file is truncated or damaged; copy it again from its source");
  auto* p = static_cast<uint8_t*>(dst);
  uint64_t done = 0;
  while (done < n) {
    const size_t chunk = static_cast<size_t>(std::min<uint64_t>(n - done, uint64_t{1} << 30));
    const ssize_t got = ::pread(fd_, p + done, chunk, static_cast<off_t>(offset + done));
    ++reads_;
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0)
      MPT_THROW(str(path_, ": ", what, ": read of ", n, " bytes at ", offset,
                    " failed: ", got == 0 ? "unexpected end of file" : std::strerror(errno)),
                "the file changed while being read, or the disk failed");
    done += static_cast<uint64_t>(got);
  }
  bytes_read_ += n;
}

// ---------------------------------------------------------------------------------------------
// CRC-32
// ---------------------------------------------------------------------------------------------
namespace {
constexpr std::array<uint32_t, 256> make_crc_table() {
  std::array<uint32_t, 256> t{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t c = i;
    for (int k = 0; k < 8; ++k) c = (c & 1) ? 0xEDB88320u ^ (c >> 1) : c >> 1;
    t[i] = c;
  }
  return t;
}
constexpr std::array<uint32_t, 256> kCrcTable = make_crc_table();
}  // namespace

uint32_t zip_crc32(const void* data, size_t n, uint32_t crc) {
  const auto* p = static_cast<const uint8_t*>(data);
  crc = ~crc;
  for (size_t i = 0; i < n; ++i) crc = kCrcTable[(crc ^ p[i]) & 0xff] ^ (crc >> 8);
  return ~crc;
}

// ---------------------------------------------------------------------------------------------
// ZipArchive
// ---------------------------------------------------------------------------------------------
namespace {
constexpr uint32_t kLocalSig = 0x04034b50, kCentralSig = 0x02014b50, kEocdSig = 0x06054b50, kZip64EocdSig = 0x06064b50,
                   kZip64LocatorSig = 0x07064b50;
constexpr uint64_t kEocdSize = 22, kZip64EocdSize = 56, kZip64LocatorSize = 20, kCentralSize = 46, kLocalSize = 30;

uint16_t le16(const uint8_t* p) { return static_cast<uint16_t>(p[0] | (p[1] << 8)); }
uint32_t le32(const uint8_t* p) {
  return static_cast<uint32_t>(p[0]) | (static_cast<uint32_t>(p[1]) << 8) | (static_cast<uint32_t>(p[2]) << 16) |
         (static_cast<uint32_t>(p[3]) << 24);
}
uint64_t le64(const uint8_t* p) { return le32(p) | (static_cast<uint64_t>(le32(p + 4)) << 32); }

std::string printable(const std::string& name) {
  std::string s;
  for (unsigned char c : name.substr(0, 200)) s += (c >= 0x20 && c < 0x7f) ? static_cast<char>(c) : '?';
  return name.size() > 200 ? s + "..." : s;
}
}  // namespace

ZipArchive::ZipArchive(std::shared_ptr<const ReadOnlyFile> file, uint64_t base, uint64_t length, std::string label)
    : file_(std::move(file)), base_(base), length_(length), label_(std::move(label)) {
  MPT_CHECK(file_ != nullptr, "ZipArchive: no file");
  if (base_ > file_->size() || length_ > file_->size() - base_)
    MPT_THROW(str(label_, ": the archive [", base_, ", +", length_, ") is past the end of the file (", file_->size(),
                  " bytes)"),
              "the file is truncated, or its index (a torch_dist .metadata) names wrong offsets");
  parse();
}

ZipArchive ZipArchive::open(const std::string& path) {
  auto f = std::make_shared<const ReadOnlyFile>(path);
  const uint64_t n = f->size();
  return ZipArchive(std::move(f), 0, n, path);
}

void ZipArchive::parse() {
  const std::string hint = "the file is truncated or damaged (or is not a torch.save file); copy it again";
  auto fail = [&](const std::string& what) { MPT_THROW(str(label_, ": ", what), hint); };
  auto rd = [&](uint64_t off, void* dst, uint64_t n, const char* what) {
    if (off > length_ || n > length_ - off)
      fail(str(what, " at [", off, ", +", n, ") is past the archive's end (", length_, " bytes)"));
    file_->read(base_ + off, dst, n, str(label_, " ", what));
  };

  // 1. The end-of-central-directory record: the last "PK\5\6" whose comment reaches the end.
  if (length_ < kEocdSize) fail(str("only ", length_, " bytes: too short for a zip archive"));
  // torch writes no archive comment: the record is usually the last 22 bytes; else scan the last 64 KiB.
  uint64_t tail_n = kEocdSize;
  std::vector<uint8_t> tail(tail_n);
  rd(length_ - tail_n, tail.data(), tail_n, "end of central directory");
  if (!(le32(tail.data()) == kEocdSig && le16(tail.data() + 20) == 0)) {
    tail_n = std::min<uint64_t>(length_, kEocdSize + 0xffff);
    tail.resize(tail_n);
    rd(length_ - tail_n, tail.data(), tail_n, "end of central directory");
  }
  int64_t at = -1;
  for (int64_t i = static_cast<int64_t>(tail_n - kEocdSize); i >= 0; --i) {
    const uint8_t* p = tail.data() + i;
    if (le32(p) == kEocdSig && le16(p + 20) == tail_n - static_cast<uint64_t>(i) - kEocdSize) {
      at = i;
      break;
    }
  }
  if (at < 0) fail("no end-of-central-directory record (not a zip file, or truncated)");
  const uint8_t* e = tail.data() + at;
  const uint64_t eocd_off = length_ - tail_n + static_cast<uint64_t>(at);
  if (le16(e + 4) != 0 || le16(e + 6) != 0) fail("a multi-disk (split) zip archive is not supported");
  uint64_t n_entries = le16(e + 10), cd_size = le32(e + 12), cd_off = le32(e + 16);
  uint64_t cd_end_limit = eocd_off;  // the central directory ends before the (ZIP64) EOCD

  // 2. ZIP64: a locator just before the EOCD points at the ZIP64 EOCD record.
  if (eocd_off >= kZip64LocatorSize) {
    uint8_t loc[kZip64LocatorSize];
    rd(eocd_off - kZip64LocatorSize, loc, kZip64LocatorSize, "ZIP64 locator");
    if (le32(loc) == kZip64LocatorSig) {
      const uint64_t z_off = le64(loc + 8);
      if (le32(loc + 4) != 0 || le32(loc + 16) > 1) fail("a multi-disk ZIP64 archive is not supported");
      if (z_off > eocd_off - kZip64LocatorSize || eocd_off - kZip64LocatorSize - z_off < kZip64EocdSize)
        fail(
            str("the ZIP64 end record offset ", z_off, " is not before its locator at ", eocd_off - kZip64LocatorSize));
      uint8_t z[kZip64EocdSize];
      rd(z_off, z, kZip64EocdSize, "ZIP64 end record");
      if (le32(z) != kZip64EocdSig) fail(str("no ZIP64 end record at offset ", z_off, " (its locator points there)"));
      if (le32(z + 16) != 0 || le32(z + 20) != 0) fail("a multi-disk ZIP64 archive is not supported");
      n_entries = le64(z + 32);
      cd_size = le64(z + 40);
      cd_off = le64(z + 48);
      cd_end_limit = z_off;
    }
  }
  if ((cd_size == 0xffffffffu || cd_off == 0xffffffffu) && cd_end_limit == eocd_off)
    fail("the end record says its values are in a ZIP64 record, and there is none");
  if (cd_off > cd_end_limit || cd_size > cd_end_limit - cd_off)
    fail(str("the central directory [", cd_off, ", +", cd_size, ") does not end before its end record at ",
             cd_end_limit));
  if (n_entries > cd_size / kCentralSize)
    fail(str("the central directory claims ", n_entries, " entries in ", cd_size, " bytes"));

  // 3. The central directory, read at once (its size is bounded by the real bytes above).
  std::vector<uint8_t> cd(cd_size);
  rd(cd_off, cd.data(), cd_size, "central directory");
  entries_.reserve(n_entries);
  uint64_t p = 0;
  for (uint64_t k = 0; k < n_entries; ++k) {
    if (cd_size - p < kCentralSize) fail(str("central directory entry ", k, " is cut off"));
    const uint8_t* c = cd.data() + p;
    if (le32(c) != kCentralSig) fail(str("central directory entry ", k, " has no signature (offset ", cd_off + p, ")"));
    const uint16_t flags = le16(c + 8), method = le16(c + 10), name_n = le16(c + 28), extra_n = le16(c + 30),
                   comment_n = le16(c + 32);
    const uint64_t var = uint64_t{name_n} + extra_n + comment_n;
    if (cd_size - p - kCentralSize < var) fail(str("central directory entry ", k, " runs past the directory"));
    ZipEntry z;
    z.name.assign(reinterpret_cast<const char*>(c + kCentralSize), name_n);
    z.crc32 = le32(c + 16);
    uint64_t csize = le32(c + 20), usize = le32(c + 24), off = le32(c + 42);
    // ZIP64 extra field: the overflowed values in order usize, csize, offset.
    const uint8_t* x = c + kCentralSize + name_n;
    for (uint64_t q = 0; q + 4 <= extra_n;) {
      const uint16_t id = le16(x + q), sz = le16(x + q + 2);
      if (q + 4 + sz > extra_n) fail(str("entry '", printable(z.name), "': its extra field runs past its end"));
      if (id == 0x0001) {
        uint64_t r = q + 4;
        auto take = [&](uint64_t& v) {
          if (v != 0xffffffffu) return;
          if (r + 8 > q + 4 + sz) fail(str("entry '", printable(z.name), "': its ZIP64 extra field is too short"));
          v = le64(x + r);
          r += 8;
        };
        take(usize);
        take(csize);
        take(off);
      }
      q += 4 + sz;
    }
    if (z.name.empty()) fail(str("central directory entry ", k, " has an empty name"));
    if (flags & 0x1) fail(str("entry '", printable(z.name), "' is encrypted"));
    if (method != 0)
      fail(str("entry '", printable(z.name), "' is compressed (method ", method,
               "); torch.save writes stored entries only"));
    if (csize != usize)
      fail(str("entry '", printable(z.name), "' is stored but its sizes differ (", csize, " vs ", usize, ")"));
    z.size = usize;
    z.header_offset = off;
    if (by_name_.count(z.name)) fail(str("entry '", printable(z.name), "' appears twice"));
    by_name_.emplace(z.name, entries_.size());
    entries_.push_back(std::move(z));
    p += kCentralSize + var;
  }

  // 4. Each local header agrees with its central entry; the data lies before the directory.
  for (ZipEntry& z : entries_) {
    const std::string ename = str("entry '", printable(z.name), "'");
    if (z.header_offset > cd_off || cd_off - z.header_offset < kLocalSize)
      fail(str(ename, ": its local header offset ", z.header_offset, " is not before the central directory at ",
               cd_off));
    // The local header and its name in one read (the name's length as the directory gives it).
    const uint64_t hn = std::min<uint64_t>(kLocalSize + z.name.size(), cd_off - z.header_offset);
    std::vector<uint8_t> h(hn);
    rd(z.header_offset, h.data(), hn, "local header");
    if (le32(h.data()) != kLocalSig) fail(str(ename, ": no local header at offset ", z.header_offset));
    const uint64_t name_n = le16(h.data() + 26), extra_n = le16(h.data() + 28);
    if (name_n != z.name.size() || hn < kLocalSize + name_n)
      fail(str(ename, ": its local header names ", name_n, " bytes, the directory ", z.name.size()));
    if (std::memcmp(h.data() + kLocalSize, z.name.data(), name_n) != 0)
      fail(str(ename, ": its local header has another name"));
    z.data_offset = z.header_offset + kLocalSize + name_n + extra_n;
    if (z.data_offset > cd_off || z.size > cd_off - z.data_offset)
      fail(str(ename, ": its data [", z.data_offset, ", +", z.size, ") runs into the central directory at ", cd_off));
  }
  // 5. No two entries overlap (header through data).
  std::vector<const ZipEntry*> order;
  for (const ZipEntry& z : entries_) order.push_back(&z);
  std::sort(order.begin(), order.end(), [](auto* a, auto* b) { return a->header_offset < b->header_offset; });
  for (size_t i = 1; i < order.size(); ++i)
    if (order[i - 1]->data_offset + order[i - 1]->size > order[i]->header_offset)
      fail(str("entries '", printable(order[i - 1]->name), "' and '", printable(order[i]->name), "' overlap"));
}

const ZipEntry* ZipArchive::find(const std::string& name) const {
  const auto it = by_name_.find(name);
  return it == by_name_.end() ? nullptr : &entries_[it->second];
}

const ZipEntry& ZipArchive::at(const std::string& name) const {
  const ZipEntry* e = find(name);
  if (!e) MPT_THROW(str(label_, ": no entry '", printable(name), "'"), "the file is not a complete torch.save archive");
  return *e;
}

void ZipArchive::read(const ZipEntry& e, uint64_t offset, void* dst, uint64_t n) const {
  if (offset > e.size || n > e.size - offset)
    MPT_THROW(str(label_, ": entry '", printable(e.name), "': bytes [", offset, ", +", n, ") are past its end (",
                  e.size, " bytes)"),
              "");
  file_->read(base_ + e.data_offset + offset, dst, n, str(label_, " entry '", printable(e.name), "'"));
}

std::vector<uint8_t> ZipArchive::read_all(const ZipEntry& e, uint64_t max_bytes) const {
  if (e.size > max_bytes)
    MPT_THROW(str(label_, ": entry '", printable(e.name), "' is ", e.size, " bytes, more than the ", max_bytes,
                  " allowed for it"),
              "");
  std::vector<uint8_t> out(e.size);
  read(e, 0, out.data(), e.size);
  if (zip_crc32(out.data(), out.size()) != e.crc32)
    MPT_THROW(str(label_, ": entry '", printable(e.name), "' fails its CRC-32 check"),
              "the file is damaged; copy it again from its source");
  return out;
}

bool ZipArchive::crc_ok(const ZipEntry& e) const {
  std::vector<uint8_t> buf(static_cast<size_t>(std::min<uint64_t>(e.size, uint64_t{4} << 20)));
  uint32_t crc = 0;
  for (uint64_t off = 0; off < e.size;) {
    const uint64_t n = std::min<uint64_t>(buf.size(), e.size - off);
    read(e, off, buf.data(), n);
    crc = zip_crc32(buf.data(), n, crc);
    off += n;
  }
  return crc == e.crc32;
}

}  // namespace mpitron::io
