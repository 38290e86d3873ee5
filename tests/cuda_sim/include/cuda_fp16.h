// tests/cuda_sim/include/cuda_fp16.h — __half for the simulated device:
// the same 16 bits as mpitron's f16_t, converted with mpitron's (round to nearest even).
#pragma once
#include "cuda_runtime.h"
#include "tensor/dtype.h"

struct __half {
  uint16_t bits;
};
inline float __half2float(__half v) { return ::mpitron::f16_to_f32(::mpitron::f16_t{v.bits}); }
inline __half __float2half_rn(float f) { return __half{::mpitron::f32_to_f16(f).bits}; }
inline __half __float2half(float f) { return __float2half_rn(f); }
