// tensor/fp8_format.h — the two OCP 8-bit floating-point formats (OCP 8-bit Floating Point
// Specification (OFP8) 1.0), encoded and decoded the same way on the host and in CUDA kernels.
//
//   E4M3 ("fn": finite, no infinities): bias 7, max ±448, min normal 2^-6, subnormals m/8·2^-6;
//        S.1111.111 is NaN (no other NaN, no Inf).
//   E5M2: IEEE-like: bias 15, max ±57344, subnormals m/4·2^-14, exponent 31 = Inf (m 0) / NaN.
//
// Encoding rounds to nearest, ties to even, on the format's infinitely wide exponent range,
// then handles what lies beyond the largest finite value:
//   saturate = false (OCP's non-saturating mode): a value that rounds past max, or Inf, gives NaN
//                    (E4M3) or ±Inf (E5M2) — PyTorch 2.x's tensor.to(torch.float8_e5m2);
//   saturate = true  (the quantiser's cast, cuda_fp8's __NV_SATFINITE): ±max, Inf included —
//                    PyTorch 2.x's tensor.to(torch.float8_e4m3fn), which saturates.
// NaN stays NaN (its sign kept: 0x7F / 0xFF). Values below the smallest subnormal's half round
// to ±0 (the sign kept).
#pragma once
#include <cstdint>
#include <cmath>
#include <cstring>

#include "core/philox.h"  // MPT_HD

namespace mpitron {

enum class Fp8Format : uint8_t { E4M3, E5M2 };

struct Fp8Spec {
  int mant_bits;    // 3 (E4M3) / 2 (E5M2)
  int bias;         // 7 / 15
  float max;        // 448 / 57344
  uint8_t max_code; // 0x7E / 0x7B
  uint8_t nan_code; // 0x7F / 0x7F
  bool has_inf;     // false / true (0x7C)
};

MPT_HD Fp8Spec fp8_spec(Fp8Format f) {
  return f == Fp8Format::E4M3 ? Fp8Spec{3, 7, 448.0f, 0x7E, 0x7F, false} : Fp8Spec{2, 15, 57344.0f, 0x7B, 0x7F, true};
}

MPT_HD uint32_t fp8_f32_bits(float x) {
  uint32_t u;
  memcpy(&u, &x, 4);
  return u;
}
MPT_HD float fp8_bits_f32(uint32_t u) {
  float x;
  memcpy(&x, &u, 4);
  return x;
}

// 2^e as a float, for e in [-126, 127] (built from its bits: exact, no library call).
MPT_HD float fp8_pow2(int e) { return fp8_bits_f32(static_cast<uint32_t>(e + 127) << 23); }

// Rounds a float to the nearest integer, ties to even (rintf in the default rounding mode).
MPT_HD float fp8_round_half_even(float v) { return rintf(v); }

MPT_HD uint8_t fp8_encode(float x, Fp8Format f, bool saturate) {
  const Fp8Spec s = fp8_spec(f);
  const uint32_t u = fp8_f32_bits(x);
  const uint8_t sign = static_cast<uint8_t>((u >> 24) & 0x80);
  const uint32_t a = u & 0x7FFFFFFFu;
  if (a > 0x7F800000u) return static_cast<uint8_t>(sign | s.nan_code);  // NaN
  const uint8_t overflow =
      saturate ? s.max_code : (s.has_inf ? static_cast<uint8_t>(0x7C) : s.nan_code);
  if (a == 0x7F800000u) return static_cast<uint8_t>(sign | overflow);  // Inf
  const float v = fp8_bits_f32(a);
  // The spacing of the format around v: 2^(e - M) for a normal exponent e, the subnormal
  // spacing 2^(1 - bias - M) below the smallest normal 2^(1 - bias).
  const int emin = 1 - s.bias;
  int e = static_cast<int>(a >> 23) - 127;  // f32 subnormals: e = -127, far below emin
  if (e < emin) e = emin;
  if (e > 30) return static_cast<uint8_t>(sign | overflow);  // beyond 2^31: far past either max
  const int q_exp = e - s.mant_bits;
  // v / 2^q_exp and back are exact (power-of-two scalings of an f32 that stays normal or is
  // an f32 subnormal scaled up); r < 2^(M+1) + 1.
  const float r = fp8_round_half_even(v * fp8_pow2(-q_exp));
  const float rounded = r * fp8_pow2(q_exp);
  if (rounded > s.max) return static_cast<uint8_t>(sign | overflow);
  const int ri = static_cast<int>(r);
  if (ri == 0) return sign;
  const int one = 1 << s.mant_bits;  // the implicit leading 1 at this spacing
  int exp_field, mant;
  if (ri < one) {  // subnormal (only possible at e == emin)
    exp_field = 0;
    mant = ri;
  } else if (ri == 2 * one) {  // rounded up to the next binade
    exp_field = e + 1 + s.bias;
    mant = 0;
  } else {
    exp_field = e + s.bias;
    mant = ri - one;
  }
  return static_cast<uint8_t>(sign | (exp_field << s.mant_bits) | mant);
}

MPT_HD float fp8_decode(uint8_t b, Fp8Format f) {
  const Fp8Spec s = fp8_spec(f);
  const float sign = (b & 0x80) ? -1.0f : 1.0f;
  const int m = b & ((1 << s.mant_bits) - 1);
  const int ef = (b & 0x7F) >> s.mant_bits;
  const int emax_field = (1 << (7 - s.mant_bits)) - 1;
  if (s.has_inf && ef == emax_field)
    return m == 0 ? sign * fp8_bits_f32(0x7F800000u) : fp8_bits_f32(0x7FC00000u | ((b & 0x80u) << 24));
  if (!s.has_inf && (b & 0x7F) == s.nan_code) return fp8_bits_f32(0x7FC00000u | ((b & 0x80u) << 24));
  const float mf = static_cast<float>(m);
  if (ef == 0) return sign * mf * fp8_pow2(1 - s.bias - s.mant_bits);
  return sign * (static_cast<float>(1 << s.mant_bits) + mf) * fp8_pow2(ef - s.bias - s.mant_bits);
}

// The quantiser's round trip: x·scale cast with saturation, decoded, divided by scale.
MPT_HD float fp8_quantize_dequantize(float x, float scale, float inv_scale, Fp8Format f) {
  return fp8_decode(fp8_encode(x * scale, f, true), f) * inv_scale;
}

}  // namespace mpitron
