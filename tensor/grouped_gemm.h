// tensor/grouped_gemm.h — the MoE experts' GEMMs over rows grouped by expert
// (Megatron-Core's --moe-grouped-gemm, grouped_gemm.ops.gmm): group g is rows
// [o_g, o_g + counts[g]) of x and y, o_g = Σ_{h<g} counts[h]; a group of 0 rows is skipped.
//
//   forward:  y[rows g] (c_g, M) = x[rows g] (c_g, K) · w[g]ᵀ (w[g]: (M, K))  [+ bias[g] (M)]
//   backward: dx[rows g] = dy[rows g] · w[g]                      (overwritten; dx may be undefined)
//             dw[g] += dy[rows g]ᵀ · x[rows g],  dbias[g] += Σ_rows dy[rows g]   (accumulated, f32 or w's dtype
//             as gemm_backward's db; dw / dbias vectors empty: skipped)
// x, y, dy, dx: (R, ·) one float dtype (f32/bf16/f16), R = Σ counts; w[g], bias[g]: that dtype;
// counts on the host. Every w[g] its own tensor (they need not be adjacent in memory: ZeRO-3 and the
// expert-parallel layout place them). Accumulation in f32. CPU: one gemm per group; CUDA: one
// cublasGemmGroupedBatchedEx call per pass where the dtypes allow it, else a gemm per group.
#pragma once
#include <cstdint>
#include <vector>

#include "tensor/tensor.h"

namespace mpitron {

void grouped_gemm(const Tensor& x, const std::vector<Tensor>& w, const std::vector<int64_t>& counts, const Tensor& y,
                  const std::vector<Tensor>& bias = {}, Stream s = Stream());
void grouped_gemm_backward(const Tensor& dy, const Tensor& x, const std::vector<Tensor>& w,
                           const std::vector<int64_t>& counts, const Tensor& dx, const std::vector<Tensor>& dw,
                           const std::vector<Tensor>& dbias, Stream s = Stream());

}  // namespace mpitron
