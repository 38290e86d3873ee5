// tests/cuda_sim/include/cuda_bf16.h — __nv_bfloat16 for the simulated device:
// the same 16 bits as mpitron's bf16_t, converted with mpitron's (round to nearest even).
#pragma once
#include "cuda_runtime.h"
#include "tensor/dtype.h"

struct __nv_bfloat16 {
  uint16_t bits;
};
inline float __bfloat162float(__nv_bfloat16 v) { return ::mpitron::bf16_to_f32(::mpitron::bf16_t{v.bits}); }
inline __nv_bfloat16 __float2bfloat16_rn(float f) { return __nv_bfloat16{::mpitron::f32_to_bf16(f).bits}; }
inline __nv_bfloat16 __float2bfloat16(float f) { return __float2bfloat16_rn(f); }
