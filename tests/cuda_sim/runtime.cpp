// tests/cuda_sim/runtime.cpp — the CUDA runtime API of the simulated device.
//
// Device memory is plain host memory (256-byte aligned, like cudaMalloc), so
// AddressSanitizer sees every out-of-bounds access of a kernel or a copy. Copies,
// memsets and event records are stream operations (streams.cpp): they return
// once queued, with CUDA's exceptions for pageable host memory — a copy from host
// memory reads its source before returning (staging), a copy into host memory
// returns when it is done. cudaMalloc'd memory is tracked for the race check
// (race.cpp); cudaFree synchronises the device first, as CUDA's does.
// MPITRON_CUDA_SIM_DEVICES (default 1) devices, MPITRON_CUDA_SIM_SMS (default 2)
// multiprocessors each: few SMs give small grids, so grid-stride loops go round.
#include <malloc.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <set>
#include <string>

#include "cuda_runtime.h"
#include "tests/cuda_sim/sim.h"

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/asan_interface.h>
#endif

namespace mpitron::cuda::sim {
namespace {
std::mutex& g_mu = *new std::mutex;  // never destroyed: workers may report errors during exit
cudaError_t g_last = cudaSuccess;   // the last failed call's, or work's (cudaGetLastError clears it)
cudaError_t g_async = cudaSuccess;  // the first failure of queued work: sticky, returned by synchronisation
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

void set_async_error(cudaError_t e, const std::string& what) {
  std::lock_guard<std::mutex> lock(g_mu);
  g_last = e;
  if (g_async == cudaSuccess) g_async = e;
  g_last_what = what;
}

cudaError_t pending_error() {
  std::lock_guard<std::mutex> lock(g_mu);
  return g_async;
}

const char* intern(const std::string& name) {
  static auto* names = new std::set<std::string>;
  std::lock_guard<std::mutex> lock(g_mu);
  return names->insert(name).first->c_str();
}

}  // namespace mpitron::cuda::sim

using namespace mpitron::cuda::sim;

// An event: the operation of a stream it captured at its last record, and what
// that stream's clock knew then. Shared with the marker operation that stamps the time.
struct EventState {
  std::mutex mu;
  Stream* stream = nullptr;  // null: never recorded
  uint64_t seq = 0;
  Clock clock;
  double ms = 0;  // host wall time when the marker ran
};
struct CUevent_st {
  std::shared_ptr<EventState> s = std::make_shared<EventState>();
};

namespace {
double now_ms() {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now().time_since_epoch()).count();
}
cudaError_t refuse_open_group(const char* call, Stream* st) {
  const std::string open = open_nccl_group_on(st);
  if (open.empty()) return cudaSuccess;
  std::fprintf(stderr, "cuda-sim: %s: %s\n", call, open.c_str());
  set_launch_error(cudaErrorIllegalState, std::string(call) + ": " + open);
  return cudaErrorIllegalState;
}
}  // namespace

const char* cudaGetErrorName(cudaError_t e) {
  switch (e) {
    case cudaSuccess: return "cudaSuccess";
    case cudaErrorInvalidValue: return "cudaErrorInvalidValue";
    case cudaErrorMemoryAllocation: return "cudaErrorMemoryAllocation";
    case cudaErrorInvalidConfiguration: return "cudaErrorInvalidConfiguration";
    case cudaErrorNoDevice: return "cudaErrorNoDevice";
    case cudaErrorInvalidDevice: return "cudaErrorInvalidDevice";
    case cudaErrorNotReady: return "cudaErrorNotReady";
    case cudaErrorIllegalState: return "cudaErrorIllegalState";
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
cudaError_t cudaMemGetInfo(size_t* free_bytes, size_t* total_bytes) {
  *free_bytes = *total_bytes = size_t(16) << 30;
  return cudaSuccess;
}

cudaError_t cudaMalloc(void** p, size_t bytes) {
  *p = nullptr;
  if (bytes == 0) return cudaSuccess;
  const size_t rounded = (bytes + 255) / 256 * 256;
  *p = std::aligned_alloc(256, rounded);
  if (!*p) return cudaErrorMemoryAllocation;
  track_segment(*p, rounded);
  return cudaSuccess;
}
cudaError_t cudaFree(void* p) {
  if (!p) return cudaSuccess;
  host_wait_all();  // CUDA's cudaFree synchronises the device
  untrack_segment(p);
#if defined(__SANITIZE_ADDRESS__)
  ASAN_UNPOISON_MEMORY_REGION(p, malloc_usable_size(p));  // the caching allocator poisons cached blocks
#endif
  std::free(p);
  return cudaSuccess;
}

cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t bytes, cudaMemcpyKind, cudaStream_t s) {
  if (!bytes) return cudaSuccess;
  if (!dst || !src) return cudaErrorInvalidValue;
  const bool dev_src = is_device_memory(src), dev_dst = is_device_memory(dst);
  std::vector<Access> acc;
  if (dev_src) acc.push_back({src, bytes, false});
  if (dev_dst) acc.push_back({dst, bytes, true});
  std::function<void()> work;
  if (dev_src) {
    work = [dst, src, bytes] { std::memmove(dst, src, bytes); };
  } else {  // pageable host source: staged before the call returns
    auto staged = std::make_shared<std::vector<char>>(static_cast<const char*>(src), static_cast<const char*>(src) + bytes);
    work = [dst, staged] { std::memcpy(dst, staged->data(), staged->size()); };
  }
  Stream* st = stream_of(s);
  const QueueResult r = queue(st, "cudaMemcpyAsync", std::move(acc), std::move(work));
  if (r.err != cudaSuccess) return r.err;
  if (!dev_dst) {  // pageable host destination: the call returns when the copy is done
    host_wait(st, r.seq);
    host_join(clock_of(st));
  }
  return cudaSuccess;
}
cudaError_t cudaMemcpy(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind) {
  const cudaError_t e = cudaMemcpyAsync(dst, src, bytes, kind, nullptr);
  if (e != cudaSuccess) return e;
  host_wait(stream_of(nullptr));
  return cudaSuccess;
}
cudaError_t cudaMemsetAsync(void* p, int v, size_t bytes, cudaStream_t s) {
  if (!bytes) return cudaSuccess;
  if (!p) return cudaErrorInvalidValue;
  return queue(stream_of(s), "cudaMemsetAsync", {{p, bytes, true}}, [p, v, bytes] { std::memset(p, v, bytes); }).err;
}
cudaError_t cudaMemset(void* p, int v, size_t bytes) {
  const cudaError_t e = cudaMemsetAsync(p, v, bytes, nullptr);
  if (e != cudaSuccess) return e;
  host_wait(stream_of(nullptr));
  return cudaSuccess;
}

cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned) {
  if (!e) return cudaErrorInvalidValue;
  Stream* src;
  uint64_t seq;
  Clock c;
  {
    std::lock_guard<std::mutex> lock(e->s->mu);
    if (!e->s->stream) return cudaSuccess;  // never recorded: nothing to wait for (CUDA)
    src = e->s->stream;
    seq = e->s->seq;
    c = e->s->clock;
  }
  Stream* st = stream_of(s);
  stream_join(st, c);
  return queue(st, "cudaStreamWaitEvent", {}, [] {}, {{src, seq}}, false).err;
}

