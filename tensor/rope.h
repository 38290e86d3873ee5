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
#pragma once
#include <cstdint>

#include "tensor/tensor.h"

namespace mpitron {

struct RopeArgs {
  double base = 10000.0;         // --rotary-base
  double percent = 1.0;          // --rotary-percent: the fraction of each head's dims that rotates
  int64_t position_offset = 0;   // the position of t = 0 (the first new token of a KV-cache decode step)
};

// R = int(head_dim · percent), as Megatron computes it; it must be even and > 0
// (the ops throw otherwise, naming --rotary-percent).
int64_t rope_rotary_dim(int64_t head_dim, double percent);

void rope_forward(const Tensor& x, const Tensor& out, int64_t rotate_heads, const RopeArgs& args,
                  Stream s = Stream());
// dx (B, T, H, D) = the inverse rotation of dout (out = R(p)·x, so dx = R(p)ᵀ·dout = R(−p)·dout);
// pass-through elements are copied. Overwritten; dx may alias dout.
void rope_backward(const Tensor& dout, const Tensor& dx, int64_t rotate_heads, const RopeArgs& args,
                   Stream s = Stream());

}  // namespace mpitron
