// tensor/rope.h — rotary position embeddings (Llama; Megatron's
// `--position-embedding-type rope`, `--rotary-base`, `--rotary-percent`).
//
// The "rotate_half" convention of HF's LlamaRotaryEmbedding / apply_rotary_pos_emb
// and Megatron-Core: dimension i of the rotated part pairs with i + R/2 (not the
// interleaved pairs (2i, 2i+1) of GPT-J / Megatron's --rotary-interleaved).
//
//   x, out: (B, T, H, D), contiguous. Typically the fused QKV viewed as
//           (B, T, NH + 2·G, HD) with rotate_heads = NH + G: the Q and K heads
//           rotate, the V heads pass through.
//   Heads [0, rotate_heads) rotate their first R = rope_rotary_dim(D, percent)
//   dims; every other element is copied (untouched when out aliases x).
//   With p = t + position_offset (t the index along T) and, for i < R/2,
//   θ_i = base^(−2i/R), c = cos(p·θ_i), s = sin(p·θ_i):
//     out[i]       = x[i]·c − x[i + R/2]·s
//     out[i + R/2] = x[i + R/2]·c + x[i]·s
// The angle p·θ_i and its cos/sin are computed in double, then rounded to f32
// (HF and Megatron round the angle to f32 first: they differ from us by about
// p·θ_i·2⁻²⁴ relative, which only shows at long positions); the rotation is f32
// math, rounded once to x's dtype.
//
// Frequency scaling (RopeScaling below; HF transformers' config.rope_scaling and
// ROPE_INIT_FUNCTIONS of modeling_rope_utils.py, as of 4.5x) replaces θ_i by
// rope_inv_freq(i, R, args) and multiplies c and s by a = rope_cos_sin_scale(args)
// (YaRN's attention_factor; 1 otherwise): the rotated dims of every rotated head are
// scaled by a (transformers multiplies cos and sin by it, so q·kᵀ grows by a²); the
// pass-through dims (partial rotary, V heads) are not. rope_inv_freq is the ONE
// definition the CPU and CUDA kernels (and the tests) evaluate, in double.
#pragma once
#include <cmath>
#include <cstdint>

#include "core/philox.h"  // MPT_HD
#include "tensor/tensor.h"

