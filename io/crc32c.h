// io/crc32c.h — CRC-32C (Castagnoli), the checksum of checkpoints and TFRecords.
//
// The standard CRC-32C (iSCSI, ext4, TFRecord): reflected polynomial 0x82F63B78,
// initial value and final xor 0xFFFFFFFF. crc32c("123456789") == 0xE3069283.
// crc32c_combine joins the CRCs of two adjacent byte ranges without the bytes,
// which makes a dataset's checksum independent of how ranks split it.
#pragma once
#include <cstddef>
#include <cstdint>

namespace mpitron::io {

// CRC of `n` bytes appended to a message whose CRC is `crc` (0 for the empty message).
uint32_t crc32c_extend(uint32_t crc, const void* data, size_t n);
inline uint32_t crc32c(const void* data, size_t n) { return crc32c_extend(0, data, n); }

// CRC of A||B given crc(A), crc(B) and the length of B in bytes.
uint32_t crc32c_combine(uint32_t crc_a, uint32_t crc_b, uint64_t len_b);

// TFRecord's masked CRC: rotate right by 15 and add a constant.
inline uint32_t crc32c_masked(uint32_t crc) { return ((crc >> 15) | (crc << 17)) + 0xa282ead8u; }

}  // namespace mpitron::io
