// tensor/cuda/common.cuh — what every CUDA kernel file of the tensor library shares:
//   * error checks that throw mpitron::Error with the CUDA / cuBLAS status string,
//   * dtype traits (mpitron bf16_t/f16_t <-> __nv_bfloat16/__half) and f32 load/store,
//   * 128-bit vector packs and an alignment test for choosing vectorised kernels,
//   * warp / block reductions,
//   * the device guard, stream and scratch-memory helpers (scratch comes from the
//     caching allocator, never from cudaMalloc),
//   * the per-device cuBLASLt handle and per-(device, stream) workspace.
// Device code is guarded by MPT_DEVICE_CODE (nvcc, or the simulated device of tests/cuda_sim).
#pragma once
#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

// Stream() must be the legacy default stream (docs/cuda.md, "Streams and ordering").
#if defined(CUDA_API_PER_THREAD_DEFAULT_STREAM)
#error "mpitron requires the legacy default stream: do not build with --default-stream per-thread"
#endif

#include "core/allocator.h"
#include "core/error.h"
#include "tensor/dtype.h"
#include "tensor/path_stats.h"
#include "tensor/tensor.h"

// ---- error checking ------------------------------------------------------------
#define MPT_CUDA_CHECK(expr)                                                                      \
  do {                                                                                            \
    const cudaError_t e_ = (expr);                                                                \
    if (e_ != cudaSuccess)                                                                        \
      MPT_THROW(::mpitron::str("CUDA error ", cudaGetErrorName(e_), " (", cudaGetErrorString(e_), \
                               ") in ", #expr),                                                   \
                "check the device with nvidia-smi; run with CUDA_LAUNCH_BLOCKING=1 to locate it"); \
  } while (0)

// After a kernel launch: catches bad launch configurations (not asynchronous faults).
#define MPT_KERNEL_CHECK(what)                                                                     \
  do {                                                                                             \
    const cudaError_t e_ = cudaGetLastError();                                                     \
    if (e_ != cudaSuccess)                                                                         \
      MPT_THROW(::mpitron::str("CUDA kernel launch failed in ", what, ": ", cudaGetErrorName(e_), \
                               " (", cudaGetErrorString(e_), ")"),                                 \
                "this is a bug in mpitron's CUDA backend: please report it with the shapes");      \
  } while (0)

#define MPT_CUBLAS_CHECK(expr)                                                                     \
  do {                                                                                             \
    const cublasStatus_t st_ = (expr);                                                             \
    if (st_ != CUBLAS_STATUS_SUCCESS)                                                              \
      MPT_THROW(::mpitron::str("cuBLAS error ", cublasGetStatusName(st_), " (",                   \
                               cublasGetStatusString(st_), ") in ", #expr),                        \
                "check shapes, dtypes and alignment; CUBLASLT_LOG_LEVEL=2 prints cuBLASLt's view"); \
  } while (0)

// ---- kernel launches -----------------------------------------------------------------
// Every launch is written MPT_LAUNCH(grid, block, shmem, stream, kernel)(args...):
// under nvcc it is kernel<<<grid, block, shmem, stream>>>(args...); in the
// simulated-device build (MPITRON_CUDA_SIM, tests/cuda_sim) it runs the kernel's
// threads as fibers on the host. The kernel goes last (its template arguments may
// hold commas) and is named exactly as in <<<>>> (template arguments deduced or not).
#if defined(MPITRON_CUDA_SIM)
#define MPT_LAUNCH(grid, block, shmem, stream, ...) \
  ::mpitron::cuda::sim::launch(#__VA_ARGS__, grid, block, shmem, stream, [](auto... a_) { __VA_ARGS__(a_...); })
// Vector accesses must be aligned to their size (a misaligned address fault on a GPU).
#define MPT_CHECK_VECTOR_ALIGNED(p, bytes) ::mpitron::cuda::sim::check_aligned(p, bytes, __func__)
#define MPT_DEVICE_CODE 1
#else
#define MPT_LAUNCH(grid, block, shmem, stream, ...) __VA_ARGS__<<<grid, block, shmem, stream>>>
#define MPT_CHECK_VECTOR_ALIGNED(p, bytes) ((void)0)
#if defined(__CUDACC__)
#define MPT_DEVICE_CODE 1
#endif
#endif

namespace mpitron::cuda {

inline cudaStream_t stream_of(Stream s) { return static_cast<cudaStream_t>(s.handle()); }

// Makes `index` the current device for the scope of an op (tensors may live on a
// device other than the current one); restores the previous one afterwards.
class DeviceGuard {
 public:
  explicit DeviceGuard(int index) {
    MPT_CUDA_CHECK(cudaGetDevice(&prev_));
    if (prev_ != index) MPT_CUDA_CHECK(cudaSetDevice(index));
    cur_ = index;
  }
  explicit DeviceGuard(const Tensor& t) : DeviceGuard(t.device().index) {}
  ~DeviceGuard() {
    if (prev_ != cur_) cudaSetDevice(prev_);
  }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int prev_ = 0, cur_ = 0;
};

// Temporary device memory for one op, from the caching allocator. Released at
// scope end: the block goes back to the free list of `stream`, and the
// allocator only hands it out again for later work on that same stream, so the
// kernels already queued that use it finish first (no sync needed).
class Scratch {
 public:
  Scratch() = default;
  Scratch(int device, size_t bytes, Stream s) : dev_(device) {
    if (bytes) p_ = cuda_caching_allocator(device).allocate(bytes, s);
  }
  ~Scratch() {
    if (p_) cuda_caching_allocator(dev_).release(p_);
  }
  Scratch(Scratch&& o) noexcept : dev_(o.dev_), p_(o.p_) { o.p_ = nullptr; }
  Scratch& operator=(Scratch&& o) noexcept {
    std::swap(dev_, o.dev_);
    std::swap(p_, o.p_);
    return *this;
  }
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;
  template <typename T = void> T* get() const { return static_cast<T*>(p_); }

 private:
  int dev_ = 0;
  void* p_ = nullptr;
};

// ---- dtype traits ----------------------------------------------------------------
// device_t<T>: the CUDA type for an mpitron element type (binary compatible).
template <typename T> struct device_type { using type = T; };
template <> struct device_type<bf16_t> { using type = __nv_bfloat16; };
template <> struct device_type<f16_t> { using type = __half; };
template <typename T> using device_t = typename device_type<T>::type;

inline cudaDataType_t cuda_dtype(DType t) {
  switch (t) {
    case DType::F32: return CUDA_R_32F;
    case DType::BF16: return CUDA_R_16BF;
    case DType::F16: return CUDA_R_16F;
    case DType::I32: return CUDA_R_32I;
    default: MPT_THROW(str("no CUDA math type for dtype ", dtype_name(t)), "");
  }
}

// Calls f(device-type tag) for a floating dtype: DISPATCH_DEV(t, "op", [&](auto tag){ using T = decltype(tag); ... })
#define MPT_DISPATCH_DEV_FLOAT(dtype, what, ...)                                    \
  [&] {                                                                             \
    auto f_ = __VA_ARGS__;                                                          \
    switch (dtype) {                                                                \
      case ::mpitron::DType::F32: return f_(float{});                               \
      case ::mpitron::DType::BF16: return f_(__nv_bfloat16{});                      \
      case ::mpitron::DType::F16: return f_(__half{});                              \
      default:                                                                      \
        MPT_THROW(::mpitron::str(what, ": dtype ", ::mpitron::dtype_name(dtype),      \
                                 " is not a floating type (f32, bf16, f16)"), "");  \
    }                                                                               \
  }()

// Index dtypes (i32 / i64).
#define MPT_DISPATCH_INDEX(dtype, what, ...)                                        \
  [&] {                                                                             \
    auto f_ = __VA_ARGS__;                                                          \
    switch (dtype) {                                                                \
      case ::mpitron::DType::I32: return f_(int32_t{});                             \
      case ::mpitron::DType::I64: return f_(int64_t{});                             \
      default:                                                                      \
        MPT_THROW(::mpitron::str(what, ": dtype ", ::mpitron::dtype_name(dtype),      \
                                 " is not an index type (i32, i64)"), "");          \
    }                                                                               \
  }()

// Number of blocks for a grid-stride kernel over n items with `threads` per block:
// enough to fill the device several times, never more than needed.
int grid_for(int64_t n, int threads, int blocks_per_sm = 8);
int num_sms();

// Largest power of two (<= 256) dividing the address: what alignment an operand has.
inline int ptr_alignment(const void* p) {
  const uintptr_t a = reinterpret_cast<uintptr_t>(p);
  int al = 256;
  while (al > 1 && (a % al) != 0) al >>= 1;
  return al;
}
inline bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }
// Counts which width a row/element kernel ran at (tensor/path_stats.h): "<op>.vec8" or "<op>.scalar".
inline void count_vec_path(const char* op, bool vec) { path_count_add(op, vec ? "vec8" : "scalar"); }

// ---- cuBLASLt handle and workspace ---------------------------------------------------
cublasLtHandle_t cublaslt_handle(int device);
// A workspace for cuBLASLt matmuls queued on `s` (one per (device, stream), held
// for the process lifetime, from the caching allocator).
void* cublaslt_workspace(int device, Stream s, size_t* bytes);

#if defined(MPT_DEVICE_CODE)  // nvcc, or the simulated device
// ---- f32 load / store ------------------------------------------------------------------
__device__ __forceinline__ float to_float(float v) { return v; }
__device__ __forceinline__ float to_float(__nv_bfloat16 v) { return __bfloat162float(v); }
__device__ __forceinline__ float to_float(__half v) { return __half2float(v); }
template <typename T> __device__ __forceinline__ T from_float(float v);
template <> __device__ __forceinline__ float from_float<float>(float v) { return v; }
template <> __device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float v) { return __float2bfloat16_rn(v); }
template <> __device__ __forceinline__ __half from_float<__half>(float v) { return __float2half_rn(v); }

// ---- 128-bit packs -----------------------------------------------------------------------
// Pack<T>: 16 bytes of T (4 floats or 8 halves), loaded/stored in one instruction.
template <typename T> struct alignas(16) Pack {
  static constexpr int N = 16 / sizeof(T);
  T v[N];
};
template <typename T> __device__ __forceinline__ Pack<T> load_pack(const T* p) {
  MPT_CHECK_VECTOR_ALIGNED(p, 16);
  Pack<T> r;
  *reinterpret_cast<int4*>(&r) = *reinterpret_cast<const int4*>(p);
  return r;
}
// Streaming load (read once, do not keep in L1).
template <typename T> __device__ __forceinline__ Pack<T> load_pack_cs(const T* p) {
  MPT_CHECK_VECTOR_ALIGNED(p, 16);
  Pack<T> r;
  *reinterpret_cast<int4*>(&r) = __ldcs(reinterpret_cast<const int4*>(p));
  return r;
}
template <typename T> __device__ __forceinline__ void store_pack(T* p, const Pack<T>& v) {
  MPT_CHECK_VECTOR_ALIGNED(p, 16);
  *reinterpret_cast<int4*>(p) = *reinterpret_cast<const int4*>(&v);
}

// ---- reductions ------------------------------------------------------------------------------
__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}
// Sum over the block (blockDim.x a multiple of 32, <= 1024); every thread gets the result.
// `shared` holds 32 floats. Ends with a barrier-protected read, so it may be called again.
__device__ __forceinline__ float block_sum(float v, float* shared) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
  v = warp_sum(v);
  __syncthreads();
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  v = lane < nwarps ? shared[lane] : 0.0f;
  return warp_sum(v);
}
__device__ __forceinline__ float block_max(float v, float* shared) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
  v = warp_max(v);
  __syncthreads();
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  v = lane < nwarps ? shared[lane] : -INFINITY;
  return warp_max(v);
}
#endif  // MPT_DEVICE_CODE

}  // namespace mpitron::cuda
