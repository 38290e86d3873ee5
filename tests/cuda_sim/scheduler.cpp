// tests/cuda_sim/scheduler.cpp — runs a kernel launch on the simulated device.
//
// Blocks run one after another (in a seeded permuted order); the threads of a
// block are cooperative fibers on one OS thread (a few lines of x86-64 assembly
// switch stacks: no syscall, no ucontext). A fiber runs until it
// reaches a barrier (__syncthreads, or one of the two warp barriers of a
// __shfl_xor_sync) or returns. When no fiber can run, the scheduler releases a
// barrier only if every thread it waits for is there:
//   * a warp barrier needs all 32 lanes of the warp (the full mask),
//   * __syncthreads needs every thread of the block.
// Anything else (a thread that exited or waits elsewhere) fails the launch with
// a message naming the kernel, the block and who is missing. Between barriers the
// fibers run in a seeded random order (MPITRON_CUDA_SIM_SEED), so a missing barrier
// lets a reader run before its writer.
//
// A launch is checked (configuration at once, as CUDA does; then the race check
// of its pointer arguments) and queued on its stream; the stream's worker runs
// the grid later. One grid runs at a time (`__shared__` is per kernel, not per
// block), so kernels of different streams interleave but never overlap; other
// stream work (copies, collectives) does run beside them.
//
// Every launch is counted per kernel name; at exit the counts are appended to
// $MPITRON_CUDA_SIM_COUNTS (one line "<kernel> <launches>") when that is set,
// with the NCCL stand-in's calls ("nccl:<call> <n>").
#include <sys/mman.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <mutex>
#include <random>
#include <string>
#include <vector>

#include "cuda_runtime.h"
#include "tests/cuda_sim/sim.h"

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/asan_interface.h>
#include <sanitizer/common_interface_defs.h>
#define MPT_SIM_ASAN 1
#endif

#if !defined(__x86_64__)
#error "the simulated CUDA device switches fibers with x86-64 assembly"
#endif

// mpt_sim_switch(save, to): saves the callee-saved registers, MXCSR and the x87
// control word on this stack, stores the stack pointer in *save, and resumes the
// stack `to` (saved the same way, or prepared by new_stack()).
extern "C" void mpt_sim_switch(void** save, void* to);
asm(R"(
.text
.globl mpt_sim_switch
.type mpt_sim_switch, @function
mpt_sim_switch:
  pushq %rbp
  pushq %rbx
  pushq %r12
  pushq %r13
  pushq %r14
  pushq %r15
  subq $8, %rsp
  stmxcsr (%rsp)
  fnstcw 4(%rsp)
  movq %rsp, (%rdi)
  movq %rsi, %rsp
  ldmxcsr (%rsp)
  fldcw 4(%rsp)
  addq $8, %rsp
  popq %r15
  popq %r14
  popq %r13
  popq %r12
  popq %rbx
  popq %rbp
  ret
.size mpt_sim_switch, .-mpt_sim_switch
.section .note.GNU-stack,"",@progbits
.text
)");

