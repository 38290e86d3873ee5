// tests/cuda_sim/streams.cpp — asynchronous streams of the simulated device.
//
// Every stream is a FIFO of operations run by its own worker thread; a launch,
// copy, memset, GEMM or collective returns as soon as it is queued. An
// operation starts when its prerequisites have finished:
//   * the operations before it on its stream;
//   * legacy default stream semantics: an operation on the legacy stream waits
//     for everything already queued on the blocking streams (cudaStreamDefault)
//     of its device, and an operation on a blocking stream waits for everything
//     already queued on the legacy stream; non-blocking streams wait for neither;
//   * cudaStreamWaitEvent: the operation the event captured.
// Before running, a worker sleeps a seeded random delay (MPITRON_CUDA_SIM_SEED,
// MPITRON_CUDA_SIM_DELAY_US: up to that many µs, default 100, for one operation in
// 16; 0: none), so the interleaving of streams differs between seeds. (Sparse on
// purpose: on a loaded machine every sleep costs a scheduler wake-up, and the race
// check does not depend on timing anyway.)
//
// The same relations advance a vector clock per stream (sim.h), which the race
// check (race.cpp) reads when the work is queued. The host has a clock too: it
// learns a stream's clock when it synchronises with the stream or an event, and
// everything queued afterwards is ordered after what the host learnt.
#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <mutex>
#include <random>
#include <thread>

#include "cuda_sim_tools.h"
#include "tests/cuda_sim/sim.h"

