#include "core/allocator.h"

#include "core/error.h"

#ifdef MPITRON_WITH_CUDA
#include <cuda_runtime.h>
#endif
#if defined(MPITRON_CUDA_SIM) && defined(__SANITIZE_ADDRESS__)
// The simulated device (tensor/cuda/sim): a block's slack beyond the bytes asked
// for, and every cached block, are poisoned, so AddressSanitizer reports a kernel
// that reads past its tensor or into released memory.
#include <sanitizer/asan_interface.h>
#define MPT_SIM_POISON(p, n) ASAN_POISON_MEMORY_REGION(p, n)
#define MPT_SIM_UNPOISON(p, n) ASAN_UNPOISON_MEMORY_REGION(p, n)
#else
#define MPT_SIM_POISON(p, n) ((void)0)
#define MPT_SIM_UNPOISON(p, n) ((void)0)
#endif

namespace mpitron {

CachingAllocator::CachingAllocator(std::unique_ptr<RawAllocator> raw) : raw_(std::move(raw)) {}

CachingAllocator::~CachingAllocator() {
  // Live blocks at destruction belong to tensors that outlived the allocator
  // (process exit); only the cache is ours to return.
  empty_cache();
}

size_t CachingAllocator::size_class(size_t bytes) {
  constexpr size_t kSmall = 512, kLarge = size_t(2) << 20, kLimit = size_t(1) << 20;
  if (bytes == 0) bytes = 1;
  if (bytes < kLimit) return (bytes + kSmall - 1) / kSmall * kSmall;
  return (bytes + kLarge - 1) / kLarge * kLarge;
}

void* CachingAllocator::allocate(size_t bytes, Stream stream) {
  const size_t size = size_class(bytes);
  std::lock_guard<std::mutex> lock(mu_);
  void* p = nullptr;
  auto it = free_.find({stream.handle(), size});
  if (it != free_.end() && !it->second.empty()) {
    p = it->second.back();
    it->second.pop_back();
    st_.cached_bytes -= size;
    st_.cache_hits++;
  } else {
    p = raw_->raw_alloc(size);
    if (!p) {
      // Out of memory: give back everything cached and try once more.
      for (auto& [key, blocks] : free_)
        for (void* b : blocks) raw_->raw_free(b);
      free_.clear();
      st_.reserved_bytes -= st_.cached_bytes;
      st_.cached_bytes = 0;
      p = raw_->raw_alloc(size);
    }
    if (!p)
      MPT_THROW(str("out of device memory allocating ", bytes, " bytes (", st_.current_bytes,
                    " bytes live, peak ", st_.peak_bytes, ")"),
                "reduce --micro-batch-size, enable --recompute-activations, or use more GPUs");
    st_.raw_allocs++;
    st_.reserved_bytes += size;
  }
  MPT_SIM_UNPOISON(p, size);
  MPT_SIM_POISON(static_cast<char*>(p) + bytes, size - bytes);
  live_[p] = Block{size, stream.handle()};
  st_.current_bytes += size;
  if (st_.current_bytes > st_.peak_bytes) st_.peak_bytes = st_.current_bytes;
  return p;
}

void CachingAllocator::release(void* p) {
  if (!p) return;
  std::lock_guard<std::mutex> lock(mu_);
  auto it = live_.find(p);
  MPT_CHECK(it != live_.end(), "release of a pointer this allocator did not hand out",
            "this is a bug in mpitron: please report it");
  const Block b = it->second;
  live_.erase(it);
  st_.current_bytes -= b.size;
  st_.cached_bytes += b.size;
  MPT_SIM_POISON(p, b.size);
  free_[{b.stream, b.size}].push_back(p);
}

void CachingAllocator::empty_cache() {
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& [key, blocks] : free_)
    for (void* b : blocks) raw_->raw_free(b);
  free_.clear();
  st_.reserved_bytes -= st_.cached_bytes;
  st_.cached_bytes = 0;
}

AllocatorStats CachingAllocator::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return st_;
}

void CachingAllocator::reset_peak() {
  std::lock_guard<std::mutex> lock(mu_);
  st_.peak_bytes = st_.current_bytes;
}

#ifdef MPITRON_WITH_CUDA
namespace {
class CudaRaw final : public RawAllocator {
 public:
  explicit CudaRaw(int dev) : dev_(dev) {}
  void* raw_alloc(size_t bytes) override {
    int prev = 0;
    cudaGetDevice(&prev);
    if (prev != dev_) cudaSetDevice(dev_);
    void* p = nullptr;
    if (cudaMalloc(&p, bytes) != cudaSuccess) {
      cudaGetLastError();
      p = nullptr;
    }
    if (prev != dev_) cudaSetDevice(prev);
    return p;
  }
  void raw_free(void* p) override { cudaFree(p); }

 private:
  int dev_;
};
}  // namespace
#endif

CachingAllocator& cuda_caching_allocator(int index) {
#ifdef MPITRON_WITH_CUDA
  MPT_CHECK(cuda_available(), "CUDA memory requested", cuda_unavailable_reason());
  static std::mutex mu;
  static std::map<int, std::unique_ptr<CachingAllocator>> allocators;
  std::lock_guard<std::mutex> lock(mu);
  auto& a = allocators[index];
  if (!a) a = std::make_unique<CachingAllocator>(std::make_unique<CudaRaw>(index));
  return *a;
#else
  MPT_THROW(str("CUDA memory requested on device ", index), cuda_unavailable_reason());
#endif
}

}  // namespace mpitron
