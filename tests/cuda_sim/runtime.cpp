// tests/cuda_sim/runtime.cpp — the CUDA runtime API of the simulated device.
//
// Device memory is plain host memory (256-byte aligned, like cudaMalloc), so
// AddressSanitizer sees every out-of-bounds access of a kernel or a copy. Every
// stream operation completes before the call returns: streams and events only
// order what already happened (event timing is host wall time).
// MPITRON_CUDA_SIM_DEVICES (default 1) devices, MPITRON_CUDA_SIM_SMS (default 2)
// multiprocessors each: few SMs give small grids, so grid-stride loops go round.
#include <malloc.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>

#include "cuda_runtime.h"
#include "tests/cuda_sim/sim.h"

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/asan_interface.h>
#endif

namespace mpitron::cuda::sim {
namespace {
std::mutex g_mu;
cudaError_t g_last = cudaSuccess;
std::string g_last_what;
thread_local int g_device = 0;

int env_int(const char* name, int def) {
  const char* e = std::getenv(name);
  return e && *e ? std::atoi(e) : def;
}
int device_count() {
  static const int n = env_int("MPITRON_CUDA_SIM_DEVICES", 1);
  return n;
}
cudaError_t ok_or(bool ok, cudaError_t e) { return ok ? cudaSuccess : e; }
}  // namespace

void set_launch_error(cudaError_t e, const std::string& what) {
  std::lock_guard<std::mutex> lock(g_mu);
  g_last = e;
  g_last_what = what;
}

}  // namespace mpitron::cuda::sim

using namespace mpitron::cuda::sim;

struct CUstream_st {
  unsigned flags;
};
struct CUevent_st {
  double ms = 0;
  bool recorded = false;
};

const char* cudaGetErrorName(cudaError_t e) {
  switch (e) {
    case cudaSuccess: return "cudaSuccess";
    case cudaErrorInvalidValue: return "cudaErrorInvalidValue";
    case cudaErrorMemoryAllocation: return "cudaErrorMemoryAllocation";
    case cudaErrorInvalidConfiguration: return "cudaErrorInvalidConfiguration";
    case cudaErrorNoDevice: return "cudaErrorNoDevice";
    case cudaErrorInvalidDevice: return "cudaErrorInvalidDevice";
    case cudaErrorNotReady: return "cudaErrorNotReady";
    case cudaErrorMisalignedAddress: return "cudaErrorMisalignedAddress";
    case cudaErrorLaunchFailure: return "cudaErrorLaunchFailure";
  }
  return "cudaErrorUnknown";
}

const char* cudaGetErrorString(cudaError_t e) {
  // The detail of the last failed launch (kernel, block, what went wrong), else the generic text.
  static thread_local std::string s;
  {
    std::lock_guard<std::mutex> lock(g_mu);
    if (e != cudaSuccess && !g_last_what.empty()) {
      s = "simulated device: " + g_last_what;
      return s.c_str();
    }
  }
  switch (e) {
    case cudaSuccess: return "no error";
    case cudaErrorNoDevice: return "no CUDA-capable device is detected";
    case cudaErrorInvalidDevice: return "invalid device ordinal";
    case cudaErrorInvalidValue: return "invalid argument";
    case cudaErrorMemoryAllocation: return "out of memory";
    default: return cudaGetErrorName(e);
  }
}

cudaError_t cudaGetLastError() {
  std::lock_guard<std::mutex> lock(g_mu);
  const cudaError_t e = g_last;
  g_last = cudaSuccess;
  return e;
}
cudaError_t cudaPeekAtLastError() {
  std::lock_guard<std::mutex> lock(g_mu);
  return g_last;
}

