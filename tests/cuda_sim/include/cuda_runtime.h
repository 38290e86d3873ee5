// tests/cuda_sim/include/cuda_runtime.h — the simulated device's CUDA runtime
// (MPITRON_CUDA_SIM builds only; this folder shadows the toolkit's headers).
//
// The project's .cu files compile as host C++ against it: the execution-space
// keywords vanish, `__shared__` becomes block-local static storage, threadIdx /
// blockIdx / blockDim / gridDim read the running simulated thread, and
// __syncthreads / __shfl_xor_sync are barriers of tests/cuda_sim/scheduler.cpp.
// Device memory is host memory (AddressSanitizer sees every access). Streams are
// asynchronous: each is a queue run by its own worker thread (tests/cuda_sim/streams.cpp),
// and every operation's device memory accesses are checked against the other
// streams' (tests/cuda_sim/race.cpp). See docs/cuda.md, "The simulated device".
#pragma once
#include <math.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#ifndef MPITRON_CUDA_SIM
#error "tests/cuda_sim/include is for the simulated-device build (-DMPITRON_CUDA_SIM=ON) only"
#endif

// ---- execution spaces and launch bounds ---------------------------------------------
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
// One instance per kernel instantiation; blocks run one at a time, so that is
// the block's shared memory. Static storage: AddressSanitizer checks its bounds.
#define __shared__ static

// ---- vector types ----------------------------------------------------------------------
struct dim3 {
  unsigned x, y, z;
  constexpr dim3(unsigned x_ = 1, unsigned y_ = 1, unsigned z_ = 1) : x(x_), y(y_), z(z_) {}
};
using uint3 = dim3;
struct alignas(8) float2 {
  float x, y;
};
struct alignas(16) float4 {
  float x, y, z, w;
};
struct alignas(16) int4 {
  int x, y, z, w;
};
inline float2 make_float2(float x, float y) { return {x, y}; }
inline float4 make_float4(float x, float y, float z, float w) { return {x, y, z, w}; }

// ---- runtime API ------------------------------------------------------------------------
enum cudaError_t {
  cudaSuccess = 0,
  cudaErrorInvalidValue = 1,
  cudaErrorMemoryAllocation = 2,
  cudaErrorInvalidConfiguration = 9,
  cudaErrorNoDevice = 100,
  cudaErrorInvalidDevice = 101,
  cudaErrorIllegalState = 401,
  cudaErrorNotReady = 600,
  cudaErrorMisalignedAddress = 716,
  cudaErrorLaunchFailure = 719,
};
typedef struct CUstream_st* cudaStream_t;
typedef struct CUevent_st* cudaEvent_t;
enum cudaMemcpyKind {
  cudaMemcpyHostToHost = 0,
  cudaMemcpyHostToDevice = 1,
  cudaMemcpyDeviceToHost = 2,
  cudaMemcpyDeviceToDevice = 3,
  cudaMemcpyDefault = 4
};
enum cudaDeviceAttr { cudaDevAttrMultiProcessorCount = 16 };
enum cudaDataType_t { CUDA_R_32F = 0, CUDA_R_16F = 2, CUDA_R_32I = 10, CUDA_R_16BF = 14 };
typedef cudaDataType_t cudaDataType;
#define cudaStreamDefault 0x00
#define cudaStreamNonBlocking 0x01
#define cudaEventDefault 0x00
#define cudaEventDisableTiming 0x02

const char* cudaGetErrorName(cudaError_t e);
const char* cudaGetErrorString(cudaError_t e);
cudaError_t cudaGetLastError();
cudaError_t cudaPeekAtLastError();
cudaError_t cudaGetDeviceCount(int* n);
cudaError_t cudaSetDevice(int d);
cudaError_t cudaGetDevice(int* d);
cudaError_t cudaDeviceGetAttribute(int* v, cudaDeviceAttr a, int d);
cudaError_t cudaDeviceSynchronize();
cudaError_t cudaMemGetInfo(size_t* free_bytes, size_t* total_bytes);
cudaError_t cudaMalloc(void** p, size_t bytes);
cudaError_t cudaFree(void* p);
cudaError_t cudaMemcpy(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind);
cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind, cudaStream_t s = nullptr);
cudaError_t cudaMemset(void* p, int v, size_t bytes);
cudaError_t cudaMemsetAsync(void* p, int v, size_t bytes, cudaStream_t s = nullptr);
cudaError_t cudaStreamCreate(cudaStream_t* s);
cudaError_t cudaStreamCreateWithFlags(cudaStream_t* s, unsigned flags);
cudaError_t cudaStreamGetFlags(cudaStream_t s, unsigned* flags);
cudaError_t cudaStreamDestroy(cudaStream_t s);
cudaError_t cudaStreamSynchronize(cudaStream_t s);
cudaError_t cudaStreamQuery(cudaStream_t s);
cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned flags = 0);
cudaError_t cudaEventCreate(cudaEvent_t* e);
cudaError_t cudaEventCreateWithFlags(cudaEvent_t* e, unsigned flags);
cudaError_t cudaEventDestroy(cudaEvent_t e);
cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s = nullptr);
cudaError_t cudaEventSynchronize(cudaEvent_t e);
cudaError_t cudaEventQuery(cudaEvent_t e);
cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t a, cudaEvent_t b);

