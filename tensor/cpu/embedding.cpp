// tensor/cpu/embedding.cpp — embedding lookup and scatter-add backward.
#include "tensor/cpu/common.h"
#include "tensor/cpu/ops.h"

namespace mpitron::cpu {

void embedding_forward(const Tensor& ids, const Tensor& table, const Tensor& out, bool accumulate,
                       int64_t vocab_start, Stream) {
  const int64_t n = ids.dim(0), v = table.dim(0), c = table.dim(1);
  dispatch_float(table.dtype(), "embedding_forward", [&](auto tag) {
    using T = decltype(tag);
    const T* tp = static_cast<const T*>(table.data_ptr());
    T* op = static_cast<T*>(out.data_ptr());
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; ++i) {
      const int64_t row = load_index(ids, i) - vocab_start;
      const bool in = row >= 0 && row < v;
      T* o = op + i * c;
      for (int64_t j = 0; j < c; ++j) {
        const float e = in ? to_f32(tp[row * c + j]) : 0.0f;
        o[j] = from_f32<T>(accumulate ? to_f32(o[j]) + e : e);
      }
    }
  });
}

// Columns are split across threads, so every (row, column) is summed by one
// thread in id order: deterministic, no atomics.
void embedding_backward(const Tensor& dout, const Tensor& ids, const Tensor& dtable, int64_t vocab_start,
                        Stream) {
  const int64_t n = ids.dim(0), v = dtable.dim(0), c = dtable.dim(1);
  F32In fd(dout);
  const float* d = fd.get();
  dispatch_float(dtable.dtype(), "embedding_backward", [&](auto tag) {
    using T = decltype(tag);
    T* g = static_cast<T*>(dtable.data_ptr());
#pragma omp parallel
    {
      const int nt = omp_get_num_threads(), t = omp_get_thread_num();
      const int64_t lo = c * t / nt, hi = c * (t + 1) / nt;
      for (int64_t i = 0; i < n; ++i) {
        const int64_t row = load_index(ids, i) - vocab_start;
        if (row < 0 || row >= v) continue;
        for (int64_t j = lo; j < hi; ++j) g[row * c + j] = from_f32<T>(to_f32(g[row * c + j]) + d[i * c + j]);
      }
    }
  });
}

}  // namespace mpitron::cpu
