#include "core/allocator.h"

#include <algorithm>
#include <vector>

#include "core/error.h"

#ifdef MPITRON_WITH_CUDA
#include <cuda_runtime.h>
#endif
#if defined(MPITRON_CUDA_SIM)
// The simulated device (tests/cuda_sim) is told of every block handed out and
// released (its tool interface, like AddressSanitizer's): its race check then knows
// each block as an allocation made at the caller, and remembers the last accesses
// of reused bytes; under AddressSanitizer it poisons the slack past the bytes asked
// for and every cached block, in stream order, so a kernel that reads past its
// tensor or into released memory is reported.
#include <cuda_sim_tools.h>
#define MPT_SIM_BLOCK_ALLOCATED(p, n, size, s) cudaSimBlockAllocated(p, n, size, static_cast<cudaStream_t>(s))
#define MPT_SIM_BLOCK_RELEASED(p, size, s) cudaSimBlockReleased(p, size, static_cast<cudaStream_t>(s))
#define MPT_SIM_DRAIN() cudaDeviceSynchronize()  // queued poisoning of the segment's blocks runs first
#else
#define MPT_SIM_DRAIN() ((void)0)
#define MPT_SIM_BLOCK_ALLOCATED(p, n, size, s) ((void)0)
#define MPT_SIM_BLOCK_RELEASED(p, size, s) ((void)0)
#endif
#if defined(MPITRON_CUDA_SIM) && defined(__SANITIZE_ADDRESS__)
// A new segment is all poisoned until blocks are handed out from it (nothing queued uses it yet).
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
  empty_cache();
  // Live blocks at destruction belong to tensors that outlived the allocator
  // (process exit): their segments stay with the raw allocator, only the records
  // go (every block left, free or live, is in a segment with a live block).
  std::set<Block*> firsts;
  for (auto& [p, b] : live_) {
    Block* f = b;
    while (f->prev) f = f->prev;
    firsts.insert(f);
  }
  for (Block* f : firsts)
    for (Block* x = f; x;) {
      Block* next = x->next;
      delete x;
      x = next;
    }
}

bool CachingAllocator::BySize::operator()(const Block* a, const Block* b) const {
  if (a->stream != b->stream) return std::less<void*>()(a->stream, b->stream);
  if (a->size != b->size) return a->size < b->size;
  return std::less<char*>()(a->ptr, b->ptr);
}

size_t CachingAllocator::size_class(size_t bytes) {
  if (bytes == 0) bytes = 1;
  return (bytes + kRound - 1) / kRound * kRound;
}

size_t CachingAllocator::segment_size(size_t block_bytes) {
  if (block_bytes < kSmallLimit) return kSegment;
  return (block_bytes + kSegment - 1) / kSegment * kSegment;
}

CachingAllocator::Block* CachingAllocator::best_fit(size_t size, void* stream, bool small) {
  FreeSet& free = pool(small);
  Block key{nullptr, size, stream, small};
  auto it = free.lower_bound(&key);  // smallest block of this stream with size >= size
  if (it == free.end() || (*it)->stream != stream) return nullptr;
  Block* b = *it;
  free.erase(it);
  return b;
}

CachingAllocator::Block* CachingAllocator::new_segment(size_t size, void* stream, bool small) {
  void* p = raw_->raw_alloc(size);
  if (!p) return nullptr;
  st_.raw_allocs++;
  st_.reserved_bytes += size;
  st_.peak_reserved_bytes = std::max(st_.peak_reserved_bytes, st_.reserved_bytes);
  MPT_SIM_POISON(p, size);
  return new Block{static_cast<char*>(p), size, stream, small};
}

void CachingAllocator::split(Block* b, size_t size) {
  const size_t rest = b->size - size;
  // A large-pool leftover of 1 MiB or less is not worth a block (it would only
  // serve small requests, which have their own pool): it stays with b.
  if (b->small ? rest < kRound : rest <= kSmallLimit) return;
  Block* r = new Block{b->ptr + size, rest, b->stream, b->small};
  r->prev = b;
  r->next = b->next;
  if (b->next) b->next->prev = r;
  b->next = r;
  b->size = size;
  pool(b->small).insert(r);
  st_.splits++;
}

