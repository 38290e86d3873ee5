// tensor/grouped_gemm.h — the MoE experts' GEMMs over rows grouped by expert
// (Megatron-Core's --moe-grouped-gemm, grouped_gemm.ops.gmm): group g is rows
// [o_g, o_g + counts[g]) of x and y, o_g = Σ_{h<g} counts[h]; a group of 0 rows is skipped.
//
//   forward:  y[rows g] (c_g, M) = x[rows g] (c_g, K) · w[g]ᵀ (w[g]: (M, K))  [+ bias[g] (M)]
//   backward: dx[rows g] = dy[rows g] · w[g]                      (overwritten; dx may be undefined)
//             dw[g] += dy[rows g]ᵀ · x[rows g],  dbias[g] += Σ_rows dy[rows g]   (accumulated, f32 or w's dtype
//             as gemm_backward's db; dw / dbias vectors empty: skipped)
// x, y, dy, dx: (R, ·) one float dtype (f32/bf16/f16), R = Σ counts; w[g], bias[g]: that dtype;
// counts on the host, each >= 0, one per w[g]. bias, dw, dbias: empty or one tensor per group;
// an undefined dw[g] / dbias[g] skips that group's gradient (a frozen expert). Every w[g] its own
// tensor (they need not be adjacent in memory: ZeRO-3 and the expert-parallel layout place them).
// All tensors contiguous, on x's device.
// Accumulation in f32 (TF32 for f32 inputs only under MPITRON_ALLOW_TF32=1, as gemm.h).
// CPU: one gemm per group. CUDA: one cublasGemmGroupedBatchedEx call per pass (y, dx, dw) where
// cuBLAS allows it — C of the inputs' dtype (so not an f32 dw of 16-bit weights), no bias
// epilogue (so not a forward with bias), every matrix 16-byte aligned with 16-byte row strides —
// else a gemm per group (cuBLASLt); dbias is a column sum per group.
// Path counters (path_stats.h), one op name per pass: grouped_gemm.{grouped,per_group} (y),
// grouped_gemm_dx.{grouped,per_group}, grouped_gemm_dw.{grouped,per_group}.
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