cudaError_t cudaGetDeviceCount(int* n) {
  *n = device_count();
  return ok_or(*n > 0, cudaErrorNoDevice);
}
cudaError_t cudaSetDevice(int d) {
  if (d < 0 || d >= device_count()) return cudaErrorInvalidDevice;
  g_device = d;
  return cudaSuccess;
}
cudaError_t cudaGetDevice(int* d) {
  *d = g_device;
  return cudaSuccess;
}
cudaError_t cudaDeviceGetAttribute(int* v, cudaDeviceAttr a, int d) {
  if (d < 0 || d >= device_count()) return cudaErrorInvalidDevice;
  if (a != cudaDevAttrMultiProcessorCount) return cudaErrorInvalidValue;
  static const int sms = env_int("MPITRON_CUDA_SIM_SMS", 2);
  *v = sms;
  return cudaSuccess;
}
cudaError_t cudaDeviceSynchronize() { return cudaSuccess; }
cudaError_t cudaMemGetInfo(size_t* free_bytes, size_t* total_bytes) {
  *free_bytes = *total_bytes = size_t(16) << 30;
  return cudaSuccess;
}

cudaError_t cudaMalloc(void** p, size_t bytes) {
  *p = nullptr;
  if (bytes == 0) return cudaSuccess;
  *p = std::aligned_alloc(256, (bytes + 255) / 256 * 256);
  return ok_or(*p != nullptr, cudaErrorMemoryAllocation);
}
cudaError_t cudaFree(void* p) {
#if defined(__SANITIZE_ADDRESS__)
  if (p) ASAN_UNPOISON_MEMORY_REGION(p, malloc_usable_size(p));  // the caching allocator poisons cached blocks
#endif
  std::free(p);
  return cudaSuccess;
}
cudaError_t cudaMemcpy(void* dst, const void* src, size_t bytes, cudaMemcpyKind) {
  if (bytes && (!dst || !src)) return cudaErrorInvalidValue;
  if (bytes) std::memmove(dst, src, bytes);
  return cudaSuccess;
}
cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind, cudaStream_t) {
  return cudaMemcpy(dst, src, bytes, kind);
}
cudaError_t cudaMemset(void* p, int v, size_t bytes) {
  if (bytes && !p) return cudaErrorInvalidValue;
  if (bytes) std::memset(p, v, bytes);
  return cudaSuccess;
}
cudaError_t cudaMemsetAsync(void* p, int v, size_t bytes, cudaStream_t) { return cudaMemset(p, v, bytes); }

cudaError_t cudaStreamCreate(cudaStream_t* s) { return cudaStreamCreateWithFlags(s, cudaStreamDefault); }
cudaError_t cudaStreamCreateWithFlags(cudaStream_t* s, unsigned flags) {
  *s = new CUstream_st{flags};
  return cudaSuccess;
}
cudaError_t cudaStreamGetFlags(cudaStream_t s, unsigned* flags) {
  if (!flags) return cudaErrorInvalidValue;
  *flags = s ? s->flags : cudaStreamDefault;  // the legacy default stream is blocking
  return cudaSuccess;
}
cudaError_t cudaStreamDestroy(cudaStream_t s) {
  delete s;
  return cudaSuccess;
}
cudaError_t cudaStreamSynchronize(cudaStream_t) { return cudaSuccess; }
cudaError_t cudaStreamWaitEvent(cudaStream_t, cudaEvent_t e, unsigned) { return ok_or(e != nullptr, cudaErrorInvalidValue); }

cudaError_t cudaEventCreate(cudaEvent_t* e) { return cudaEventCreateWithFlags(e, cudaEventDefault); }
cudaError_t cudaEventCreateWithFlags(cudaEvent_t* e, unsigned) {
  *e = new CUevent_st;
  return cudaSuccess;
}
cudaError_t cudaEventDestroy(cudaEvent_t e) {
  delete e;
  return cudaSuccess;
}
cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t) {
  if (!e) return cudaErrorInvalidValue;
  e->ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now().time_since_epoch()).count();
  e->recorded = true;
  return cudaSuccess;
}
cudaError_t cudaEventSynchronize(cudaEvent_t e) { return ok_or(e != nullptr, cudaErrorInvalidValue); }
cudaError_t cudaEventQuery(cudaEvent_t e) { return ok_or(e != nullptr, cudaErrorInvalidValue); }
cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t a, cudaEvent_t b) {
  if (!a || !b || !a->recorded || !b->recorded) return cudaErrorInvalidValue;
  *ms = static_cast<float>(b->ms - a->ms);
  return cudaSuccess;
}
