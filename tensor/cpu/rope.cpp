// tensor/cpu/rope.cpp — rotary position embeddings, forward and backward (rotate_half pairs).
//
// A (T, R/2) table of a·cos/a·sin (θ_i = rope_inv_freq, a = rope_cos_sin_scale: rope.h;
// computed in double, stored as f32) serves every batch entry and head; tokens run in
// parallel, each rotating its heads pair by pair (so out may alias x). Backward is the
// same rotation with sin negated (the transpose, a included).
#include <cmath>

#include "tensor/cpu/common.h"
#include "tensor/cpu/ops.h"

namespace mpitron::cpu {

namespace {

void rope_apply(const Tensor& x, const Tensor& out, int64_t rotate_heads, const RopeArgs& args, float sign,
                const char* what) {
  const int64_t B = x.dim(0), T = x.dim(1), H = x.dim(2), D = x.dim(3);
  const int64_t R = rope_rotary_dim(D, args.percent), half = R / 2;
  std::vector<double> theta(static_cast<size_t>(half));
  for (int64_t i = 0; i < half; ++i) theta[static_cast<size_t>(i)] = rope_inv_freq(i, R, args);
  const double scale = rope_cos_sin_scale(args);  // YaRN's attention factor, else 1
  std::vector<float> cs(static_cast<size_t>(T * half)), sn(static_cast<size_t>(T * half));
#pragma omp parallel for schedule(static) if (T * half > 4096)
  for (int64_t t = 0; t < T; ++t)
    for (int64_t i = 0; i < half; ++i) {
      const double ang = static_cast<double>(t + args.position_offset) * theta[static_cast<size_t>(i)];
      cs[static_cast<size_t>(t * half + i)] = static_cast<float>(std::cos(ang) * scale);
      sn[static_cast<size_t>(t * half + i)] = sign * static_cast<float>(std::sin(ang) * scale);
    }
  const bool in_place = x.data_ptr() == out.data_ptr();
  dispatch_float(x.dtype(), what, [&](auto tag) {
    using T_ = decltype(tag);
    const T_* xp = static_cast<const T_*>(x.data_ptr());
    T_* op = static_cast<T_*>(out.data_ptr());
#pragma omp parallel for schedule(static) if (B * T * H * D > 16384)
    for (int64_t tok = 0; tok < B * T; ++tok) {
      const int64_t t = tok % T;
      const float* c = cs.data() + t * half;
      const float* s = sn.data() + t * half;
      for (int64_t h = 0; h < H; ++h) {
        const T_* xr = xp + (tok * H + h) * D;
        T_* orow = op + (tok * H + h) * D;
        if (h >= rotate_heads) {
          if (!in_place)
            for (int64_t d = 0; d < D; ++d) orow[d] = xr[d];
          continue;
        }
#pragma omp simd
        for (int64_t i = 0; i < half; ++i) {
          const float a = to_f32(xr[i]), b = to_f32(xr[i + half]);
          orow[i] = from_f32<T_>(a * c[i] - b * s[i]);
          orow[i + half] = from_f32<T_>(b * c[i] + a * s[i]);
        }
        if (!in_place)
          for (int64_t d = R; d < D; ++d) orow[d] = xr[d];
      }
    }
  });
}

}  // namespace

void rope_forward(const Tensor& x, const Tensor& out, int64_t rotate_heads, const RopeArgs& args, Stream) {
  rope_apply(x, out, rotate_heads, args, 1.0f, "rope_forward");
}

void rope_backward(const Tensor& dout, const Tensor& dx, int64_t rotate_heads, const RopeArgs& args, Stream) {
  rope_apply(dout, dx, rotate_heads, args, -1.0f, "rope_backward");
}

}  // namespace mpitron::cpu
