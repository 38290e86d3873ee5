// io/torch_dtype.h — the element types a torch.save file can hold, and their
// conversion to f32.
//
// A storage's type comes from the persistent id's storage class
// (torch.FloatStorage, torch.BFloat16Storage, ...); torch >= 2.1 saves the
// float8 types (and any type without a typed storage class) as
// torch.storage.UntypedStorage (bytes) with the dtype passed to
// torch._utils._rebuild_tensor_v3 (torch.float8_e4m3fn, ...).
//
// Conversion to f32 (into a caller buffer, `n` elements of `src` bytes):
//   f32 copied; f64 rounded to nearest; f16/bf16 widened exactly;
//   f8 e4m3fn (OCP 8-bit: 1 sign, 4 exponent (bias 7), 3 mantissa, no
//   infinities, S.1111.111 is NaN, max 448) and f8 e5m2 (IEEE-like: bias 15,
//   infinities and NaNs) widened exactly; bool and the integer types as
//   their value (i32/i64 rounded to nearest above 2^24). Complex types are
//   read but not converted (an error says so).
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

namespace mpitron::io {

enum class TorchDType : uint8_t {
  F32,
  F64,
  F16,
  BF16,
  F8_E4M3FN,
  F8_E5M2,
  BOOL,
  U8,
  I8,
  I16,
  I32,
  I64,
  C64,
  C128,
  U16,
  U32,
  U64,  // torch >= 2.3's unsigned types (UntypedStorage + _rebuild_tensor_v3)
};

size_t torch_dtype_size(TorchDType t);
// torch's own spelling without "torch.": "float32", "bfloat16", "float8_e4m3fn", "bool", ...
const char* torch_dtype_name(TorchDType t);
// From a storage class name ("torch.BFloat16Storage", also torch.cuda.*Storage); false if not one.
bool torch_dtype_from_storage(const std::string& global, TorchDType& out);
// From a dtype value's global name ("torch.float32", "torch.float", "torch.half", ...); false if not one.
bool torch_dtype_from_global(const std::string& global, TorchDType& out);
bool torch_dtype_is_floating(TorchDType t);
// The typed storage class torch.save names for t ("FloatStorage"), or nullptr when t has none.
const char* torch_dtype_storage(TorchDType t);

// Exact widening of one 8-bit float.
float f8_e4m3fn_to_f32(uint8_t bits);
float f8_e5m2_to_f32(uint8_t bits);

// n elements of type t at src (little-endian, any alignment) -> n floats at dst.
void torch_dtype_to_f32(TorchDType t, const void* src, float* dst, size_t n);

}  // namespace mpitron::io
