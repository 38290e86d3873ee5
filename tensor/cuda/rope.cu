// tensor/cuda/rope.cu — rotary position embeddings, forward and backward (rotate_half pairs).
//
//   x, out (B, T, H, D); heads [0, rotate_heads) rotate dims [0, R), pairs (i, i + R/2).
// rope_rotate_kernel: one thread per (token, i < R/2) computes a·cos and a·sin of p·θ_i
// once (in double; θ_i = rope_inv_freq, a = rope_cos_sin_scale, the CPU kernel's very
// functions: rope.h) and rotates that pair in every rotated head of the token;
// consecutive threads take consecutive i, so each head's loads are coalesced. A
// thread reads and writes only its own pairs, so out may alias x.
// rope_copy_kernel: when out is not x, copies the elements that do not rotate.
// Backward is the same rotation with sin negated (sign = −1).
#include "tensor/cuda/common.cuh"
#include "tensor/cuda/ops.h"

namespace mpitron::cuda {

namespace {
template <typename T>
__global__ void rope_rotate_kernel(const T* x, T* out, int64_t tokens, int t_len, int heads, int head_dim,
                                   int rotate_heads, int half, RopeArgs args, double scale, float sign) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t k = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; k < tokens * half; k += stride) {
    const int64_t tok = k / half;
    const int i = static_cast<int>(k - tok * half);
    const double theta = rope_inv_freq(i, 2 * half, args);  // base^(−2i/R) unless scaled (rope.h)
    const double ang = static_cast<double>(tok % t_len + args.position_offset) * theta;
    double sd, cd;
    sincos(ang, &sd, &cd);
    const float c = static_cast<float>(cd * scale), s = sign * static_cast<float>(sd * scale);
    const int64_t row = tok * heads * head_dim;
    for (int h = 0; h < rotate_heads; ++h) {
      const int64_t o = row + static_cast<int64_t>(h) * head_dim + i;
      const float a = to_float(x[o]), b = to_float(x[o + half]);
      out[o] = from_float<T>(a * c - b * s);
      out[o + half] = from_float<T>(b * c + a * s);
    }
  }
}

// Element e of (tokens, H, D) does not rotate when its head is ≥ rotate_heads or its dim ≥ R.
template <typename T>
__global__ void rope_copy_kernel(const T* x, T* out, int64_t n, int heads, int head_dim, int rotate_heads,
                                 int rot_dim) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t e = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; e < n; e += stride) {
    const int d = static_cast<int>(e % head_dim);
    const int h = static_cast<int>((e / head_dim) % heads);
    if (h >= rotate_heads || d >= rot_dim) out[e] = x[e];
  }
}

void rope_apply(const Tensor& x, const Tensor& out, int64_t rotate_heads, const RopeArgs& args, float sign,
                Stream s, const char* what) {
  DeviceGuard g(x);
  const int64_t B = x.dim(0), T = x.dim(1), H = x.dim(2), D = x.dim(3);
  const int64_t R = rope_rotary_dim(D, args.percent), half = R / 2;
  const int64_t tokens = B * T;
  if (tokens * H * D == 0) return;
  constexpr int kThreads = 256;
  const cudaStream_t st = stream_of(s);
  MPT_DISPATCH_DEV_FLOAT(x.dtype(), what, [&](auto tag) {
    using T_ = decltype(tag);
    const T_* px = static_cast<const T_*>(x.data_ptr());
    T_* po = static_cast<T_*>(out.data_ptr());
    if (rotate_heads > 0) {
      MPT_LAUNCH(grid_for(tokens * half, kThreads), kThreads, 0, st, rope_rotate_kernel<T_>)(
          px, po, tokens, static_cast<int>(T), static_cast<int>(H), static_cast<int>(D),
          static_cast<int>(rotate_heads), static_cast<int>(half), args, rope_cos_sin_scale(args), sign);
      MPT_KERNEL_CHECK(str(what, " (rotate)").c_str());
    }
    if (px != po && (rotate_heads < H || R < D)) {
      MPT_LAUNCH(grid_for(tokens * H * D, kThreads), kThreads, 0, st, rope_copy_kernel<T_>)(
          px, po, tokens * H * D, static_cast<int>(H), static_cast<int>(D), static_cast<int>(rotate_heads),
          static_cast<int>(R));
      MPT_KERNEL_CHECK(str(what, " (copy)").c_str());
    }
  });
}
}  // namespace

void rope_forward(const Tensor& x, const Tensor& out, int64_t rotate_heads, const RopeArgs& args, Stream s) {
  rope_apply(x, out, rotate_heads, args, 1.0f, s, "rope_forward");
}

void rope_backward(const Tensor& dout, const Tensor& dx, int64_t rotate_heads, const RopeArgs& args, Stream s) {
  rope_apply(dout, dx, rotate_heads, args, -1.0f, s, "rope_backward");
}

}  // namespace mpitron::cuda