namespace mpitron::cuda::sim {

thread_local const ThreadState* g_thread = nullptr;

namespace {

constexpr size_t kStackBytes = size_t(128) << 10;

struct Fiber {
  enum State { Ready, AtSync, AtWarp, Done, Failed };
  void* sp = nullptr;  // saved stack pointer while not running
  ThreadState ts;
  State state = Ready;
  int linear = 0;
  char* stack = nullptr;
};

struct BlockRun {
  const char* kernel = nullptr;
  dim3 block;
  std::vector<Fiber> fibers;
  std::vector<uint64_t> slots;  // one shuffle slot per thread
  void* sched_sp = nullptr;
  const void* sched_stack = nullptr;  // the scheduler's stack (for AddressSanitizer's fiber switches)
  size_t sched_stack_size = 0;
  const std::function<void()>* body = nullptr;
  std::string error;
};

thread_local BlockRun* g_run = nullptr;
thread_local Fiber* g_fiber = nullptr;

std::mutex g_launch_mu;  // one launch at a time: __shared__ is per kernel, not per block
std::map<std::string, long>& counts() {
  static auto* c = new std::map<std::string, long>();
  return *c;
}
std::vector<char*>& stack_pool() {
  static auto* p = new std::vector<char*>();
  return *p;
}
uint64_t g_launches = 0;

uint64_t seed() {
  static const uint64_t s = [] {
    const char* e = std::getenv("MPITRON_CUDA_SIM_SEED");
    return e ? std::strtoull(e, nullptr, 10) : uint64_t(1);
  }();
  return s;
}

std::string where(const BlockRun& r) {
  return std::string("kernel ") + r.kernel + " block (" + std::to_string(r.block.x) + "," +
         std::to_string(r.block.y) + "," + std::to_string(r.block.z) + ")";
}

std::string tid_str(const dim3& t) {
  return "(" + std::to_string(t.x) + "," + std::to_string(t.y) + "," + std::to_string(t.z) + ")";
}

// ---- fiber switches (annotated for AddressSanitizer) ----------------------------------------
void to_scheduler(Fiber& f) {
#ifdef MPT_SIM_ASAN
  void* fake = nullptr;
  __sanitizer_start_switch_fiber(f.state == Fiber::Done ? nullptr : &fake, g_run->sched_stack,
                                 g_run->sched_stack_size);
  mpt_sim_switch(&f.sp, g_run->sched_sp);
  __sanitizer_finish_switch_fiber(fake, nullptr, nullptr);
#else
  mpt_sim_switch(&f.sp, g_run->sched_sp);
#endif
}

void to_fiber(BlockRun& r, Fiber& f) {
  g_fiber = &f;
  g_thread = &f.ts;
#ifdef MPT_SIM_ASAN
  void* fake = nullptr;
  __sanitizer_start_switch_fiber(&fake, f.stack, kStackBytes);
  mpt_sim_switch(&r.sched_sp, f.sp);
  __sanitizer_finish_switch_fiber(fake, nullptr, nullptr);
#else
  mpt_sim_switch(&r.sched_sp, f.sp);
#endif
  g_fiber = nullptr;
  g_thread = nullptr;
}

void fiber_entry() {
#ifdef MPT_SIM_ASAN
  __sanitizer_finish_switch_fiber(nullptr, &g_run->sched_stack, &g_run->sched_stack_size);
#endif
  (*g_run->body)();
  g_fiber->state = Fiber::Done;
  to_scheduler(*g_fiber);  // never resumed
  std::abort();
}

// A fresh stack that mpt_sim_switch "resumes" into fiber_entry (16-byte aligned at its call).
void* new_stack(char* stack) {
  auto* top = reinterpret_cast<uint64_t*>((reinterpret_cast<uintptr_t>(stack + kStackBytes) & ~uintptr_t(15)));
  uint64_t* sp = top - 2;  // return address slot at a 16-byte boundary: rsp ≡ 8 (mod 16) on entry
  sp[0] = reinterpret_cast<uint64_t>(&fiber_entry);
  sp[1] = 0;
  sp -= 6;  // rbp rbx r12 r13 r14 r15 (zero)
  for (int i = 0; i < 6; ++i) sp[i] = 0;
  sp -= 1;  // MXCSR (default: all exceptions masked, round to nearest) and the x87 control word
  const uint32_t mxcsr = 0x1F80, fpcw = 0x037F;
  std::memcpy(reinterpret_cast<char*>(sp), &mxcsr, 4);
  std::memcpy(reinterpret_cast<char*>(sp) + 4, &fpcw, 4);
  return sp;
}

// Called from a simulated thread: fail the launch; this fiber never runs again.
[[noreturn]] void fail_here(const std::string& msg) {
  Fiber& f = *g_fiber;
  if (g_run->error.empty()) g_run->error = where(*g_run) + " thread " + tid_str(f.ts.thread) + ": " + msg;
  f.state = Fiber::Failed;
  to_scheduler(f);
  std::abort();
}

// After a round (no fiber Ready): release a barrier whose threads are all there,
// or describe why none can be released. Returns false when the block is finished.
bool release(BlockRun& r) {
  const int n = static_cast<int>(r.fibers.size());
  int done = 0, at_sync = 0, at_warp = 0;
  for (const Fiber& f : r.fibers) {
    done += f.state == Fiber::Done;
    at_sync += f.state == Fiber::AtSync;
    at_warp += f.state == Fiber::AtWarp;
  }
  if (done == n) return false;
  if (at_warp > 0) {
    for (int w = 0; w * 32 < n; ++w) {
      int here = 0;
      for (int l = 0; l < 32; ++l) here += r.fibers[w * 32 + l].state == Fiber::AtWarp;
      if (here == 0) continue;
      if (here == 32) {
        for (int l = 0; l < 32; ++l) r.fibers[w * 32 + l].state = Fiber::Ready;
        continue;
      }
      std::string missing;
      for (int l = 0; l < 32; ++l) {
        const Fiber& f = r.fibers[w * 32 + l];
        if (f.state == Fiber::AtWarp) continue;
        missing += " lane " + std::to_string(l) + (f.state == Fiber::Done ? " (exited)" : " (at __syncthreads)");
      }
      r.error = where(r) + ": __shfl_xor_sync in warp " + std::to_string(w) + " reached by " + std::to_string(here) +
                " of 32 lanes; missing:" + missing;
      return false;
    }
    return true;
  }
  if (at_sync == n) {
    for (Fiber& f : r.fibers) f.state = Fiber::Ready;
    return true;
  }
  std::string missing;
  int shown = 0;
  for (const Fiber& f : r.fibers)
    if (f.state == Fiber::Done && shown++ < 8) missing += " " + tid_str(f.ts.thread);
  r.error = where(r) + ": __syncthreads reached by " + std::to_string(at_sync) + " of " + std::to_string(n) +
            " threads; " + std::to_string(done) + " exited without it, e.g." + missing;
  return false;
}

void run_block(BlockRun& r, dim3 grid, dim3 block_dim, std::mt19937_64& rng) {
  const int n = static_cast<int>(block_dim.x * block_dim.y * block_dim.z);
  auto& pool = stack_pool();
  while (static_cast<int>(pool.size()) < n) {
    void* s = mmap(nullptr, kStackBytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (s == MAP_FAILED) {
      std::fprintf(stderr, "cuda-sim: out of memory for fiber stacks\n");
      std::abort();
    }
    pool.push_back(static_cast<char*>(s));
  }
  r.fibers.assign(static_cast<size_t>(n), Fiber{});
  r.slots.assign(static_cast<size_t>(n), 0);
  for (int i = 0; i < n; ++i) {
    Fiber& f = r.fibers[i];
    f.linear = i;
    f.stack = pool[i];
#if defined(__SANITIZE_ADDRESS__)
    // A pooled stack keeps the shadow of the frames its last fiber left when it
    // switched away for good (they never returned to unpoison their redzones).
    ASAN_UNPOISON_MEMORY_REGION(f.stack, kStackBytes);
#endif
    f.ts.thread = dim3(i % block_dim.x, (i / block_dim.x) % block_dim.y, i / (block_dim.x * block_dim.y));
    f.ts.block = r.block;
    f.ts.block_dim = block_dim;
    f.ts.grid_dim = grid;
    f.sp = new_stack(f.stack);
  }
  std::vector<int> order(static_cast<size_t>(n));
  for (;;) {
    order.clear();
    for (int i = 0; i < n; ++i)
      if (r.fibers[i].state == Fiber::Ready) order.push_back(i);
    std::shuffle(order.begin(), order.end(), rng);
    for (int i : order) {
      to_fiber(r, r.fibers[i]);
      if (!r.error.empty()) return;
    }
    if (!release(r)) return;
  }
}

}  // namespace

void syncthreads() {
  if (!g_fiber) std::abort();
  g_fiber->state = Fiber::AtSync;
  to_scheduler(*g_fiber);
}

uint64_t shfl_xor(unsigned mask, uint64_t v, int lane_mask, int width) {
  Fiber& f = *g_fiber;
  BlockRun& r = *g_run;
  if (mask != 0xffffffffu) fail_here("__shfl_xor_sync with a partial mask is not simulated");
  if (r.fibers.size() % 32 != 0) fail_here("__shfl_xor_sync with a full mask in a partial warp (block size not a multiple of 32)");
  if (width != 32 || lane_mask < 0 || lane_mask >= 32) fail_here("__shfl_xor_sync: only width 32 and lane masks < 32 are simulated");
  r.slots[f.linear] = v;
  f.state = Fiber::AtWarp;
  to_scheduler(f);
  const uint64_t out = r.slots[(f.linear & ~31) | ((f.linear & 31) ^ lane_mask)];
  f.state = Fiber::AtWarp;  // nobody overwrites a slot before every lane has read
  to_scheduler(f);
  return out;
}

void check_aligned(const void* p, size_t bytes, const char* what) {
  if (reinterpret_cast<uintptr_t>(p) % bytes == 0) return;
  char buf[160];
  std::snprintf(buf, sizeof buf, "%s: misaligned %zu-byte vector access at %p", what, bytes, p);
  if (g_fiber) fail_here(buf);
  std::fprintf(stderr, "cuda-sim: %s (outside a kernel)\n", buf);
  std::abort();
}

void run_grid(const char* kernel, dim3 grid, dim3 block, size_t shmem, cudaStream_t st, std::vector<Access> acc,
              std::function<void()> body) {
  std::string name(kernel);
  name = name.substr(0, name.find('<'));
  while (!name.empty() && name.back() == ' ') name.pop_back();
  {
    std::lock_guard<std::mutex> lock(g_launch_mu);
    counts()[name]++;
  }
  const uint64_t threads = uint64_t(block.x) * block.y * block.z;
  if (threads == 0 || threads > 1024 || block.z > 64 || grid.x == 0 || grid.y == 0 || grid.z == 0 ||
      grid.y > 65535 || grid.z > 65535 || shmem > 48 * 1024) {
    set_launch_error(cudaErrorInvalidConfiguration,
                     "kernel " + name + ": invalid launch configuration grid " + tid_str(grid) + " block " +
                         tid_str(block));
    return;
  }
  const char* kname = intern(name);
  auto work = [kname, grid, block, body = std::move(body)] {
    std::lock_guard<std::mutex> lock(g_launch_mu);
    const uint64_t nblocks = uint64_t(grid.x) * grid.y * grid.z;
    std::mt19937_64 rng(seed() * 0x9E3779B97F4A7C15ull + (++g_launches));
    std::vector<uint64_t> order(nblocks);
    for (uint64_t i = 0; i < nblocks; ++i) order[i] = i;
    std::shuffle(order.begin(), order.end(), rng);
    BlockRun r;
    r.kernel = kname;
    r.body = &body;
    g_run = &r;
    for (uint64_t b : order) {
      r.block = dim3(static_cast<unsigned>(b % grid.x), static_cast<unsigned>((b / grid.x) % grid.y),
                     static_cast<unsigned>(b / (uint64_t(grid.x) * grid.y)));
      run_block(r, grid, block, rng);
      if (!r.error.empty()) {
#ifdef MPT_SIM_ASAN
        // Abandoned fibers leave their frames' redzones poisoned on the pooled stacks.
        for (char* s : stack_pool()) __asan_unpoison_memory_region(s, kStackBytes);
#endif
        std::fprintf(stderr, "cuda-sim: %s\n", r.error.c_str());
        set_async_error(cudaErrorLaunchFailure, r.error);
        break;
      }
    }
    g_run = nullptr;
  };
  const QueueResult q = queue(stream_of(st), intern("kernel " + name), std::move(acc), std::move(work));
  if (q.err != cudaSuccess) set_launch_error(q.err, q.what);
}

void count_call(const std::string& name) {
  std::lock_guard<std::mutex> lock(g_launch_mu);
  counts()[name]++;
}

void write_counts() {
  const char* path = std::getenv("MPITRON_CUDA_SIM_COUNTS");
  if (!path || !*path) return;
  std::string out;
  {
    std::lock_guard<std::mutex> lock(g_launch_mu);
    for (const auto& [k, n] : counts()) out += k + " " + std::to_string(n) + "\n";
  }
  if (out.empty()) return;
  if (FILE* f = std::fopen(path, "a")) {
    std::fwrite(out.data(), 1, out.size(), f);
    std::fclose(f);
  }
}

namespace {
struct CountsAtExit {
  CountsAtExit() { std::atexit(write_counts); }
} g_counts_at_exit;
}  // namespace

}  // namespace mpitron::cuda::sim
