// tests/io/torch_test_util.h — building torch.save-like files by hand for the
// reader's tests: a stored-zip writer (optionally ZIP64) and a pickle
// assembler, so a test can make any well-formed or hostile file.
#pragma once
#include <cstdint>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

#include "io/torch_zip.h"

namespace mpitron::test {

inline std::string read_file_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}
inline void write_file_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

// A zip of stored entries as torch.save lays it out: data 64-byte aligned by
// padding the local header's extra field; zip64 adds the ZIP64 end records
// and a ZIP64 extra field on every central entry.
inline std::string make_zip(const std::vector<std::pair<std::string, std::string>>& entries, bool zip64 = false) {
  auto put16 = [](std::string& s, uint64_t v) {
    s += static_cast<char>(v & 0xff), s += static_cast<char>((v >> 8) & 0xff);
  };
  auto put32 = [&](std::string& s, uint64_t v) { put16(s, v & 0xffff), put16(s, (v >> 16) & 0xffff); };
  auto put64 = [&](std::string& s, uint64_t v) { put32(s, v & 0xffffffffu), put32(s, v >> 32); };
  std::string out, cd;
  for (const auto& [name, data] : entries) {
    const uint64_t off = out.size();
    const uint32_t crc = io::zip_crc32(data.data(), data.size());
    const uint64_t before_data = off + 30 + name.size() + 4;
    const uint64_t pad = (64 - before_data % 64) % 64;
    put32(out, 0x04034b50), put16(out, 20), put16(out, 0), put16(out, 0), put16(out, 0), put16(out, 0);
    put32(out, crc), put32(out, data.size()), put32(out, data.size());
    put16(out, name.size()), put16(out, 4 + pad);
    out += name;
    put16(out, 0x4246), put16(out, pad);  // torch's "FB" padding field
    out += std::string(pad, 'Z');
    out += data;
    put32(cd, 0x02014b50), put16(cd, 45), put16(cd, 20), put16(cd, 0), put16(cd, 0), put16(cd, 0), put16(cd, 0);
    put32(cd, crc);
    if (zip64) {
      put32(cd, 0xffffffffu), put32(cd, 0xffffffffu);
    } else {
      put32(cd, data.size()), put32(cd, data.size());
    }
    put16(cd, name.size()), put16(cd, zip64 ? 28 : 0), put16(cd, 0), put16(cd, 0), put16(cd, 0), put32(cd, 0);
    put32(cd, zip64 ? 0xffffffffu : off);
    cd += name;
    if (zip64) {
      put16(cd, 0x0001), put16(cd, 24), put64(cd, data.size()), put64(cd, data.size()), put64(cd, off);
    }
  }
  const uint64_t cd_off = out.size();
  out += cd;
  if (zip64) {
    const uint64_t z_off = out.size();
    put32(out, 0x06064b50), put64(out, 44), put16(out, 45), put16(out, 45), put32(out, 0), put32(out, 0);
    put64(out, entries.size()), put64(out, entries.size()), put64(out, cd.size()), put64(out, cd_off);
    put32(out, 0x07064b50), put32(out, 0), put64(out, z_off), put32(out, 1);
  }
  put32(out, 0x06054b50), put16(out, 0), put16(out, 0);
  put16(out, zip64 ? 0xffff : entries.size()), put16(out, zip64 ? 0xffff : entries.size());
  put32(out, zip64 ? 0xffffffffu : cd.size()), put32(out, zip64 ? 0xffffffffu : cd_off), put16(out, 0);
  return out;
}

// Pickle assembly: P().proto(2).global("os", "system").str("x").op(0x85).op('R').stop().bytes
struct P {
  std::string bytes;
  P& op(int c) { return bytes += static_cast<char>(c), *this; }
  P& raw(const std::string& s) { return bytes += s, *this; }
  P& u32(uint32_t v) {
    for (int i = 0; i < 4; ++i) bytes += static_cast<char>((v >> (8 * i)) & 0xff);
    return *this;
  }
  P& u64(uint64_t v) {
    for (int i = 0; i < 8; ++i) bytes += static_cast<char>((v >> (8 * i)) & 0xff);
    return *this;
  }
  P& proto(int v) { return op(0x80).op(v); }
  P& global(const std::string& m, const std::string& n) { return op('c').raw(m + "\n" + n + "\n"); }
  P& str(const std::string& s) { return op('X').u32(static_cast<uint32_t>(s.size())).raw(s); }
  P& int1(int v) { return op('K').op(v); }
  P& int4(int32_t v) { return op('J').u32(static_cast<uint32_t>(v)); }
  P& none() { return op('N'); }
  P& mark() { return op('('); }
  P& tuple() { return op('t'); }
  P& empty_tuple() { return op(')'); }
  P& reduce() { return op('R'); }
  P& put(int i) { return op('q').op(i); }
  P& get(int i) { return op('h').op(i); }
  P& stop() { return op('.'); }
  // ('storage', torch.<cls>, key, 'cpu', numel) BINPERSID
  P& storage(const std::string& cls, const std::string& key, int numel) {
    return mark().str("storage").global("torch", cls).str(key).str("cpu").int4(numel).tuple().op('Q');
  }
  // torch._utils._rebuild_tensor_v2(<storage on the stack>, offset, size, stride, False, OrderedDict())
  P& tensor_v2(const std::string& cls, const std::string& key, int numel, int offset, const std::vector<int>& size,
               const std::vector<int>& stride) {
    global("torch._utils", "_rebuild_tensor_v2").mark();
    storage(cls, key, numel).int4(offset);
    mark();
    for (int s : size) int4(s);
    tuple().mark();
    for (int s : stride) int4(s);
    tuple().op(0x89).global("collections", "OrderedDict").empty_tuple().reduce().tuple().reduce();
    return *this;
  }
};

// A torch.save-shaped zip: archive/data.pkl, archive/byteorder, and the given records archive/data/<key>.
inline std::string make_torch_zip(const std::string& pickle,
                                  const std::vector<std::pair<std::string, std::string>>& records, bool zip64 = false,
                                  const std::string& archive = "archive") {
  std::vector<std::pair<std::string, std::string>> e = {{archive + "/data.pkl", pickle},
                                                        {archive + "/byteorder", "little"}};
  for (const auto& [k, v] : records) e.emplace_back(archive + "/data/" + k, v);
  e.emplace_back(archive + "/version", "3\n");
  return make_zip(e, zip64);
}

}  // namespace mpitron::test
