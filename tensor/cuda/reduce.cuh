// tensor/cuda/reduce.cuh — deterministic column sums over the rows of a matrix.
//
//   out0[c] (= or +=) Σ_r f(r, c).x,   out1[c] (= or +=) Σ_r f(r, c).y
//   for r in [0, rows), c in [0, cols); f returns a float2 so two sums (e.g. a
//   layernorm's dweight and dbias) share one read of the inputs.
// Used by gemm_backward (dbias) and layernorm_backward (dweight, dbias).
//
// Determinism: pass 1 gives every (row chunk, column) pair to one thread, which
// sums its rows in order into partial[chunk][c] (f32 scratch from the caching
// allocator); pass 2 sums the chunks in order. No atomics, so the result is
// bit-identical run to run.
#pragma once
#include "tensor/cuda/common.cuh"

namespace mpitron::cuda {

template <typename F>
__global__ void column_partials_kernel(F f, int64_t rows, int cols, int64_t rows_per_chunk, float2* partial) {
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= cols) return;
  const int64_t r0 = static_cast<int64_t>(blockIdx.y) * rows_per_chunk;
  const int64_t r1 = r0 + rows_per_chunk < rows ? r0 + rows_per_chunk : rows;
  float2 acc = make_float2(0.0f, 0.0f);
#pragma unroll 4
  for (int64_t r = r0; r < r1; ++r) {
    const float2 v = f(r, c);
    acc.x += v.x;
    acc.y += v.y;
  }
  partial[static_cast<int64_t>(blockIdx.y) * cols + c] = acc;
}

template <typename O0, typename O1>
__global__ void column_finalize_kernel(const float2* partial, int chunks, int cols, O0* out0, O1* out1,
                                       bool accumulate) {
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= cols) return;
  float s0 = 0.0f, s1 = 0.0f;
  for (int k = 0; k < chunks; ++k) {
    const float2 v = partial[static_cast<int64_t>(k) * cols + c];
    s0 += v.x;
    s1 += v.y;
  }
  if (out0) out0[c] = from_float<O0>(accumulate ? to_float(out0[c]) + s0 : s0);
  if (out1) out1[c] = from_float<O1>(accumulate ? to_float(out1[c]) + s1 : s1);
}

// Launches both passes on `stream`. out0/out1 may be null (that sum is dropped).
template <typename F, typename O0, typename O1>
void column_sums(F f, int64_t rows, int cols, O0* out0, O1* out1, bool accumulate, int device, Stream s) {
  if (cols <= 0) return;
  const cudaStream_t st = stream_of(s);
  constexpr int kThreads = 256;
  const int gx = (cols + kThreads - 1) / kThreads;
  if (rows <= 0) {
    // Σ over nothing is 0: still write it when overwriting.
    if (!accumulate) {
      Scratch zero(device, sizeof(float2) * cols, s);
      MPT_CUDA_CHECK(cudaMemsetAsync(zero.get(), 0, sizeof(float2) * cols, st));
      MPT_LAUNCH(gx, kThreads, 0, st, column_finalize_kernel)(zero.get<float2>(), 1, cols, out0, out1, false);
      MPT_KERNEL_CHECK("column_sums");
    }
    return;
  }
  // Enough chunks to give every SM a few blocks, each chunk at least 8 rows long.
  int64_t chunks = (4LL * num_sms() + gx - 1) / gx;
  chunks = std::max<int64_t>(1, std::min<int64_t>(chunks, (rows + 7) / 8));
  const int64_t rows_per_chunk = (rows + chunks - 1) / chunks;
  chunks = (rows + rows_per_chunk - 1) / rows_per_chunk;
  Scratch partial(device, sizeof(float2) * chunks * cols, s);
  MPT_LAUNCH(dim3(gx, static_cast<unsigned>(chunks)), kThreads, 0, st, column_partials_kernel)(
      f, rows, cols, rows_per_chunk, partial.get<float2>());
  MPT_KERNEL_CHECK("column_sums (partials)");
  MPT_LAUNCH(gx, kThreads, 0, st, column_finalize_kernel)(partial.get<float2>(), static_cast<int>(chunks), cols, out0,
                                                  out1, accumulate);
  MPT_KERNEL_CHECK("column_sums (finalize)");
}

}  // namespace mpitron::cuda