// ---- the simulated threads ------------------------------------------------------------
namespace mpitron::cuda::sim {

struct ThreadState {
  dim3 thread, block, block_dim, grid_dim;
};
// The simulated thread now running (set by the scheduler before each switch).
extern thread_local const ThreadState* g_thread;

void syncthreads();
uint64_t shfl_xor(unsigned mask, uint64_t v, int lane_mask, int width);
// Fails the launch (naming the kernel) unless p is a multiple of `bytes`.
void check_aligned(const void* p, size_t bytes, const char* what);

// ---- stream operations (tests/cuda_sim/streams.cpp, race.cpp) -------------------------------
// A byte range of device memory an operation reads or writes. A kernel's pointer
// arguments are points (bytes = 1, the extent a kernel touches is not known);
// copies, memsets, GEMMs and collectives give their exact ranges.
struct Access {
  const void* p;
  size_t bytes;
  bool write;
};
// Queues `work` on stream s (null: the legacy default stream of the current
// device) with CUDA's ordering (legacy-stream semantics, event waits). First the
// race check: an access to memory another stream used, with nothing ordering
// this stream after that use, is reported naming `call`, the allocation and both
// streams, and the work is not queued (cudaErrorIllegalState, also the pending
// error). `call` must outlive the work (a literal, or a name kept by the caller).
cudaError_t enqueue(cudaStream_t s, const char* call, std::vector<Access> acc, std::function<void()> work);

// Runs body() as every thread of every block of the grid (scheduler.cpp), queued
// on stream st after checking `acc`.
void run_grid(const char* kernel, dim3 grid, dim3 block, size_t shmem, cudaStream_t st, std::vector<Access> acc,
              std::function<void()> body);

// The device memory a kernel argument may touch: a pointer is a point access
// (read when it points to const); an aggregate (a functor, a struct of pointers) is
// scanned for pointer-sized words, each a possible write (its constness is unknown).
template <typename T> void kernel_accesses(const T& v, std::vector<Access>& acc) {
  if constexpr (std::is_pointer_v<T>) {
    if (v) acc.push_back({static_cast<const void*>(v), 1, !std::is_const_v<std::remove_pointer_t<T>>});
  } else if constexpr (std::is_class_v<T> && std::is_trivially_copyable_v<T> && sizeof(T) >= sizeof(void*)) {
    const char* b = reinterpret_cast<const char*>(&v);
    for (size_t o = 0; o + sizeof(void*) <= sizeof(T); o += alignof(void*)) {
      const void* w;
      std::memcpy(&w, b + o, sizeof w);
      if (w) acc.push_back({w, 0, true});  // bytes 0: only if it points into a device allocation
    }
  }
}

template <typename K> struct Launch {
  const char* name;
  dim3 grid, block;
  size_t shmem;
  cudaStream_t stream;
  K kernel;
  // Arguments are copied once at launch (as CUDA does) and live until the kernel
  // ran on its stream; each thread gets its own copy.
  template <typename... A> void operator()(A&&... a) const {
    auto args = std::make_shared<std::tuple<std::decay_t<A>...>>(std::decay_t<A>(std::forward<A>(a))...);
    std::vector<Access> acc;
    std::apply([&](const auto&... x) { (kernel_accesses(x, acc), ...); }, *args);
    run_grid(name, grid, block, shmem, stream, std::move(acc), [args, k = kernel] { std::apply(k, *args); });
  }
};
template <typename K>
Launch<K> launch(const char* name, dim3 grid, dim3 block, size_t shmem, cudaStream_t stream, K kernel) {
  return Launch<K>{name, grid, block, shmem, stream, kernel};
}

}  // namespace mpitron::cuda::sim

#define threadIdx (::mpitron::cuda::sim::g_thread->thread)
#define blockIdx (::mpitron::cuda::sim::g_thread->block)
#define blockDim (::mpitron::cuda::sim::g_thread->block_dim)
#define gridDim (::mpitron::cuda::sim::g_thread->grid_dim)
#define warpSize 32

// ---- device math (the device's fast intrinsics as their exact host versions) ---------------
inline float rsqrtf(float x) { return 1.0f / sqrtf(x); }
inline float __expf(float x) { return expf(x); }
inline float __logf(float x) { return logf(x); }
inline float __fdividef(float a, float b) { return a / b; }

inline void __syncthreads() { ::mpitron::cuda::sim::syncthreads(); }

template <typename T> inline T __shfl_xor_sync(unsigned mask, T v, int lane_mask, int width = 32) {
  static_assert(sizeof(T) <= 8 && std::is_trivially_copyable_v<T>, "__shfl_xor_sync: at most 8-byte values");
  uint64_t in = 0;
  std::memcpy(&in, &v, sizeof(T));
  const uint64_t out = ::mpitron::cuda::sim::shfl_xor(mask, in, lane_mask, width);
  T r;
  std::memcpy(&r, &out, sizeof(T));
  return r;
}

template <typename T> inline T __ldcs(const T* p) {
  ::mpitron::cuda::sim::check_aligned(p, alignof(T), "__ldcs");
  return *p;
}
template <typename T> inline T __ldg(const T* p) {
  ::mpitron::cuda::sim::check_aligned(p, alignof(T), "__ldg");
  return *p;
}