cudaError_t cudaEventCreate(cudaEvent_t* e) { return cudaEventCreateWithFlags(e, cudaEventDefault); }
cudaError_t cudaEventCreateWithFlags(cudaEvent_t* e, unsigned) {
  if (!e) return cudaErrorInvalidValue;
  *e = new CUevent_st;
  return cudaSuccess;
}
cudaError_t cudaEventDestroy(cudaEvent_t e) {
  delete e;  // a pending record keeps its state alive
  return cudaSuccess;
}
cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s) {
  if (!e) return cudaErrorInvalidValue;
  Stream* st = stream_of(s);
  if (const cudaError_t g = refuse_open_group("cudaEventRecord", st); g != cudaSuccess) return g;
  std::shared_ptr<EventState> es = e->s;
  const QueueResult r = queue(st, "cudaEventRecord", {}, [es] {
    std::lock_guard<std::mutex> lock(es->mu);
    es->ms = now_ms();
  }, {}, false);
  if (r.err != cudaSuccess) return r.err;
  Clock c = clock_of(st);
  std::lock_guard<std::mutex> lock(es->mu);
  es->stream = st;
  es->seq = r.seq;
  es->clock = std::move(c);
  return cudaSuccess;
}
cudaError_t cudaEventQuery(cudaEvent_t e) {
  if (!e) return cudaErrorInvalidValue;
  Stream* st;
  uint64_t seq;
  Clock c;
  {
    std::lock_guard<std::mutex> lock(e->s->mu);
    if (!e->s->stream) return cudaSuccess;  // never recorded: complete (CUDA)
    st = e->s->stream;
    seq = e->s->seq;
    c = e->s->clock;
  }
  if (!finished(st, seq)) return cudaErrorNotReady;
  host_join(c);
  return cudaSuccess;
}
cudaError_t cudaEventSynchronize(cudaEvent_t e) {
  if (!e) return cudaErrorInvalidValue;
  Stream* st;
  uint64_t seq;
  Clock c;
  {
    std::lock_guard<std::mutex> lock(e->s->mu);
    if (!e->s->stream) return cudaSuccess;
    st = e->s->stream;
    seq = e->s->seq;
    c = e->s->clock;
  }
  host_wait(st, seq);
  host_join(c);
  return pending_error();
}
cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t a, cudaEvent_t b) {
  if (!a || !b || !ms) return cudaErrorInvalidValue;
  for (cudaEvent_t e : {a, b}) {
    std::lock_guard<std::mutex> lock(e->s->mu);
    if (!e->s->stream) return cudaErrorInvalidValue;
  }
  for (cudaEvent_t e : {a, b})
    if (cudaEventQuery(e) != cudaSuccess) return cudaErrorNotReady;
  double ta, tb;
  {
    std::lock_guard<std::mutex> lock(a->s->mu);
    ta = a->s->ms;
  }
  {
    std::lock_guard<std::mutex> lock(b->s->mu);
    tb = b->s->ms;
  }
  *ms = static_cast<float>(tb - ta);
  return cudaSuccess;
}
