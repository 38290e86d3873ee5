// tests/cuda_sim/race.cpp — the stream race check of the simulated device.
//
// Device memory is known by its regions: cudaMalloc segments, and the blocks a
// caching allocator carves from them (cuda_sim_tools.h: cudaSimBlockAllocated /
// cudaSimBlockReleased), each with the site that made it. A region remembers the
// accesses of the operations that touched it: byte range, read or write, stream,
// the operation's sequence number on that stream, and the call ("kernel
// layernorm_forward_kernel", "ncclAllReduce", "cudaMemcpyAsync").
//
// When an operation of stream S is queued, every access it makes is checked
// against the recorded accesses of other streams that overlap it (write/any or
// any/write): S's clock must know the recorded operation — some chain of event
// waits, legacy-stream ordering or host synchronisation orders it first.
// Otherwise the operation is refused and the report names the call, S, the other
// call and stream, and the allocation site. Because clocks, not timings, decide,
// a missing cudaStreamWaitEvent is reported on every run.
//
// Reuse: when a block is released its records stay with the memory (the
// segment), summed up per stream as its last write and last read anywhere in the
// block; a block handed out later over the same bytes inherits them, so its
// first use on a stream that is not ordered after the last use of those bytes —
// say a comm stream still reading a buffer the host freed early — is reported
// the same way. The caching allocator's per-stream free lists make this hold by
// construction; the check proves it.
//
// Kernels pass raw pointers, not extents: a kernel's pointer argument counts as
// a one-byte access at that address (const pointee: a read; otherwise, and for
// words inside aggregate arguments such as functors, a write). Copies, memsets,
// GEMMs and collectives give their exact ranges.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <execinfo.h>
#include <map>
#include <mutex>

#include "cuda_sim_tools.h"
#include "tests/cuda_sim/sim.h"

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/asan_interface.h>
#include <sanitizer/common_interface_defs.h>
#define MPT_SIM_ASAN 1
#endif

