// tensor/cuda/embedding.cu — embedding lookup and its scatter-add backward.
//   forward:  ids (N) i32/i64, table (V, C), out (N, C):
//             out[n] = (accumulate ? out[n] : 0) + table[ids[n] − vocab_start]
//             (rows outside [0, V) give zeros: vocab-parallel semantics)
//   backward: dtable[ids[n] − vocab_start] += dout[n]   (dtable f32 or dout's dtype)
//
// Backward is deterministic and atomic-free: the (row, n) pairs are sorted by
// row with a stable radix sort (CUB), then one warp per distinct row walks its
// run of tokens in increasing n, adding onto the old dtable row in f32 and
// rounding once. That is the CPU's summation order, so f32 results match it
// bit for bit, and bf16 tables accumulate in f32 without a V×C scratch.
#include <cub/cub.cuh>

#include "tensor/cuda/common.cuh"
#include "tensor/cuda/map.cuh"
#include "tensor/cuda/ops.h"

namespace mpitron::cuda {

namespace {
constexpr int kWarpsPerBlock = 8;

template <typename T, typename I, int V>
__global__ void embedding_forward_kernel(const I* ids, const T* table, T* out, int64_t n_ids, int64_t vocab,
                                         int cols, int64_t vocab_start, bool accumulate) {
  const int lane = threadIdx.x & 31;
  const int64_t n = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + (threadIdx.x >> 5);
  if (n >= n_ids) return;
  const int64_t r = static_cast<int64_t>(ids[n]) - vocab_start;
  const bool in_range = r >= 0 && r < vocab;
  const T* tr = table + (in_range ? r : 0) * cols;
  T* orow = out + n * cols;
  for (int c = lane * V; c < cols; c += 32 * V) {
    float u[V];
    if (in_range) {
      load_f<V>(tr + c, u);
    } else {
#pragma unroll
      for (int k = 0; k < V; ++k) u[k] = 0.0f;
    }
    if (accumulate) {
      float o[V];
      load_f<V>(orow + c, o);
#pragma unroll
      for (int k = 0; k < V; ++k) u[k] += o[k];
    }
    store_f<V>(orow + c, u);
  }
}

// key[n] = row of token n, or `vocab` (sorts last, skipped) when out of range; val[n] = n.
template <typename I>
__global__ void embedding_keys_kernel(const I* ids, int64_t n_ids, int64_t vocab, int64_t vocab_start, uint32_t* keys,
                                      int32_t* vals) {
  for (int64_t n = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; n < n_ids;
       n += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = static_cast<int64_t>(ids[n]) - vocab_start;
    keys[n] = static_cast<uint32_t>(r >= 0 && r < vocab ? r : vocab);
    vals[n] = static_cast<int32_t>(n);
  }
}

// One warp per sorted position p that starts a run of equal keys.
template <typename T, typename D, int V>
__global__ void embedding_backward_kernel(const T* dout, const uint32_t* keys, const int32_t* vals, D* dtable,
                                          int64_t n_ids, uint32_t vocab, int cols) {
  const int lane = threadIdx.x & 31;
  const int64_t p = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + (threadIdx.x >> 5);
  if (p >= n_ids) return;
  const uint32_t key = keys[p];
  if (key == vocab || (p > 0 && keys[p - 1] == key)) return;
  int64_t end = p + 1;
  while (end < n_ids && keys[end] == key) ++end;
  D* drow = dtable + static_cast<int64_t>(key) * cols;
  for (int c = lane * V; c < cols; c += 32 * V) {
    float acc[V];
    load_f<V>(drow + c, acc);
    for (int64_t q = p; q < end; ++q) {
      float u[V];
      load_f<V>(dout + static_cast<int64_t>(vals[q]) * cols + c, u);
#pragma unroll
      for (int k = 0; k < V; ++k) acc[k] += u[k];
    }
    store_f<V>(drow + c, acc);
  }
}
}  // namespace

void embedding_forward(const Tensor& ids, const Tensor& table, const Tensor& out, bool accumulate, int64_t vocab_start,
                       Stream s) {
  DeviceGuard g(table);
  const int64_t n_ids = ids.dim(0), vocab = table.dim(0);
  const int cols = static_cast<int>(table.dim(1));
  if (n_ids == 0 || cols == 0) return;
  const int grid = static_cast<int>((n_ids + kWarpsPerBlock - 1) / kWarpsPerBlock);
  const cudaStream_t st = stream_of(s);
  MPT_DISPATCH_DEV_FLOAT(table.dtype(), "embedding_forward", [&](auto tag) {
    using T = decltype(tag);
    MPT_DISPATCH_INDEX(ids.dtype(), "embedding_forward", [&](auto itag) {
      using I = decltype(itag);
      const I* pi = static_cast<const I*>(ids.data_ptr());
      const T* pt = static_cast<const T*>(table.data_ptr());
      T* po = static_cast<T*>(out.data_ptr());
      const bool vec = cols % kMapVec == 0 && vec_aligned(pt, sizeof(T)) && vec_aligned(po, sizeof(T));
      count_vec_path("embedding_forward", vec);
      if (vec)
        MPT_LAUNCH(grid, 32 * kWarpsPerBlock, 0, st, embedding_forward_kernel<T, I, kMapVec>)(pi, pt, po, n_ids, vocab, cols, vocab_start, accumulate);
      else
        MPT_LAUNCH(grid, 32 * kWarpsPerBlock, 0, st, embedding_forward_kernel<T, I, 1>)(pi, pt, po, n_ids, vocab, cols, vocab_start, accumulate);
    });
  });
  MPT_KERNEL_CHECK("embedding_forward");
}

void embedding_backward(const Tensor& dout, const Tensor& ids, const Tensor& dtable, int64_t vocab_start, Stream s) {
  DeviceGuard g(dout);
  const int dev = dout.device().index;
  const int64_t n_ids = ids.dim(0), vocab = dtable.dim(0);
  const int cols = static_cast<int>(dtable.dim(1));
  if (n_ids == 0 || cols == 0 || vocab == 0) return;
  MPT_CHECK(n_ids < (int64_t(1) << 31) && vocab < (int64_t(1) << 31),
            str("embedding_backward: ", n_ids, " ids / ", vocab, " rows exceed the 32-bit sort keys"), "");
  const cudaStream_t st = stream_of(s);

  // Sort (row, n) by row. Keys need bits for values 0..vocab (vocab = "skip").
  int end_bit = 1;
  while (end_bit < 32 && (uint64_t(1) << end_bit) <= static_cast<uint64_t>(vocab)) ++end_bit;
  const size_t n_bytes = sizeof(uint32_t) * n_ids;
  Scratch keys_in(dev, n_bytes, s), keys_out(dev, n_bytes, s), vals_in(dev, n_bytes, s), vals_out(dev, n_bytes, s);
  MPT_DISPATCH_INDEX(ids.dtype(), "embedding_backward", [&](auto itag) {
    using I = decltype(itag);
    MPT_LAUNCH(grid_for(n_ids, 256), 256, 0, st, embedding_keys_kernel<I>)(static_cast<const I*>(ids.data_ptr()), n_ids,
                                                                    vocab, vocab_start, keys_in.get<uint32_t>(),
                                                                    vals_in.get<int32_t>());
  });
  MPT_KERNEL_CHECK("embedding_backward (keys)");
  size_t temp_bytes = 0;
  MPT_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(nullptr, temp_bytes, keys_in.get<uint32_t>(),
                                                 keys_out.get<uint32_t>(), vals_in.get<int32_t>(),
                                                 vals_out.get<int32_t>(), static_cast<int>(n_ids), 0, end_bit, st));
  Scratch temp(dev, temp_bytes, s);
  MPT_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(temp.get(), temp_bytes, keys_in.get<uint32_t>(),
                                                 keys_out.get<uint32_t>(), vals_in.get<int32_t>(),
                                                 vals_out.get<int32_t>(), static_cast<int>(n_ids), 0, end_bit, st));

  const int grid = static_cast<int>((n_ids + kWarpsPerBlock - 1) / kWarpsPerBlock);
  MPT_DISPATCH_DEV_FLOAT(dout.dtype(), "embedding_backward", [&](auto tag) {
    using T = decltype(tag);
    MPT_DISPATCH_DEV_FLOAT(dtable.dtype(), "embedding_backward", [&](auto dtag) {
      using D = decltype(dtag);
      const T* pd = static_cast<const T*>(dout.data_ptr());
      D* pt = static_cast<D*>(dtable.data_ptr());
      const bool vec = cols % kMapVec == 0 && vec_aligned(pd, sizeof(T)) && vec_aligned(pt, sizeof(D));
      count_vec_path("embedding_backward", vec);
      if (vec)
        MPT_LAUNCH(grid, 32 * kWarpsPerBlock, 0, st, embedding_backward_kernel<T, D, kMapVec>)(
            pd, keys_out.get<uint32_t>(), vals_out.get<int32_t>(), pt, n_ids, static_cast<uint32_t>(vocab), cols);
      else
        MPT_LAUNCH(grid, 32 * kWarpsPerBlock, 0, st, embedding_backward_kernel<T, D, 1>)(
            pd, keys_out.get<uint32_t>(), vals_out.get<int32_t>(), pt, n_ids, static_cast<uint32_t>(vocab), cols);
    });
  });
  MPT_KERNEL_CHECK("embedding_backward");
}

}  // namespace mpitron::cuda