namespace mpitron {

// transformers' rope_type ("default", "linear", "dynamic", "llama3", "yarn").
enum class RopeScalingType : int32_t { None, Linear, Dynamic, Llama3, Yarn };

// The rope_scaling of a checkpoint's config. Every field is read only by the types
// named after it; the defaults (type None) leave RoPE exactly as without scaling.
struct RopeScaling {
  RopeScalingType type = RopeScalingType::None;
  double factor = 1.0;  // linear, dynamic, llama3, yarn: the context extension factor (>= 1).
                        // YaRN with original_max_position_embeddings in the config: transformers
                        // uses max_position_embeddings / original_max_position_embeddings instead
                        // of the config's factor (DeepSeek-V3): pass that.
  double low_freq_factor = 1.0;   // llama3 (Llama 3.1: 1)
  double high_freq_factor = 4.0;  // llama3 (Llama 3.1: 4); > low_freq_factor
  int64_t original_max_position_embeddings = 0;  // llama3: rope_scaling's (old_context_len); yarn:
                                                 // rope_scaling's, else the config's
                                                 // max_position_embeddings; dynamic: the config's
                                                 // max_position_embeddings. > 0 for those types.
  double beta_fast = 32.0;  // yarn: the correction range's fast and slow rotation counts
  double beta_slow = 1.0;   //   (transformers' defaults 32 and 1)
  bool truncate = true;     // yarn: floor/ceil the correction range (transformers' default; gpt-oss: false)
  double attention_factor = 0.0;  // yarn: cos and sin are multiplied by it; 0: derived as transformers
                                  // does, rope_yarn_attention_factor(factor, mscale, mscale_all_dim)
  double mscale = 0.0;            // yarn (DeepSeek configs): read only to derive attention_factor
  double mscale_all_dim = 0.0;    //   (0: absent)
  int64_t dynamic_seq_len = 0;    // dynamic (NTK): the sequence length L transformers' dynamic update
                                  // uses (its max position seen so far + 1); L <= original: unscaled
};

struct RopeArgs {
  double base = 10000.0;         // --rotary-base
  double percent = 1.0;          // --rotary-percent: the fraction of each head's dims that rotates
  int64_t position_offset = 0;   // the position of t = 0 (the first new token of a KV-cache decode step)
  RopeScaling scaling{};         // frequency scaling (none by default)
};

// YaRN's attention factor when the config gives none (transformers' get_mscale):
//   m(s, k) = rope_yarn_mscale(s, k) = s <= 1 ? 1 : 0.1·k·ln(s) + 1;
//   mscale and mscale_all_dim both nonzero: m(factor, mscale) / m(factor, mscale_all_dim)
//   (DeepSeek-V2/V3; 1 when they are equal), else m(factor, 1).
MPT_HD double rope_yarn_mscale(double s, double k) { return s <= 1.0 ? 1.0 : 0.1 * k * log(s) + 1.0; }
MPT_HD double rope_yarn_attention_factor(double factor, double mscale = 0.0, double mscale_all_dim = 0.0) {
  if (mscale != 0.0 && mscale_all_dim != 0.0)
    return rope_yarn_mscale(factor, mscale) / rope_yarn_mscale(factor, mscale_all_dim);
  return rope_yarn_mscale(factor, 1.0);
}

// The factor cos and sin are multiplied by: YaRN's attention factor, else 1.
MPT_HD double rope_cos_sin_scale(const RopeArgs& a) {
  const RopeScaling& s = a.scaling;
  if (s.type != RopeScalingType::Yarn) return 1.0;
  return s.attention_factor > 0.0 ? s.attention_factor
                                  : rope_yarn_attention_factor(s.factor, s.mscale, s.mscale_all_dim);
}

// θ_i, the inverse frequency of rotary pair i < R/2 (R the rotated dims), in double, as
// transformers' ROPE_INIT_FUNCTIONS[rope_type] computes inv_freq[i] (with dim = R):
//   none     base^(−2i/R)
//   linear   base^(−2i/R) / factor                      (positions / factor)
//   dynamic  b^(−2i/R), b = base·(factor·L/M − (factor − 1))^(R/(R − 2)) when L > M
//            (L = dynamic_seq_len, M = original_max_position_embeddings), else base
//   llama3   θ = base^(−2i/R), λ = 2π/θ; with lo = M/low_freq_factor, hi = M/high_freq_factor:
//            λ < hi: θ;  λ > lo: θ/factor;  else (1 − s)·θ/factor + s·θ, s = (M/λ − low)/(high − low)
//   yarn     e = base^(−2i/R) (extrapolation), n = e/factor (interpolation), r the linear ramp
//            clamp((i − l)/(h − l), 0, 1) (h += 0.001 when l = h) over the correction range
//            l = max(⌊d(beta_fast)⌋, 0), h = min(⌈d(beta_slow)⌉, R − 1) (no ⌊⌋/⌈⌉ unless
//            truncate), d(β) = R·ln(M/(2πβ)) / (2·ln base):  θ = n·r + e·(1 − r)
MPT_HD double rope_inv_freq(int64_t i, int64_t R, const RopeArgs& a) {
  const RopeScaling& s = a.scaling;
  const double e = -2.0 * static_cast<double>(i) / static_cast<double>(R);
  switch (s.type) {
    case RopeScalingType::None: break;
    case RopeScalingType::Linear: return pow(a.base, e) / s.factor;
    case RopeScalingType::Dynamic: {
      const double L = static_cast<double>(s.dynamic_seq_len), M = static_cast<double>(s.original_max_position_embeddings);
      if (L <= M) break;
      const double b = a.base * pow(s.factor * L / M - (s.factor - 1.0), static_cast<double>(R) / static_cast<double>(R - 2));
      return pow(b, e);
    }
    case RopeScalingType::Llama3: {
      const double th = pow(a.base, e), M = static_cast<double>(s.original_max_position_embeddings);
      const double wavelen = 2.0 * 3.14159265358979323846 / th;
      if (wavelen < M / s.high_freq_factor) return th;
      if (wavelen > M / s.low_freq_factor) return th / s.factor;
      const double sm = (M / wavelen - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor);
      return (1.0 - sm) * th / s.factor + sm * th;
    }
    case RopeScalingType::Yarn: {
      const double ext = pow(a.base, e), inter = ext / s.factor, M = static_cast<double>(s.original_max_position_embeddings);
      const double two_pi = 2.0 * 3.14159265358979323846, Rd = static_cast<double>(R);
      double lo = Rd * log(M / (s.beta_fast * two_pi)) / (2.0 * log(a.base));
      double hi = Rd * log(M / (s.beta_slow * two_pi)) / (2.0 * log(a.base));
      if (s.truncate) lo = floor(lo), hi = ceil(hi);
      lo = lo > 0.0 ? lo : 0.0;
      hi = hi < Rd - 1.0 ? hi : Rd - 1.0;
      if (lo == hi) hi += 0.001;
      double r = (static_cast<double>(i) - lo) / (hi - lo);
      r = r < 0.0 ? 0.0 : r > 1.0 ? 1.0 : r;
      return inter * r + ext * (1.0 - r);
    }
  }
  return pow(a.base, e);
}

// R = int(head_dim · percent), as Megatron computes it; it must be even and > 0
// (the ops throw otherwise, naming --rotary-percent).
int64_t rope_rotary_dim(int64_t head_dim, double percent);

void rope_forward(const Tensor& x, const Tensor& out, int64_t rotate_heads, const RopeArgs& args,
                  Stream s = Stream());
// dx (B, T, H, D) = the transpose of the forward map applied to dout (out = a·R(p)·x, so
// dx = a·R(p)ᵀ·dout = a·R(−p)·dout, a = rope_cos_sin_scale(args) on the rotated dims);
// pass-through elements are copied. Overwritten; dx may alias dout.
void rope_backward(const Tensor& dout, const Tensor& dx, int64_t rotate_heads, const RopeArgs& args,
                   Stream s = Stream());

}  // namespace mpitron