namespace mpitron::cuda::sim {
namespace {

struct Rec {
  uintptr_t lo, hi;
  int stream;
  uint64_t seq;
  bool write;
  const char* call;
  bool prior;  // made by a block released before this one was handed out over the same bytes
};

struct Region {
  uintptr_t lo = 0, hi = 0;
  Site site;
  bool block = false;     // a caching allocator's block (else a cudaMalloc segment)
  std::vector<Rec> recs;  // a segment's records: also those of its released blocks
};

std::map<uintptr_t, Region>& segments() {
  static auto* m = new std::map<uintptr_t, Region>;
  return *m;
}
std::map<uintptr_t, Region>& blocks() {
  static auto* m = new std::map<uintptr_t, Region>;
  return *m;
}

Region* find_in(std::map<uintptr_t, Region>& m, uintptr_t p) {
  auto it = m.upper_bound(p);
  if (it == m.begin()) return nullptr;
  --it;
  return p < it->second.hi ? &it->second : nullptr;
}
// The innermost region holding p: a block, else a segment.
Region* find(uintptr_t p) {
  if (Region* b = find_in(blocks(), p)) return b;
  return find_in(segments(), p);
}

std::string range_str(const Region& r, uintptr_t lo, uintptr_t hi) {
  return "bytes [" + std::to_string(lo - r.lo) + ", " + std::to_string(hi - r.lo) + ")";
}

bool knows(const Clock& c, int stream, uint64_t seq) {
  return static_cast<size_t>(stream) < c.size() && c[static_cast<size_t>(stream)] >= seq;
}

}  // namespace

Site capture_site() {
  Site s;
  s.n = backtrace(s.pc, 12);
  return s;
}

std::string describe(const Site& s) {
  std::string out;
  int shown = 0;
  char** names = nullptr;
#ifndef MPT_SIM_ASAN
  names = backtrace_symbols(s.pc, s.n);
#endif
  for (int i = 1; i < s.n && shown < 3; ++i) {
    std::string fn, where;
#ifdef MPT_SIM_ASAN
    char buf[1024];
    __sanitizer_symbolize_pc(static_cast<char*>(s.pc[i]) - 1, "%f", buf, sizeof buf);
    fn = buf;
    __sanitizer_symbolize_pc(static_cast<char*>(s.pc[i]) - 1, "%L", buf, sizeof buf);
    where = buf;
#else
    fn = names ? names[i] : "?";
#endif
    for (size_t a; (a = fn.find("(anonymous namespace)::")) != std::string::npos;) fn.erase(a, 23);
    if (const size_t paren = fn.find('('); paren != std::string::npos && paren > 0 && !where.empty()) fn.erase(paren);
    // "(module+0x…)": no line tables (a build without -g); the function name says enough.
    if (where.find("+0x") != std::string::npos || where == "??") where.clear();
    // Frames of the simulator (the CUDA calls too), the allocator and tensor storage say
    // nothing about whose buffer or stream it is.
    if (fn.rfind("cuda", 0) == 0 || fn.find("mpitron::cuda::sim::") != std::string::npos ||
        fn.find("CachingAllocator::") != std::string::npos || fn.find("mpitron::Tensor::") != std::string::npos ||
        fn.find("Scratch::Scratch") != std::string::npos || fn.find("backtrace") != std::string::npos)
      continue;
    out += (shown++ ? " < " : "") + fn + (where.empty() ? "" : " (" + where + ")");
  }
  std::free(names);
  return out.empty() ? "an unknown site" : out;
}

std::string race_check(int sid, const Clock& c, const char* call, const std::vector<Access>& acc) {
  for (const Access& a : acc) {
    const uintptr_t p = reinterpret_cast<uintptr_t>(a.p);
    Region* r = find(p);
    if (!r) continue;  // host memory, or a word of an aggregate argument that is no pointer
    const uintptr_t lo = p, hi = std::min(r->hi, p + std::max<size_t>(a.bytes, 1));
    for (auto it = r->recs.rbegin(); it != r->recs.rend(); ++it) {  // the latest first
      const Rec& x = *it;
      if (x.stream == sid || x.hi <= lo || hi <= x.lo || !(a.write || x.write) || knows(c, x.stream, x.seq)) continue;
      return std::string("stream race: ") + call + " on " + stream_name(sid) + (a.write ? " writes " : " reads ") +
             range_str(*r, lo, hi) + " of the " + std::to_string(r->hi - r->lo) + "-byte device " +
             (r->block ? "block (caching allocator)" : "allocation (cudaMalloc)") + " made at " + describe(r->site) + ", which " +
             x.call + " on " + stream_name(x.stream) + (x.write ? " wrote" : " read") + " (" +
             range_str(*r, x.lo, x.hi) + ", its operation " + std::to_string(x.seq) + ")" +
             (x.prior ? " before the caching allocator released those bytes and handed them out again" : "") +
             ", and nothing orders " + stream_name(sid) + " after that: record an event on " + stream_name(x.stream) +
             " after it and cudaStreamWaitEvent that event on " + stream_name(sid) +
             " (or synchronise the host with it) before " + call;
    }
  }
  return "";
}

void race_record(int sid, uint64_t seq, const char* call, const std::vector<Access>& acc) {
  for (const Access& a : acc) {
    const uintptr_t p = reinterpret_cast<uintptr_t>(a.p);
    Region* r = find(p);
    if (!r) continue;
    const uintptr_t lo = p, hi = std::min(r->hi, p + std::max<size_t>(a.bytes, 1));
    // Records inside [lo, hi) this access supersedes: this stream's own (a write
    // supersedes both kinds), and after a write every other one as well (the check
    // just proved them ordered before it, so whatever is ordered after this write is
    // ordered after them, and whatever is not conflicts with this write).
    auto& v = r->recs;
    v.erase(std::remove_if(v.begin(), v.end(),
                           [&](const Rec& x) {
                             return x.lo >= lo && x.hi <= hi && (a.write || (x.stream == sid && !x.write));
                           }),
            v.end());
    v.push_back({lo, hi, sid, seq, a.write, call, false});
  }
}

void track_segment(void* p, size_t bytes) {
  std::lock_guard<std::mutex> lock(sim_mutex());
  Region r;
  r.lo = reinterpret_cast<uintptr_t>(p);
  r.hi = r.lo + bytes;
  r.site = capture_site();
  segments()[r.lo] = std::move(r);
}

void untrack_segment(void* p) {
  std::lock_guard<std::mutex> lock(sim_mutex());
  const uintptr_t lo = reinterpret_cast<uintptr_t>(p);
  auto it = segments().find(lo);
  if (it == segments().end()) return;
  const uintptr_t hi = it->second.hi;
  segments().erase(it);
  for (auto b = blocks().lower_bound(lo); b != blocks().end() && b->first < hi;) b = blocks().erase(b);
}

bool is_device_memory(const void* p) {
  std::lock_guard<std::mutex> lock(sim_mutex());
  return find_in(segments(), reinterpret_cast<uintptr_t>(p)) != nullptr;
}

}  // namespace mpitron::cuda::sim