namespace mpitron::cuda::sim {

// Never destroyed: workers may still run while static destructors do.
std::mutex& sim_mutex() {
  static auto* m = new std::mutex;
  return *m;
}

struct Op {
  uint64_t seq = 0;
  std::vector<std::pair<Stream*, uint64_t>> after;
  std::function<void()> work;
  bool delay = true;
};

struct Stream {
  int id = 0;
  int device = 0;
  bool legacy = false;
  bool blocking = true;
  Site site;                // where it was created
  Clock clock;              // the race check's knowledge of its last queued op
  uint64_t queued = 0;      // ops queued so far (the last one's sequence number)
  uint64_t done = 0;        // ops finished (in order)
  bool running = false;     // an op is executing now
  std::deque<Op> q;
  std::condition_variable wake;  // its worker: work was queued, or a prerequisite finished
  bool blocked = false;          // its worker waits for another stream's operation
  std::mt19937_64 rng;
  std::vector<uint64_t> overlapped;  // per other stream: ops of this one started while that one ran
};

namespace {

std::mutex& mu() { return sim_mutex(); }
std::condition_variable& cv() {  // host threads waiting for a stream
  static auto* c = new std::condition_variable;
  return *c;
}
std::vector<Stream*>& streams() {  // by id; never freed (events and clocks refer to them)
  static auto* v = [] {
    auto* x = new std::vector<Stream*>;
    x->reserve(1 << 16);  // never reallocated: stream_name() reads it without the lock
    return x;
  }();
  return *v;
}
Clock& host_clock() {
  static auto* c = new Clock;
  return *c;
}

int env_int(const char* name, int def) {
  const char* e = std::getenv(name);
  return e && *e ? std::atoi(e) : def;
}
uint64_t seed() {
  static const uint64_t s = [] {
    const char* e = std::getenv("MPITRON_CUDA_SIM_SEED");
    return e ? std::strtoull(e, nullptr, 10) : uint64_t(1);
  }();
  return s;
}
// MPITRON_CUDA_SIM_SYNC=1: every operation runs on the calling thread as it is queued
// (the race check unchanged) — for bisecting a failure and timing the workers' cost.
bool sync_mode() {
  static const bool s = env_int("MPITRON_CUDA_SIM_SYNC", 0) != 0;
  return s;
}
int max_delay_us() {
  static const int d = env_int("MPITRON_CUDA_SIM_DELAY_US", 100);
  return d;
}

bool ready(const Op& op) {
  for (const auto& [s, n] : op.after)
    if (s->done < n) return false;
  return true;
}

void worker(Stream* st) {
  std::unique_lock<std::mutex> lock(mu());
  for (;;) {
    st->wake.wait(lock, [&] {
      st->blocked = !st->q.empty() && !ready(st->q.front());
      return !st->q.empty() && !st->blocked;
    });
    Op op = std::move(st->q.front());
    st->q.pop_front();
    int delay = 0;
    if (op.delay && max_delay_us() > 0 && st->rng() % 16 == 0) delay = static_cast<int>(st->rng() % (max_delay_us() + 1));
    lock.unlock();
    if (delay) std::this_thread::sleep_for(std::chrono::microseconds(delay));
    lock.lock();
    st->running = true;
    for (Stream* o : streams())
      if (o != st && o->running) {
        if (st->overlapped.size() <= static_cast<size_t>(o->id)) st->overlapped.resize(o->id + 1);
        st->overlapped[o->id]++;
      }
    lock.unlock();
    try {
      op.work();
    } catch (const std::exception& e) {
      set_async_error(cudaErrorLaunchFailure, std::string("an operation on ") + stream_name(st->id) + " failed: " +
                                                   e.what());
    }
    op.work = nullptr;  // release what the work held (kernel arguments, staging) before signalling
    lock.lock();
    st->running = false;
    st->done = op.seq;
    // Only who may be waiting for it: host threads, and workers blocked on a prerequisite.
    cv().notify_all();
    for (Stream* o : streams())
      if (o->blocked) o->wake.notify_one();
  }
}

Stream* make_stream(int device, bool legacy, bool blocking, Site site) {
  auto* st = new Stream;
  st->id = static_cast<int>(streams().size());
  st->device = device;
  st->legacy = legacy;
  st->blocking = blocking;
  st->site = std::move(site);
  st->rng.seed(seed() * 0x9E3779B97F4A7C15ull + static_cast<uint64_t>(st->id) * 7919);
  streams().push_back(st);
  if (!sync_mode()) std::thread(worker, st).detach();
  return st;
}

Stream* legacy_of(int device) {  // mu() held
  static auto* legacy = new std::vector<Stream*>;
  if (legacy->size() <= static_cast<size_t>(device)) legacy->resize(device + 1, nullptr);
  Stream*& l = (*legacy)[device];
  if (!l) l = make_stream(device, true, true, Site{});
  return l;
}

int current_device() {
  int d = 0;
  cudaGetDevice(&d);
  return d;
}

}  // namespace

void join(Clock& into, const Clock& from) {
  if (into.size() < from.size()) into.resize(from.size(), 0);
  for (size_t i = 0; i < from.size(); ++i) into[i] = std::max(into[i], from[i]);
}

Stream* stream_of(cudaStream_t s) {
  if (s) return reinterpret_cast<Stream*>(s);
  const int d = current_device();
  std::lock_guard<std::mutex> lock(mu());
  return legacy_of(d);
}
int stream_id(const Stream* s) { return s->id; }

std::string stream_name(int id) {
  const Stream* s = streams()[static_cast<size_t>(id)];
  if (s->legacy) return "the legacy default stream";
  const std::string n = "stream " + std::to_string(id) + (s->blocking ? " (blocking" : " (non-blocking");
  return n + (s->site.n ? ", created at " + describe(s->site) + ")" : ")");
}

QueueResult queue(Stream* st, const char* call, std::vector<Access> acc, std::function<void()> work,
                  const std::vector<std::pair<Stream*, uint64_t>>& after, bool delay) {
  std::unique_lock<std::mutex> lock(mu());
  Op op;
  op.after = after;
  // Legacy default stream semantics (within the device).
  for (Stream* o : streams()) {
    if (o == st || o->device != st->device || o->queued == 0) continue;
    if ((st->legacy && o->blocking) || (o->legacy && st->blocking)) {
      op.after.emplace_back(o, o->queued);
      join(st->clock, o->clock);
    }
  }
  join(st->clock, host_clock());  // (event waits joined their clocks before queueing)
  const std::string race = race_check(st->id, st->clock, call, acc);
  if (!race.empty()) {
    lock.unlock();
    std::fprintf(stderr, "cuda-sim: %s\n", race.c_str());
    set_launch_error(cudaErrorIllegalState, race);  // CUDA's last error is any failed call's
    return {0, cudaErrorIllegalState, race};
  }
  op.seq = ++st->queued;
  if (st->clock.size() <= static_cast<size_t>(st->id)) st->clock.resize(st->id + 1, 0);
  st->clock[st->id] = op.seq;
  race_record(st->id, op.seq, call, acc);
  op.work = std::move(work);
  op.delay = delay;
  if (sync_mode()) {  // everything queued before has run: run it here
    lock.unlock();
    try {
      op.work();
    } catch (const std::exception& e) {
      set_async_error(cudaErrorLaunchFailure, std::string("an operation on ") + stream_name(st->id) + " failed: " + e.what());
    }
    op.work = nullptr;
    lock.lock();
    st->done = op.seq;
    cv().notify_all();
    return {op.seq, cudaSuccess, {}};
  }
  st->q.push_back(std::move(op));
  st->wake.notify_one();
  return {st->queued, cudaSuccess, {}};
}

cudaError_t enqueue(cudaStream_t s, const char* call, std::vector<Access> acc, std::function<void()> work) {
  return queue(stream_of(s), call, std::move(acc), std::move(work)).err;
}

bool finished(Stream* st, uint64_t seq) {
  std::lock_guard<std::mutex> lock(mu());
  return st->done >= seq;
}

void host_wait(Stream* st, uint64_t seq) {
  std::unique_lock<std::mutex> lock(mu());
  const uint64_t n = seq ? seq : st->queued;
  cv().wait(lock, [&] { return st->done >= n; });
  if (!seq) join(host_clock(), st->clock);
}

void host_wait_all() {
  std::unique_lock<std::mutex> lock(mu());
  for (Stream* st : streams()) {
    const uint64_t n = st->queued;
    cv().wait(lock, [&] { return st->done >= n; });
    join(host_clock(), st->clock);
  }
}

Clock clock_of(Stream* st) {
  std::lock_guard<std::mutex> lock(mu());
  return st->clock;
}
void host_join(const Clock& c) {
  std::lock_guard<std::mutex> lock(mu());
  join(host_clock(), c);
}
void stream_join(Stream* st, const Clock& c) {
  std::lock_guard<std::mutex> lock(mu());
  join(st->clock, c);
}

}  // namespace mpitron::cuda::sim

