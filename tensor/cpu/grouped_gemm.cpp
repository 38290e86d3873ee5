// tensor/cpu/grouped_gemm.cpp — the MoE experts' GEMMs (tensor/grouped_gemm.h) on the CPU:
// one gemm per group of rows through cpu::gemm / cpu::gemm_backward (OpenBLAS, f32
// accumulation), groups of 0 rows skipped (no BLAS call with M = 0).
#include "tensor/cpu/ops.h"

namespace mpitron::cpu {

namespace {
const Tensor& or_none(const std::vector<Tensor>& v, size_t g) {
  static const Tensor none;
  return v.empty() ? none : v[g];
}
GemmArgs linear() {  // y = x · wᵀ
  GemmArgs a;
  a.trans_b = true;
  return a;
}
}  // namespace

void grouped_gemm(const Tensor& x, const std::vector<Tensor>& w, const std::vector<int64_t>& counts, const Tensor& y,
                  const std::vector<Tensor>& bias, Stream s) {
  int64_t o = 0;
  for (size_t g = 0; g < counts.size(); o += counts[g], ++g) {
    if (counts[g] == 0) continue;
    // y rows (c_g, M) = x rows (c_g, K) · w[g]ᵀ [+ bias[g]]
    cpu::gemm(x.slice(0, o, o + counts[g]), w[g], y.slice(0, o, o + counts[g]), linear(), or_none(bias, g), s);
  }
}

void grouped_gemm_backward(const Tensor& dy, const Tensor& x, const std::vector<Tensor>& w,
                           const std::vector<int64_t>& counts, const Tensor& dx, const std::vector<Tensor>& dw,
                           const std::vector<Tensor>& dbias, Stream s) {
  int64_t o = 0;
  for (size_t g = 0; g < counts.size(); o += counts[g], ++g) {
    if (counts[g] == 0) continue;
    const int64_t e = o + counts[g];
    // dx rows = dy rows · w[g] (overwritten); dw[g] += dy rowsᵀ · x rows; dbias[g] += Σ dy rows
    cpu::gemm_backward(dy.slice(0, o, e), x.slice(0, o, e), w[g], dx.defined() ? dx.slice(0, o, e) : Tensor(),
                  or_none(dw, g), or_none(dbias, g), linear(), /*accumulate_a=*/false, /*accumulate_b=*/true, s);
  }
}

}  // namespace mpitron::cpu