using namespace mpitron::cuda::sim;

// ---- the tool interface for caching allocators (cuda_sim_tools.h) ---------------------------
void cudaSimBlockAllocated(void* p, size_t bytes, size_t block_bytes, cudaStream_t s) {
  {
    std::lock_guard<std::mutex> lock(sim_mutex());
    const uintptr_t lo = reinterpret_cast<uintptr_t>(p), hi = lo + block_bytes;
    Region b;
    b.lo = lo;
    b.hi = hi;
    b.block = true;
    b.site = capture_site();
    if (Region* seg = find_in(segments(), lo)) {
      auto& v = seg->recs;
      for (const Rec& x : v)
        if (x.lo < hi && lo < x.hi) b.recs.push_back({std::max(x.lo, lo), std::min(x.hi, hi), x.stream, x.seq, x.write,
                                                      x.call, true});
      v.erase(std::remove_if(v.begin(), v.end(), [&](const Rec& x) { return x.lo >= lo && x.hi <= hi; }), v.end());
    }
    blocks()[lo] = std::move(b);
  }
#ifdef MPT_SIM_ASAN
  // Stream-ordered, like the reuse itself: work queued before on s may still read the old contents.
  char* c = static_cast<char*>(p);
  queue(stream_of(s), "cudaSimBlockAllocated", {}, [c, bytes, block_bytes] {
    ASAN_UNPOISON_MEMORY_REGION(c, bytes);
    ASAN_POISON_MEMORY_REGION(c + bytes, block_bytes - bytes);
  }, {}, false);
#else
  (void)bytes;
  (void)s;
#endif
}

void cudaSimBlockReleased(void* p, size_t block_bytes, cudaStream_t s) {
  {
    std::lock_guard<std::mutex> lock(sim_mutex());
    auto it = blocks().find(reinterpret_cast<uintptr_t>(p));
    if (it != blocks().end()) {
      // Memory is reused a block at a time, so what matters of a released block is, per
      // stream, its last write and its last read anywhere in it: kept over the whole
      // block, they replace that stream's older records inside it (bounded books).
      const Region& b = it->second;
      if (Region* seg = find_in(segments(), b.lo)) {
        std::vector<Rec> sum;
        for (const Rec& x : b.recs) {
          auto at = std::find_if(sum.begin(), sum.end(), [&](const Rec& y) { return y.stream == x.stream && y.write == x.write; });
          if (at == sum.end()) sum.push_back({b.lo, b.hi, x.stream, x.seq, x.write, x.call, true});
          else if (x.seq > at->seq) at->seq = x.seq, at->call = x.call;
        }
        auto& v = seg->recs;
        v.erase(std::remove_if(v.begin(), v.end(),
                               [&](const Rec& x) {
                                 if (x.lo < b.lo || x.hi > b.hi) return false;
                                 for (const Rec& y : sum)
                                   if (y.stream == x.stream && (y.write || !x.write)) return true;
                                 return false;
                               }),
                v.end());
        v.insert(v.end(), sum.begin(), sum.end());
      }
      blocks().erase(it);
    }
  }
#ifdef MPT_SIM_ASAN
  char* c = static_cast<char*>(p);
  queue(stream_of(s), "cudaSimBlockReleased", {}, [c, block_bytes] { ASAN_POISON_MEMORY_REGION(c, block_bytes); }, {},
        false);
#else
  (void)block_bytes;
  (void)s;
#endif
}