using namespace mpitron::cuda::sim;

// ---- streams of the runtime API ---------------------------------------------------------
cudaError_t cudaStreamCreate(cudaStream_t* s) { return cudaStreamCreateWithFlags(s, cudaStreamDefault); }
cudaError_t cudaStreamCreateWithFlags(cudaStream_t* s, unsigned flags) {
  if (!s || (flags & ~unsigned(cudaStreamNonBlocking))) return cudaErrorInvalidValue;
  const int d = [] {
    int x = 0;
    cudaGetDevice(&x);
    return x;
  }();
  Site site = capture_site();
  std::lock_guard<std::mutex> lock(mu());
  *s = reinterpret_cast<cudaStream_t>(make_stream(d, false, !(flags & cudaStreamNonBlocking), std::move(site)));
  return cudaSuccess;
}
cudaError_t cudaStreamGetFlags(cudaStream_t s, unsigned* flags) {
  if (!flags) return cudaErrorInvalidValue;
  *flags = s && !stream_of(s)->blocking ? cudaStreamNonBlocking : cudaStreamDefault;
  return cudaSuccess;
}
cudaError_t cudaStreamDestroy(cudaStream_t s) {
  // CUDA: work already queued still runs; the stream's records stay for the race check.
  return s ? cudaSuccess : cudaErrorInvalidValue;
}
cudaError_t cudaStreamSynchronize(cudaStream_t s) {
  Stream* st = stream_of(s);
  const std::string open = open_nccl_group_on(st);
  if (!open.empty()) {
    set_launch_error(cudaErrorIllegalState, "cudaStreamSynchronize: " + open);
    std::fprintf(stderr, "cuda-sim: cudaStreamSynchronize: %s\n", open.c_str());
    return cudaErrorIllegalState;
  }
  host_wait(st);
  return pending_error();
}
cudaError_t cudaStreamQuery(cudaStream_t s) {
  Stream* st = stream_of(s);
  uint64_t n;
  {
    std::lock_guard<std::mutex> lock(mu());
    n = st->queued;
  }
  if (!finished(st, n)) return cudaErrorNotReady;
  host_wait(st);
  return cudaSuccess;
}
cudaError_t cudaDeviceSynchronize() {
  host_wait_all();
  return pending_error();
}

// ---- the tool interface (cuda_sim_tools.h) ------------------------------------------------
uint64_t cudaSimOverlappedOps(cudaStream_t a, cudaStream_t b) {
  Stream* sa = stream_of(a);
  Stream* sb = stream_of(b);
  std::lock_guard<std::mutex> lock(mu());
  return sa->overlapped.size() > static_cast<size_t>(sb->id) ? sa->overlapped[sb->id] : 0;
}
