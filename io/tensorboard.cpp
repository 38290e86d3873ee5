// io/tensorboard.cpp — TFRecord framing and a hand-written protobuf encoder for Event.
#include "io/tensorboard.h"

#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>

#include "core/error.h"
#include "io/crc32c.h"

namespace mpitron::io {

namespace {

double now_seconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

// ---- protobuf wire format: key = (field << 3) | wire type ----
enum Wire : uint8_t { kVarint = 0, kFixed64 = 1, kLengthDelimited = 2, kFixed32 = 5 };

void put_varint(std::string& out, uint64_t v) {
  while (v >= 0x80) {
    out.push_back(static_cast<char>((v & 0x7f) | 0x80));
    v >>= 7;
  }
  out.push_back(static_cast<char>(v));
}
void put_key(std::string& out, int field, Wire w) { put_varint(out, (static_cast<uint64_t>(field) << 3) | w); }
template <typename T> void put_fixed(std::string& out, T v) {  // little-endian hosts
  char b[sizeof(T)];
  std::memcpy(b, &v, sizeof(T));
  out.append(b, sizeof(T));
}
void put_bytes(std::string& out, int field, const std::string& s) {
  put_key(out, field, kLengthDelimited);
  put_varint(out, s.size());
  out += s;
}

// Event fields.
constexpr int kEventWallTime = 1, kEventStep = 2, kEventFileVersion = 3, kEventSummary = 5;
constexpr int kSummaryValue = 1;
constexpr int kValueTag = 1, kValueSimpleValue = 2;

std::string event_header(double wall_time, int64_t step) {
  std::string e;
  put_key(e, kEventWallTime, kFixed64);
  put_fixed(e, wall_time);
  if (step != 0) {  // proto3: zero is the default and is not written
    put_key(e, kEventStep, kVarint);
    put_varint(e, static_cast<uint64_t>(step));  // int64: two's complement as uint64
  }
  return e;
}

}  // namespace

std::string encode_file_version_event(double wall_time) {
  std::string e = event_header(wall_time, 0);
  put_bytes(e, kEventFileVersion, "brain.Event:2");
  return e;
}

std::string encode_scalar_event(double wall_time, int64_t step, const std::string& tag, float value) {
  std::string v;
  put_bytes(v, kValueTag, tag);
  put_key(v, kValueSimpleValue, kFixed32);
  put_fixed(v, value);
  std::string summary;
  put_bytes(summary, kSummaryValue, v);
  std::string e = event_header(wall_time, step);
  put_bytes(e, kEventSummary, summary);
  return e;
}

TensorBoardWriter::TensorBoardWriter(const std::string& dir) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  MPT_CHECK(!ec, str("create TensorBoard directory '", dir, "': ", ec.message()), "check --tensorboard-dir");
  char host[256] = "localhost";
  gethostname(host, sizeof host - 1);
  host[sizeof host - 1] = '\0';
  path_ = (std::filesystem::path(dir) /
           str("events.out.tfevents.", static_cast<long long>(now_seconds()), ".", host, ".", getpid(), ".mpitron"))
              .string();
  f_ = std::fopen(path_.c_str(), "wb");
  MPT_CHECK(f_, str("create TensorBoard event file '", path_, "': ", std::strerror(errno)), "");
  write_record(encode_file_version_event(now_seconds()));
  flush();
}

TensorBoardWriter::~TensorBoardWriter() {
  if (f_) std::fclose(f_);
}

void TensorBoardWriter::write_record(const std::string& data) {
  std::string rec;
  const uint64_t len = data.size();
  put_fixed(rec, len);
  put_fixed(rec, crc32c_masked(crc32c(&len, sizeof len)));
  rec += data;
  put_fixed(rec, crc32c_masked(crc32c(data.data(), data.size())));
  MPT_CHECK(std::fwrite(rec.data(), 1, rec.size(), f_) == rec.size(),
            str("write TensorBoard event file '", path_, "': ", std::strerror(errno)), "the disk may be full");
}

void TensorBoardWriter::add_scalar(const std::string& tag, double value, int64_t step) {
  write_record(encode_scalar_event(now_seconds(), step, tag, static_cast<float>(value)));
}

void TensorBoardWriter::flush() {
  MPT_CHECK(std::fflush(f_) == 0, str("flush TensorBoard event file '", path_, "': ", std::strerror(errno)), "");
}

}  // namespace mpitron::io
