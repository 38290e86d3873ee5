// tensor/dtype.h — element types and host-side bf16/f16 conversion.
//
// bf16 and f16 are stored as raw 16-bit patterns (`bf16_t`, `f16_t`), binary
// compatible with CUDA's __nv_bfloat16 and __half. Conversion from f32 rounds
// to nearest even; NaN stays NaN; overflow in f16 gives ±Inf.
#pragma once
#include <cstdint>
#include <cstring>
#include <string>

namespace mpitron {

enum class DType : uint8_t { F32 = 0, BF16 = 1, F16 = 2, I32 = 3, I64 = 4, U16 = 5 };
constexpr int kNumDTypes = 6;

size_t dtype_size(DType t);
const char* dtype_name(DType t);
DType dtype_from_name(const std::string& name);  // "f32"/"float32", "bf16", "f16"/"fp16", "i32", "i64", "u16"
inline bool is_floating(DType t) { return t == DType::F32 || t == DType::BF16 || t == DType::F16; }

struct bf16_t { uint16_t bits; };
struct f16_t { uint16_t bits; };

inline float bf16_to_f32(bf16_t h) {
  uint32_t u = static_cast<uint32_t>(h.bits) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

inline bf16_t f32_to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return bf16_t{static_cast<uint16_t>((u >> 16) | 0x40)};  // quiet NaN
  u += 0x7fffu + ((u >> 16) & 1u);  // round to nearest even
  return bf16_t{static_cast<uint16_t>(u >> 16)};
}

float f16_to_f32(f16_t h);
f16_t f32_to_f16(float f);

// Generic load/store through float for the CPU kernels.
template <typename T> inline float to_f32(T v) { return static_cast<float>(v); }
template <> inline float to_f32<bf16_t>(bf16_t v) { return bf16_to_f32(v); }
template <> inline float to_f32<f16_t>(f16_t v) { return f16_to_f32(v); }
template <typename T> inline T from_f32(float v) { return static_cast<T>(v); }
template <> inline bf16_t from_f32<bf16_t>(float v) { return f32_to_bf16(v); }
template <> inline f16_t from_f32<f16_t>(float v) { return f32_to_f16(v); }

template <typename T> struct dtype_of;
template <> struct dtype_of<float> { static constexpr DType value = DType::F32; };
template <> struct dtype_of<bf16_t> { static constexpr DType value = DType::BF16; };
template <> struct dtype_of<f16_t> { static constexpr DType value = DType::F16; };
template <> struct dtype_of<int32_t> { static constexpr DType value = DType::I32; };
template <> struct dtype_of<int64_t> { static constexpr DType value = DType::I64; };
template <> struct dtype_of<uint16_t> { static constexpr DType value = DType::U16; };

}  // namespace mpitron

// Call fn(T{}) with T the C++ type of a floating dtype (float, bf16_t, f16_t):
//   dispatch_float(t.dtype(), "gelu", [&](auto tag) { using T = decltype(tag); ... });
// A function, not a macro, so OpenMP pragmas inside the lambda work.
namespace mpitron {
[[noreturn]] void throw_not_floating(const char* what, DType t);
template <typename F>
decltype(auto) dispatch_float(DType t, const char* what, F&& f) {
  switch (t) {
    case DType::F32: return f(float{});
    case DType::BF16: return f(bf16_t{});
    case DType::F16: return f(f16_t{});
    default: throw_not_floating(what, t);
  }
}
}  // namespace mpitron
