// tensor/cuda/common.cu — device properties, the cuBLASLt handle per device and
// the cuBLASLt workspace per (device, stream). See common.cuh.
#include <map>
#include <mutex>
#include <utility>

#include "tensor/cuda/common.cuh"

namespace mpitron::cuda {

namespace {
std::mutex g_mu;
}  // namespace

int num_sms() {
  int dev = 0;
  MPT_CUDA_CHECK(cudaGetDevice(&dev));
  static std::map<int, int> cache;
  std::lock_guard<std::mutex> lock(g_mu);
  auto it = cache.find(dev);
  if (it != cache.end()) return it->second;
  int sms = 0;
  MPT_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  cache[dev] = sms;
  return sms;
}

int grid_for(int64_t n, int threads, int blocks_per_sm) {
  const int64_t need = (n + threads - 1) / threads;
  const int64_t cap = static_cast<int64_t>(num_sms()) * blocks_per_sm;
  return static_cast<int>(std::max<int64_t>(1, std::min(need, cap)));
}

cublasLtHandle_t cublaslt_handle(int device) {
  static std::map<int, cublasLtHandle_t> handles;  // lives for the process (no teardown-order issues)
  std::lock_guard<std::mutex> lock(g_mu);
  auto it = handles.find(device);
  if (it != handles.end()) return it->second;
  cublasLtHandle_t h = nullptr;
  MPT_CUBLAS_CHECK(cublasLtCreate(&h));
  handles[device] = h;
  return h;
}

void* cublaslt_workspace(int device, Stream s, size_t* bytes) {
  // 32 MiB: what NVIDIA recommends for Hopper (split-K and stream-K kernels use it).
  constexpr size_t kBytes = size_t(32) << 20;
  static std::map<std::pair<int, void*>, void*> ws;
  {
    std::lock_guard<std::mutex> lock(g_mu);
    auto it = ws.find({device, s.handle()});
    if (it != ws.end()) {
      *bytes = kBytes;
      return it->second;
    }
  }
  // Held for the process lifetime: never released, so never reused by anything else.
  void* p = cuda_caching_allocator(device).allocate(kBytes, s);
  std::lock_guard<std::mutex> lock(g_mu);
  auto [it, inserted] = ws.emplace(std::make_pair(device, s.handle()), p);
  if (!inserted) cuda_caching_allocator(device).release(p);
  *bytes = kBytes;
  return it->second;
}

}  // namespace mpitron::cuda
