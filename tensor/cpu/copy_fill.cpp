// tensor/cpu/copy_fill.cpp — strided copy and fill.
#include <cstring>

#include "tensor/cpu/common.h"
#include "tensor/cpu/ops.h"

namespace mpitron::cpu {

// dst (contiguous or strided) = src (any strides), same shape and dtype.
void copy_strided(const Tensor& src, const Tensor& dst, Stream) {
  const size_t es = dtype_size(src.dtype());
  if (src.is_contiguous() && dst.is_contiguous()) {
    std::memmove(dst.data_ptr(), src.data_ptr(), src.nbytes());
    return;
  }
  const int nd = src.ndim();
  const Shape& shape = src.shape();
  const int64_t n = src.numel();
  const char* s = static_cast<const char*>(src.data_ptr());
  char* d = static_cast<char*>(dst.data_ptr());
#pragma omp parallel for schedule(static) if (n > 65536)
  for (int64_t i = 0; i < n; ++i) {
    int64_t rem = i, so = 0, dof = 0;
    for (int k = nd - 1; k >= 0; --k) {
      const int64_t idx = rem % shape[k];
      rem /= shape[k];
      so += idx * src.strides()[k];
      dof += idx * dst.strides()[k];
    }
    std::memcpy(d + dof * es, s + so * es, es);
  }
}

void fill(const Tensor& t, double value, Stream) {
  const int64_t n = t.numel();
  auto run = [&](auto v) {
    using T = decltype(v);
    T* p = static_cast<T*>(t.data_ptr());
#pragma omp parallel for schedule(static) if (n > 65536)
    for (int64_t i = 0; i < n; ++i) p[i] = v;
  };
  switch (t.dtype()) {
    case DType::F32: run(static_cast<float>(value)); break;
    case DType::BF16: run(f32_to_bf16(static_cast<float>(value))); break;
    case DType::F16: run(f32_to_f16(static_cast<float>(value))); break;
    case DType::I32: run(static_cast<int32_t>(value)); break;
    case DType::I64: run(static_cast<int64_t>(value)); break;
    case DType::U16: run(static_cast<uint16_t>(value)); break;
  }
}

}  // namespace mpitron::cpu
