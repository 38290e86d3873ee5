// tests/io/test_tensorboard.cpp — event files: our own framing check, and
// TensorBoard's EventAccumulator reading them (tests/io/tb_check.py).
#include <doctest/doctest.h>

#include <cstring>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>

#include "io/crc32c.h"
#include "io/tensorboard.h"
#include "tests/io/io_test_util.h"

using namespace mpitron;
using namespace mpitron::io;
using mpitron::test::ScratchDir;
namespace fs = std::filesystem;

namespace {

// The TFRecord payloads of a file, checking both masked CRCs of each record.
std::vector<std::string> read_records(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::vector<std::string> out;
  size_t p = 0;
  while (p < bytes.size()) {
    REQUIRE(p + 12 <= bytes.size());
    uint64_t len;
    uint32_t len_crc, data_crc;
    std::memcpy(&len, bytes.data() + p, 8);
    std::memcpy(&len_crc, bytes.data() + p + 8, 4);
    CHECK(len_crc == crc32c_masked(crc32c(bytes.data() + p, 8)));
    REQUIRE(p + 12 + len + 4 <= bytes.size());
    std::string data = bytes.substr(p + 12, len);
    std::memcpy(&data_crc, bytes.data() + p + 12 + len, 4);
    CHECK(data_crc == crc32c_masked(crc32c(data.data(), data.size())));
    out.push_back(data);
    p += 12 + len + 4;
  }
  return out;
}

}  // namespace

TEST_CASE("tensorboard: Event encoding matches the protobuf wire format byte for byte") {
  // wall_time 1.0 (field 1, fixed64), step 300 (field 2, varint ac 02),
  // summary (field 5) { value (1) { tag (1) "a", simple_value (2, fixed32) 2.0f } }.
  const std::string e = encode_scalar_event(1.0, 300, "a", 2.0f);
  const unsigned char want[] = {0x09, 0, 0, 0, 0, 0, 0, 0xf0, 0x3f, 0x10, 0xac, 0x02, 0x2a, 0x0a, 0x0a, 0x08,
                                0x0a, 0x01, 'a', 0x15, 0, 0, 0, 0x40};
  CHECK(e == std::string(reinterpret_cast<const char*>(want), sizeof want));
  const std::string v = encode_file_version_event(1.0);
  CHECK(v.substr(9) == std::string("\x1a\x0d") + "brain.Event:2");
}

TEST_CASE("tensorboard: event file is framed TFRecords that TensorBoard reads") {
  ScratchDir dir("tb");
  const std::string logdir = dir / "tb";
  nlohmann::json want;
  std::string path;
  {
    TensorBoardWriter tb(logdir);
    path = tb.path();
    for (int step = 1; step <= 20; ++step) {
      const double loss = 10.0 / step, lr = 3e-4 * step / 20.0;
      tb.add_scalar("lm loss", loss, step);
      tb.add_scalar("learning-rate", lr, step);
      want["lm loss"].push_back({step, static_cast<float>(loss)});
      want["learning-rate"].push_back({step, static_cast<float>(lr)});
    }
    tb.add_scalar("big step", -1.5, int64_t{1} << 40);
    want["big step"].push_back({int64_t{1} << 40, -1.5});
    tb.flush();
  }
  const std::string name = fs::path(path).filename().string();
  CHECK(name.rfind("events.out.tfevents.", 0) == 0);
  CHECK(name.size() > 8);
  CHECK(name.substr(name.size() - 8) == ".mpitron");
  const auto recs = read_records(path);
  REQUIRE(recs.size() == 42);
  CHECK(recs[0].find("brain.Event:2") != std::string::npos);
  CHECK(recs[1].find("lm loss") != std::string::npos);
  { std::ofstream(dir / "expected.json") << want.dump(); }
  mpitron::test::run_python_check("tb_check.py", str("'", logdir, "' '", dir / "expected.json", "'"), "tensorboard");
}
