#include "io/torch_dtype.h"

#include <cmath>
#include <cstring>
#include <limits>

#include "core/error.h"
#include "tensor/dtype.h"
#include "tensor/fp8_format.h"

namespace mpitron::io {

namespace {
struct DTypeRow {
  TorchDType t;
  size_t size;
  const char* name;     // torch.<name>
  const char* storage;  // torch.<storage> (nullptr: only via UntypedStorage + _rebuild_tensor_v3)
  const char* alias;    // another torch.<alias> for the same dtype (nullptr: none)
  bool floating;
};
constexpr DTypeRow kRows[] = {
    {TorchDType::F32, 4, "float32", "FloatStorage", "float", true},
    {TorchDType::F64, 8, "float64", "DoubleStorage", "double", true},
    {TorchDType::F16, 2, "float16", "HalfStorage", "half", true},
    {TorchDType::BF16, 2, "bfloat16", "BFloat16Storage", nullptr, true},
    {TorchDType::F8_E4M3FN, 1, "float8_e4m3fn", nullptr, nullptr, true},
    {TorchDType::F8_E5M2, 1, "float8_e5m2", nullptr, nullptr, true},
    {TorchDType::BOOL, 1, "bool", "BoolStorage", nullptr, false},
    {TorchDType::U8, 1, "uint8", "ByteStorage", nullptr, false},
    {TorchDType::I8, 1, "int8", "CharStorage", nullptr, false},
    {TorchDType::I16, 2, "int16", "ShortStorage", "short", false},
    {TorchDType::I32, 4, "int32", "IntStorage", "int", false},
    {TorchDType::I64, 8, "int64", "LongStorage", "long", false},
    {TorchDType::C64, 8, "complex64", "ComplexFloatStorage", "cfloat", false},
    {TorchDType::C128, 16, "complex128", "ComplexDoubleStorage", "cdouble", false},
    {TorchDType::U16, 2, "uint16", nullptr, nullptr, false},
    {TorchDType::U32, 4, "uint32", nullptr, nullptr, false},
    {TorchDType::U64, 8, "uint64", nullptr, nullptr, false},
};
static_assert(sizeof(kRows) / sizeof(kRows[0]) == static_cast<size_t>(TorchDType::U64) + 1);

const DTypeRow& row(TorchDType t) { return kRows[static_cast<size_t>(t)]; }

std::string strip_torch(const std::string& g, const char* prefix) {
  const size_t n = std::strlen(prefix);
  return g.compare(0, n, prefix) == 0 ? g.substr(n) : std::string();
}

template <typename T>
void widen(const void* src, float* dst, size_t n) {
  const auto* b = static_cast<const uint8_t*>(src);
  for (size_t i = 0; i < n; ++i) {
    T v;
    std::memcpy(&v, b + i * sizeof(T), sizeof(T));
    dst[i] = static_cast<float>(v);
  }
}
}  // namespace

size_t torch_dtype_size(TorchDType t) { return row(t).size; }
const char* torch_dtype_name(TorchDType t) { return row(t).name; }
bool torch_dtype_is_floating(TorchDType t) { return row(t).floating; }
const char* torch_dtype_storage(TorchDType t) { return row(t).storage; }

bool torch_dtype_from_storage(const std::string& global, TorchDType& out) {
  std::string s = strip_torch(global, "torch.cuda.");
  if (s.empty()) s = strip_torch(global, "torch.");
  if (s.empty()) return false;
  for (const DTypeRow& r : kRows)
    if (r.storage && s == r.storage) {
      out = r.t;
      return true;
    }
  return false;
}

bool torch_dtype_from_global(const std::string& global, TorchDType& out) {
  const std::string s = strip_torch(global, "torch.");
  if (s.empty()) return false;
  for (const DTypeRow& r : kRows)
    if (s == r.name || (r.alias && s == r.alias)) {
      out = r.t;
      return true;
    }
  return false;
}

// OCP FP8 (tensor/fp8_format.h: the quantiser's codec, checked against PyTorch's float8 types).
float f8_e4m3fn_to_f32(uint8_t bits) { return fp8_decode(bits, Fp8Format::E4M3); }
float f8_e5m2_to_f32(uint8_t bits) { return fp8_decode(bits, Fp8Format::E5M2); }

void torch_dtype_to_f32(TorchDType t, const void* src, float* dst, size_t n) {
  const auto* b = static_cast<const uint8_t*>(src);
  switch (t) {
    case TorchDType::F32: std::memcpy(dst, src, n * 4); return;
    case TorchDType::F64: widen<double>(src, dst, n); return;
    case TorchDType::F16:
    case TorchDType::BF16:
      for (size_t i = 0; i < n; ++i) {
        uint16_t h;
        std::memcpy(&h, b + 2 * i, 2);
        dst[i] = t == TorchDType::F16 ? f16_to_f32(f16_t{h}) : bf16_to_f32(bf16_t{h});
      }
      return;
    case TorchDType::F8_E4M3FN:
      for (size_t i = 0; i < n; ++i) dst[i] = f8_e4m3fn_to_f32(b[i]);
      return;
    case TorchDType::F8_E5M2:
      for (size_t i = 0; i < n; ++i) dst[i] = f8_e5m2_to_f32(b[i]);
      return;
    case TorchDType::BOOL:
      for (size_t i = 0; i < n; ++i) dst[i] = b[i] ? 1.0f : 0.0f;
      return;
    case TorchDType::U8: widen<uint8_t>(src, dst, n); return;
    case TorchDType::I8: widen<int8_t>(src, dst, n); return;
    case TorchDType::I16: widen<int16_t>(src, dst, n); return;
    case TorchDType::I32: widen<int32_t>(src, dst, n); return;
    case TorchDType::I64: widen<int64_t>(src, dst, n); return;
    case TorchDType::U16: widen<uint16_t>(src, dst, n); return;
    case TorchDType::U32: widen<uint32_t>(src, dst, n); return;
    case TorchDType::U64: widen<uint64_t>(src, dst, n); return;
    case TorchDType::C64:
    case TorchDType::C128: break;
  }
  MPT_THROW(str("a ", torch_dtype_name(t), " tensor has no f32 conversion"),
            "read its raw bytes (read_raw) and take the real and imaginary parts yourself");
}

}  // namespace mpitron::io
