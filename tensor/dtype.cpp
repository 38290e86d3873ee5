#include "tensor/dtype.h"

#include "core/error.h"

namespace mpitron {

size_t dtype_size(DType t) {
  switch (t) {
    case DType::F32: return 4;
    case DType::BF16: return 2;
    case DType::F16: return 2;
    case DType::I32: return 4;
    case DType::I64: return 8;
    case DType::U16: return 2;
  }
  MPT_THROW(str("unknown dtype code ", static_cast<int>(t)), "");
}

const char* dtype_name(DType t) {
  switch (t) {
    case DType::F32: return "f32";
    case DType::BF16: return "bf16";
    case DType::F16: return "f16";
    case DType::I32: return "i32";
    case DType::I64: return "i64";
    case DType::U16: return "u16";
  }
  return "?";
}

DType dtype_from_name(const std::string& n) {
  if (n == "f32" || n == "float32" || n == "fp32") return DType::F32;
  if (n == "bf16" || n == "bfloat16") return DType::BF16;
  if (n == "f16" || n == "fp16" || n == "float16") return DType::F16;
  if (n == "i32" || n == "int32") return DType::I32;
  if (n == "i64" || n == "int64") return DType::I64;
  if (n == "u16" || n == "uint16") return DType::U16;
  MPT_THROW(str("unknown dtype name '", n, "'"), "use one of f32, bf16, f16, i32, i64, u16");
}

void throw_not_floating(const char* what, DType t) {
  MPT_THROW(str(what, ": dtype ", dtype_name(t), " is not a floating type (f32, bf16, f16)"), "");
}

float f16_to_f32(f16_t h) {
  const uint32_t sign = (h.bits & 0x8000u) << 16;
  uint32_t exp = (h.bits >> 10) & 0x1f, mant = h.bits & 0x3ffu, u;
  if (exp == 0) {
    if (mant == 0) {
      u = sign;
    } else {  // subnormal: normalise
      exp = 127 - 15 + 1;
      while (!(mant & 0x400u)) { mant <<= 1; --exp; }
      mant &= 0x3ffu;
      u = sign | (exp << 23) | (mant << 13);
    }
  } else if (exp == 31) {
    u = sign | 0x7f800000u | (mant << 13);
  } else {
    u = sign | ((exp + 127 - 15) << 23) | (mant << 13);
  }
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

f16_t f32_to_f16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  const uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
  const uint32_t absu = u & 0x7fffffffu;
  if (absu > 0x7f800000u) return f16_t{static_cast<uint16_t>(sign | 0x7e00u)};  // NaN
  if (absu >= 0x477ff000u) return f16_t{static_cast<uint16_t>(sign | 0x7c00u)};  // overflow -> Inf
  if (absu < 0x38800000u) {  // result is subnormal or zero in f16
    if (absu < 0x33000000u) return f16_t{sign};  // below half the smallest subnormal
    const uint32_t exp = absu >> 23, mant = (absu & 0x7fffffu) | 0x800000u;
    const int shift = 126 - static_cast<int>(exp);  // value = mant * 2^(exp-150) = r * 2^-24
    uint32_t r = mant >> shift;
    const uint32_t rem = mant & ((1u << shift) - 1), half = 1u << (shift - 1);
    if (rem > half || (rem == half && (r & 1u))) ++r;
    return f16_t{static_cast<uint16_t>(sign | r)};
  }
  uint32_t r = absu - 0x38000000u;  // rebias exponent 127 -> 15
  const uint32_t rem = r & 0x1fffu;
  r >>= 13;
  if (rem > 0x1000u || (rem == 0x1000u && (r & 1u))) ++r;
  return f16_t{static_cast<uint16_t>(sign | r)};
}

}  // namespace mpitron
