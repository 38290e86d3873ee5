#include "core/device.h"
#include "core/device_memory.h"

#include <chrono>
#include <mutex>

#include <unistd.h>
#include <cstdint>

#include "core/error.h"

#ifdef MPITRON_WITH_CUDA
#include <cuda_runtime.h>
// Stream() (a null handle) must mean the LEGACY default stream, which orders
// itself with every blocking stream: --default-stream per-thread would make it
// a per-thread stream and break the ordering of to()/item() (docs/cuda.md).
#if defined(CUDA_API_PER_THREAD_DEFAULT_STREAM)
#error "mpitron requires the legacy default stream: do not build with --default-stream per-thread"
#endif
#define MPT_CUDA_OK(call)                                                                   \
  do {                                                                                     \
    cudaError_t e_ = (call);                                                               \
    if (e_ != cudaSuccess) MPT_THROW(::mpitron::str(#call, ": ", cudaGetErrorString(e_)), ""); \
  } while (0)
#endif

namespace mpitron {

std::string Device::name() const { return is_cpu() ? "cpu" : str("cuda:", index); }

namespace {
struct CudaProbe {
  int count = 0;
  std::string reason;
};
const CudaProbe& probe() {
  static const CudaProbe p = [] {
    CudaProbe r;
#ifdef MPITRON_WITH_CUDA
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess) {
      r.reason = str("no usable CUDA device: ", cudaGetErrorString(e));
      cudaGetLastError();  // clear the sticky error so later calls are not confused
    } else if (n == 0) {
      r.reason = "no CUDA device found";
    } else {
      r.count = n;
    }
#else
    r.reason = "built without CUDA (MPITRON_CUDA=OFF or nvcc not found at configure time)";
#endif
    return r;
  }();
  return p;
}
double now_ms() {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}
}  // namespace

bool cuda_available() { return probe().count > 0; }
std::string cuda_unavailable_reason() { return probe().reason; }
int cuda_device_count() { return probe().count; }

void cuda_set_device(int index) {
  MPT_CHECK(index >= 0 && index < cuda_device_count(),
            str("CUDA device ", index, " requested but ", cuda_device_count(), " present"),
            cuda_available() ? "pick a device index below the count" : cuda_unavailable_reason());
#ifdef MPITRON_WITH_CUDA
  MPT_CUDA_OK(cudaSetDevice(index));
#endif
}

int cuda_current_device() {
#ifdef MPITRON_WITH_CUDA
  if (!cuda_available()) return -1;
  int d = 0;
  MPT_CUDA_OK(cudaGetDevice(&d));
  return d;
#else
  return -1;
#endif
}

int64_t device_memory_bytes(const Device& d) {
#ifdef MPITRON_WITH_CUDA
  if (d.is_cuda() && cuda_available()) {
    size_t free_b = 0, total_b = 0;
    int prev = 0;
    MPT_CUDA_OK(cudaGetDevice(&prev));
    MPT_CUDA_OK(cudaSetDevice(d.index));
    MPT_CUDA_OK(cudaMemGetInfo(&free_b, &total_b));
    MPT_CUDA_OK(cudaSetDevice(prev));
    return static_cast<int64_t>(total_b);
  }
#endif
  (void)d;
  const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGE_SIZE);
  return pages > 0 && page > 0 ? static_cast<int64_t>(pages) * page : INT64_MAX;
}

// The ordering invariant (docs/cuda.md, "Streams and ordering"): every stream
// an mpitron op runs on is ordered with the legacy default stream. Tensor::to(),
// item(), to_floats() and the host copies queue on the default stream and then
// synchronise it; a blocking stream (cudaStreamDefault) waits for the default
// stream's earlier work and the default stream waits for its work, so those
// stay correct when work moves to another stream. A non-blocking stream would
// not be: it is reserved for code that orders itself with events (the NCCL
// communicator's stream), and is never handed out here.
Stream Stream::create() {
#ifdef MPITRON_WITH_CUDA
  MPT_CHECK(cuda_available(), "cannot create a CUDA stream", cuda_unavailable_reason());
  cudaStream_t s;
  MPT_CUDA_OK(cudaStreamCreateWithFlags(&s, cudaStreamDefault));
  unsigned flags = 0;
  MPT_CUDA_OK(cudaStreamGetFlags(s, &flags));
  MPT_CHECK(!(flags & cudaStreamNonBlocking), "a new CUDA stream is non-blocking",
            "mpitron's ordering needs streams that synchronise with the legacy default stream (docs/cuda.md)");
  return Stream(s);
#else
  return Stream();
#endif
}

void Stream::destroy() {
#ifdef MPITRON_WITH_CUDA
  if (handle_) cudaStreamDestroy(static_cast<cudaStream_t>(handle_));
#endif
  handle_ = nullptr;
}

void Stream::synchronize() const {
#ifdef MPITRON_WITH_CUDA
  if (cuda_available()) MPT_CUDA_OK(cudaStreamSynchronize(static_cast<cudaStream_t>(handle_)));
#endif
}

Event::Event() {
#ifdef MPITRON_WITH_CUDA
  if (cuda_available()) {
    cudaEvent_t e;
    MPT_CUDA_OK(cudaEventCreate(&e));
    ev_ = e;
  }
#endif
}

Event::~Event() {
#ifdef MPITRON_WITH_CUDA
  if (ev_) cudaEventDestroy(static_cast<cudaEvent_t>(ev_));
#endif
}

void Event::record(Stream s) {
#ifdef MPITRON_WITH_CUDA
  if (ev_) {
    MPT_CUDA_OK(cudaEventRecord(static_cast<cudaEvent_t>(ev_), static_cast<cudaStream_t>(s.handle())));
    return;
  }
#endif
  host_ms_ = now_ms();
}

void Event::synchronize() const {
#ifdef MPITRON_WITH_CUDA
  if (ev_) MPT_CUDA_OK(cudaEventSynchronize(static_cast<cudaEvent_t>(ev_)));
#endif
}

bool Event::done() const {
#ifdef MPITRON_WITH_CUDA
  if (ev_) return cudaEventQuery(static_cast<cudaEvent_t>(ev_)) == cudaSuccess;
#endif
  return true;
}

float Event::elapsed_ms(const Event& a, const Event& b) {
#ifdef MPITRON_WITH_CUDA
  if (a.ev_ && b.ev_) {
    float ms = 0;
    MPT_CUDA_OK(cudaEventElapsedTime(&ms, static_cast<cudaEvent_t>(a.ev_), static_cast<cudaEvent_t>(b.ev_)));
    return ms;
  }
#endif
  return static_cast<float>(b.host_ms_ - a.host_ms_);
}

void device_synchronize() {
#ifdef MPITRON_WITH_CUDA
  if (cuda_available()) MPT_CUDA_OK(cudaDeviceSynchronize());
#endif
}

}  // namespace mpitron
