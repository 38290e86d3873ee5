// io/tensorboard.h — TensorBoard event files without protobuf or TensorFlow.
//
// File: <dir>/events.out.tfevents.<unix time>.<hostname>.<pid>.mpitron, a
// sequence of TFRecords:
//   uint64 length (LE) | uint32 masked CRC-32C of the length bytes | data | uint32 masked CRC-32C of data
// each holding a hand-encoded `Event` protobuf: wall_time (1, double),
// step (2, int64), file_version (3, "brain.Event:2", first record only),
// summary (5) { value (1) { tag (1), simple_value (2, float) } }.
// Not collective: create it on the one rank that logs (Megatron: the last).
#pragma once
#include <cstdint>
#include <cstdio>
#include <string>

namespace mpitron::io {

class TensorBoardWriter {
 public:
  // Creates `dir` if needed and opens a new event file in it.
  explicit TensorBoardWriter(const std::string& dir);
  ~TensorBoardWriter();
  TensorBoardWriter(const TensorBoardWriter&) = delete;
  TensorBoardWriter& operator=(const TensorBoardWriter&) = delete;

  void add_scalar(const std::string& tag, double value, int64_t step);  // stored as float32
  void flush();
  const std::string& path() const { return path_; }

 private:
  void write_record(const std::string& data);
  std::string path_;
  std::FILE* f_ = nullptr;
};

// The bytes of one Event protobuf (exposed for tests).
std::string encode_scalar_event(double wall_time, int64_t step, const std::string& tag, float value);
std::string encode_file_version_event(double wall_time);

}  // namespace mpitron::io
