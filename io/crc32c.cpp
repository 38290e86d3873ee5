// io/crc32c.cpp — CRC-32C: SSE4.2 instruction when the CPU has it (three
// interleaved streams), else slicing-by-8 tables.
#include "io/crc32c.h"

#include <array>
#include <cstring>

#if defined(__x86_64__)
#include <nmmintrin.h>
#endif

namespace mpitron::io {

namespace {

constexpr uint32_t kPoly = 0x82F63B78u;  // reflected Castagnoli polynomial

// tables[k][b]: CRC contribution of byte b followed by k zero bytes.
struct Tables {
  std::array<std::array<uint32_t, 256>, 8> t{};
  Tables() {
    for (uint32_t b = 0; b < 256; ++b) {
      uint32_t c = b;
      for (int i = 0; i < 8; ++i) c = (c & 1) ? (c >> 1) ^ kPoly : c >> 1;
      t[0][b] = c;
    }
    for (uint32_t b = 0; b < 256; ++b)
      for (int k = 1; k < 8; ++k) t[k][b] = (t[k - 1][b] >> 8) ^ t[0][t[k - 1][b] & 0xff];
  }
};

const Tables& tables() {
  static const Tables tabs;
  return tabs;
}

// Raw (no pre/post inversion) update, portable.
uint32_t update_portable(uint32_t c, const uint8_t* p, size_t n) {
  const auto& t = tables().t;
  while (n >= 8) {
    uint32_t lo, hi;
    std::memcpy(&lo, p, 4);
    std::memcpy(&hi, p + 4, 4);
    lo ^= c;  // little-endian hosts only (x86-64, aarch64)
    c = t[7][lo & 0xff] ^ t[6][(lo >> 8) & 0xff] ^ t[5][(lo >> 16) & 0xff] ^ t[4][lo >> 24] ^
        t[3][hi & 0xff] ^ t[2][(hi >> 8) & 0xff] ^ t[1][(hi >> 16) & 0xff] ^ t[0][hi >> 24];
    p += 8;
    n -= 8;
  }
  while (n--) c = (c >> 8) ^ t[0][(c ^ *p++) & 0xff];
  return c;
}


// a·b mod P in the reflected representation (bit 31 is x^0).
uint32_t mult_mod_p(uint32_t a, uint32_t b) {
  uint32_t m = 1u << 31, p = 0;
  for (;;) {
    if (a & m) {
      p ^= b;
      if ((a & (m - 1)) == 0) break;
    }
    m >>= 1;
    b = (b & 1) ? (b >> 1) ^ kPoly : b >> 1;
  }
  return p;
}

// x^(8·n) mod P: the operator "append n zero bytes".
uint32_t x8n_mod_p(uint64_t n) {
  static const std::array<uint32_t, 67> pow2 = [] {  // n < 2^64 needs k < 67
    std::array<uint32_t, 67> t{};
    t[0] = 1u << 30;  // x^1
    for (int k = 1; k < 67; ++k) t[k] = mult_mod_p(t[k - 1], t[k - 1]);  // x^(2^k)
    return t;
  }();
  uint32_t r = 1u << 31;  // x^0
  int k = 3;              // 8·n = n·2^3
  while (n) {
    if (n & 1) r = mult_mod_p(pow2[k], r);
    n >>= 1;
    ++k;
  }
  return r;
}

#if defined(__x86_64__)
// "Append n zero bytes" to a raw CRC register for one fixed n, as four byte
// tables (the operator is linear over GF(2)).
struct ShiftTable {
  std::array<std::array<uint32_t, 256>, 4> t{};
  explicit ShiftTable(uint64_t n) {
    const uint32_t k = x8n_mod_p(n);
    for (uint32_t b = 0; b < 256; ++b)
      for (int j = 0; j < 4; ++j) t[j][b] = mult_mod_p(k, b << (8 * j));
  }
  uint32_t operator()(uint32_t c) const {
    return t[0][c & 0xff] ^ t[1][(c >> 8) & 0xff] ^ t[2][(c >> 16) & 0xff] ^ t[3][c >> 24];
  }
};

// The crc32 instruction has a latency of 3 cycles and a throughput of 1: three
// independent streams over adjacent blocks run ~3x faster than one, and the
// three registers are joined with the shift tables (as crc32c_combine does).
constexpr size_t kStreamBlock = 8192;

__attribute__((target("sse4.2"))) uint32_t update_sse42(uint32_t c, const uint8_t* p, size_t n) {
  if (n >= 3 * kStreamBlock) {
    static const ShiftTable shift1(kStreamBlock), shift2(2 * kStreamBlock);
    while (n >= 3 * kStreamBlock) {
      uint64_t a = c, b = 0, d = 0;
      for (size_t i = 0; i < kStreamBlock; i += 8) {
        uint64_t va, vb, vd;
        std::memcpy(&va, p + i, 8);
        std::memcpy(&vb, p + kStreamBlock + i, 8);
        std::memcpy(&vd, p + 2 * kStreamBlock + i, 8);
        a = _mm_crc32_u64(a, va);
        b = _mm_crc32_u64(b, vb);
        d = _mm_crc32_u64(d, vd);
      }
      c = shift2(static_cast<uint32_t>(a)) ^ shift1(static_cast<uint32_t>(b)) ^ static_cast<uint32_t>(d);
      p += 3 * kStreamBlock;
      n -= 3 * kStreamBlock;
    }
  }
  uint64_t c64 = c;
  while (n >= 8) {
    uint64_t v;
    std::memcpy(&v, p, 8);
    c64 = _mm_crc32_u64(c64, v);
    p += 8;
    n -= 8;
  }
  uint32_t c32 = static_cast<uint32_t>(c64);
  while (n--) c32 = _mm_crc32_u8(c32, *p++);
  return c32;
}
bool have_sse42() {
  static const bool yes = __builtin_cpu_supports("sse4.2");
  return yes;
}
#endif

}  // namespace

uint32_t crc32c_extend(uint32_t crc, const void* data, size_t n) {
  const auto* p = static_cast<const uint8_t*>(data);
  uint32_t c = ~crc;
#if defined(__x86_64__)
  if (have_sse42()) return ~update_sse42(c, p, n);
#endif
  return ~update_portable(c, p, n);
}

uint32_t crc32c_combine(uint32_t crc_a, uint32_t crc_b, uint64_t len_b) {
  return mult_mod_p(x8n_mod_p(len_b), crc_a) ^ crc_b;
}

}  // namespace mpitron::io