void CachingAllocator::free_segment(Block* b) {
  pool(b->small).erase(b);
  MPT_SIM_DRAIN();
  MPT_SIM_UNPOISON(b->ptr, b->size);
  raw_->raw_free(b->ptr);
  st_.reserved_bytes -= b->size;
  st_.raw_frees++;
  delete b;
}

bool CachingAllocator::release_segments(size_t want) {
  std::vector<Block*> whole;
  for (FreeSet* f : {&free_small_, &free_large_})
    for (Block* b : *f)
      if (!b->prev && !b->next) whole.push_back(b);
  std::sort(whole.begin(), whole.end(), [](const Block* a, const Block* b) { return a->size > b->size; });
  size_t freed = 0;
  for (Block* b : whole) {
    if (freed >= want) break;
    freed += b->size;
    free_segment(b);
  }
  return freed > 0;
}

void CachingAllocator::release_all_segments() { release_segments(SIZE_MAX); }

void* CachingAllocator::allocate(size_t bytes, Stream stream) {
  const size_t size = size_class(bytes);
  const bool small = size < kSmallLimit;
  std::lock_guard<std::mutex> lock(mu_);
  Block* b = best_fit(size, stream.handle(), small);
  if (b) {
    st_.cache_hits++;
  } else {
    const size_t seg = segment_size(size);
    b = new_segment(seg, stream.handle(), small);
    // Out of memory: give back free segments covering the request, then all of them.
    if (!b && release_segments(seg)) b = new_segment(seg, stream.handle(), small);
    if (!b) {
      release_all_segments();
      b = new_segment(seg, stream.handle(), small);
    }
    if (!b)
      MPT_THROW(str("out of device memory allocating ", bytes, " bytes (", st_.current_bytes, " bytes live, ",
                    st_.reserved_bytes, " reserved, peak live ", st_.peak_bytes, ")"),
                "reduce --micro-batch-size, enable --recompute-activations, or use more GPUs");
  }
  split(b, size);
  MPT_SIM_BLOCK_ALLOCATED(b->ptr, bytes, b->size, b->stream);
  b->allocated = true;
  live_[b->ptr] = b;
  st_.current_bytes += b->size;
  st_.peak_bytes = std::max(st_.peak_bytes, st_.current_bytes);
  return b->ptr;
}

void CachingAllocator::release(void* p) {
  if (!p) return;
  std::lock_guard<std::mutex> lock(mu_);
  auto it = live_.find(p);
  MPT_CHECK(it != live_.end(), "release of a pointer this allocator did not hand out",
            "this is a bug in mpitron: please report it");
  Block* b = it->second;
  live_.erase(it);
  b->allocated = false;
  st_.current_bytes -= b->size;
  MPT_SIM_BLOCK_RELEASED(b->ptr, b->size, b->stream);
  FreeSet& free = pool(b->small);
  if (Block* prev = b->prev; prev && !prev->allocated) {  // merge into the free block before
    free.erase(prev);
    prev->size += b->size;
    prev->next = b->next;
    if (b->next) b->next->prev = prev;
    delete b;
    b = prev;
  }
  if (Block* next = b->next; next && !next->allocated) {  // absorb the free block after
    free.erase(next);
    b->size += next->size;
    b->next = next->next;
    if (next->next) next->next->prev = b;
    delete next;
  }
  free.insert(b);
}

void CachingAllocator::empty_cache() {
  std::lock_guard<std::mutex> lock(mu_);
  release_all_segments();
}

AllocatorStats CachingAllocator::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  AllocatorStats s = st_;
  s.cached_bytes = s.reserved_bytes - s.current_bytes;
  return s;
}

void CachingAllocator::reset_peak() {
  std::lock_guard<std::mutex> lock(mu_);
  st_.peak_bytes = st_.current_bytes;
  st_.peak_reserved_bytes = st_.reserved_bytes;
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
