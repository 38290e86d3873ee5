// tensor/cpu/common.h — helpers shared by the CPU kernels.
//
// The CPU backend computes in f32 whatever the storage dtype: bf16/f16 values
// are widened on load and rounded (nearest even) on store. Loops are OpenMP
// parallel over independent rows or elements; reductions that feed parameter
// gradients use per-thread partials summed in a fixed order, so results do not
// depend on scheduling for a given thread count.
#pragma once
#include <omp.h>

#include <cstdint>
#include <vector>

#include "tensor/tensor.h"

namespace mpitron::cpu {

// Contiguous float view of a tensor: points at the data when it is f32,
// otherwise at a widened copy.
class F32In {
 public:
  explicit F32In(const Tensor& t) {
    if (!t.defined()) return;
    if (t.dtype() == DType::F32) {
      p_ = t.data<float>();
    } else {
      buf_.resize(static_cast<size_t>(t.numel()));
      dispatch_float(t.dtype(), "F32In", [&](auto tag) {
        using T = decltype(tag);
        const T* s = static_cast<const T*>(t.data_ptr());
        const int64_t n = t.numel();
#pragma omp parallel for schedule(static) if (n > 65536)
        for (int64_t i = 0; i < n; ++i) buf_[i] = to_f32(s[i]);
      });
      p_ = buf_.data();
    }
  }
  const float* get() const { return p_; }

 private:
  const float* p_ = nullptr;
  std::vector<float> buf_;
};

// Float output buffer for a tensor: writes go straight to f32 data, or to a
// scratch that commit() rounds into the tensor. load=true fills the scratch
// with the tensor's current values (for accumulation).
class F32Out {
 public:
  F32Out(const Tensor& t, bool load) : t_(t) {
    if (!t.defined()) return;
    if (t.dtype() == DType::F32) {
      p_ = t.data<float>();
    } else {
      buf_.resize(static_cast<size_t>(t.numel()));
      if (load) {
        F32In in(t);
        std::copy(in.get(), in.get() + t.numel(), buf_.begin());
      }
      p_ = buf_.data();
    }
  }
  float* get() { return p_; }
  void commit() {
    if (!t_.defined() || t_.dtype() == DType::F32) return;
    dispatch_float(t_.dtype(), "F32Out", [&](auto tag) {
      using T = decltype(tag);
      T* d = static_cast<T*>(t_.data_ptr());
      const int64_t n = t_.numel();
#pragma omp parallel for schedule(static) if (n > 65536)
      for (int64_t i = 0; i < n; ++i) d[i] = from_f32<T>(buf_[i]);
    });
  }

 private:
  Tensor t_;
  float* p_ = nullptr;
  std::vector<float> buf_;
};

// Read index i of an i32/i64 tensor.
inline int64_t load_index(const Tensor& t, int64_t i) {
  return t.dtype() == DType::I32 ? static_cast<const int32_t*>(t.data_ptr())[i]
                                 : static_cast<const int64_t*>(t.data_ptr())[i];
}

}  // namespace mpitron::cpu
