// tensor/cuda/gelu_math.h — the GELU (tanh approximation) formula of the CUDA
// kernels, as __host__ __device__ functions so a CPU test checks the very
// arithmetic the GPU runs (tests/tensor/test_gelu.cpp, against float64).
//
// With u = √(2/π)(x + 0.044715x³) and s = sigmoid(2u) = (1 + tanh u)/2:
//   gelu(x)  = x·s
//   gelu'(x) = s + 2·x·s·(1 − s)·du/dx,   du/dx = √(2/π)(1 + 3·0.044715x²)
// The textbook 0.5·x·(1 + tanh u) cancels for x below about −3 (tanh u → −1
// and 1 + tanh u keeps only a few correct bits; at x ≈ −6 it is exactly 0);
// x·sigmoid(2u) keeps full relative precision there. Same form as tensor/cpu/gelu.cpp.
//
// The exact GELU (gelu_erf, HF BERT's "gelu"), with Φ the normal CDF and φ its density:
//   gelu_erf(x)  = x·Φ(x),   Φ(x) = erfc(−x/√2)/2
//   gelu_erf'(x) = Φ(x) + x·φ(x),   φ(x) = e^(−x²/2)/√(2π)
// erfc rather than 1 + erf(x/√2), which cancels for negative x as 1 + tanh u does.
#pragma once
#include <cmath>

#if defined(__CUDACC__)
#define MPT_HOST_DEVICE __host__ __device__ __forceinline__
#else
#define MPT_HOST_DEVICE inline
#endif

namespace mpitron::gelu_math {

constexpr float kK = 0.7978845608028654f;  // √(2/π)
constexpr float kC = 0.044715f;

// sigmoid(2u) = 1 / (1 + e^(−2u)); e^(−2u) = +Inf for very negative x gives s = 0, gelu = −0.
MPT_HOST_DEVICE float sigmoid2u(float x) {
  const float u = kK * (x + kC * x * x * x);
  return 1.0f / (1.0f + expf(-2.0f * u));
}

MPT_HOST_DEVICE float gelu(float x) { return x * sigmoid2u(x); }

MPT_HOST_DEVICE float gelu_grad(float x) {
  const float s = sigmoid2u(x);
  const float du = kK * (1.0f + 3.0f * kC * x * x);
  return s + 2.0f * x * s * (1.0f - s) * du;
}

constexpr float kInvSqrt2 = 0.7071067811865476f;     // 1/√2
constexpr float kInvSqrt2Pi = 0.3989422804014327f;   // 1/√(2π)

MPT_HOST_DEVICE float normal_cdf(float x) { return 0.5f * erfcf(-kInvSqrt2 * x); }

MPT_HOST_DEVICE float gelu_erf(float x) { return x * normal_cdf(x); }

MPT_HOST_DEVICE float gelu_erf_grad(float x) { return normal_cdf(x) + x * kInvSqrt2Pi * expf(-0.5f * x * x); }

}  // namespace mpitron::gelu_math
