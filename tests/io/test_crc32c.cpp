// tests/io/test_crc32c.cpp — CRC-32C known answers, combine, TFRecord masking.
#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "io/crc32c.h"

using namespace mpitron::io;

TEST_CASE("crc32c known answers") {
  const std::string s = "123456789";
  CHECK(crc32c(s.data(), s.size()) == 0xE3069283u);
  CHECK(crc32c(nullptr, 0) == 0u);
  // RFC 3720 (iSCSI) B.4: 32 bytes of zeros, of 0xff, and an ascending sequence.
  std::vector<uint8_t> zeros(32, 0), ones(32, 0xff), inc(32);
  for (int i = 0; i < 32; ++i) inc[i] = static_cast<uint8_t>(i);
  CHECK(crc32c(zeros.data(), 32) == 0x8A9136AAu);
  CHECK(crc32c(ones.data(), 32) == 0x62A8AB43u);
  CHECK(crc32c(inc.data(), 32) == 0x46DD794Eu);
}

TEST_CASE("crc32c extend and combine agree with one pass at every split") {
  std::vector<uint8_t> buf(1000);
  uint32_t x = 12345;
  for (auto& b : buf) b = static_cast<uint8_t>((x = x * 1103515245u + 12345u) >> 24);
  const uint32_t whole = crc32c(buf.data(), buf.size());
  for (size_t cut : {size_t{0}, size_t{1}, size_t{7}, size_t{8}, size_t{9}, size_t{500}, size_t{999}, size_t{1000}}) {
    CAPTURE(cut);
    const uint32_t a = crc32c(buf.data(), cut), b = crc32c(buf.data() + cut, buf.size() - cut);
    CHECK(crc32c_extend(a, buf.data() + cut, buf.size() - cut) == whole);
    CHECK(crc32c_combine(a, b, buf.size() - cut) == whole);
  }
  // Three pieces, combined left to right.
  const uint32_t p0 = crc32c(buf.data(), 100), p1 = crc32c(buf.data() + 100, 333),
                 p2 = crc32c(buf.data() + 433, 567);
  CHECK(crc32c_combine(crc32c_combine(p0, p1, 333), p2, 567) == whole);
}

TEST_CASE("crc32c masked (TFRecord)") {
  // mask(c) = rotr(c, 15) + 0xa282ead8; for c = 0 that is the constant itself.
  CHECK(crc32c_masked(0) == 0xa282ead8u);
  CHECK(crc32c_masked(0xE3069283u) == (((0xE3069283u >> 15) | (0xE3069283u << 17)) + 0xa282ead8u));
}

TEST_CASE("crc32c of long buffers (interleaved streams) equals the CRC extended in short pieces") {
  std::vector<uint8_t> buf(3 * 8192 * 5 + 12345);
  uint32_t x = 777;
  for (auto& b : buf) b = static_cast<uint8_t>((x = x * 1103515245u + 12345u) >> 24);
  for (size_t start : {size_t{0}, size_t{1}, size_t{13}}) {
    for (size_t len : {size_t{3 * 8192 - 1}, size_t{3 * 8192}, size_t{3 * 8192 + 9}, size_t{6 * 8192 + 5},
                       buf.size() - 13}) {
      CAPTURE(start);
      CAPTURE(len);
      uint32_t pieces = 0;
      for (size_t i = 0; i < len; i += 1000) pieces = crc32c_extend(pieces, buf.data() + start + i, std::min<size_t>(1000, len - i));
      CHECK(crc32c(buf.data() + start, len) == pieces);
      // Extending a non-zero CRC by a long buffer too.
      const uint32_t head = crc32c(buf.data(), start);
      uint32_t whole = head;
      for (size_t i = 0; i < len; i += 1000) whole = crc32c_extend(whole, buf.data() + start + i, std::min<size_t>(1000, len - i));
      CHECK(crc32c_extend(head, buf.data() + start, len) == whole);
    }
  }
}
