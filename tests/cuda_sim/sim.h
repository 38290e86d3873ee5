// tests/cuda_sim/sim.h — what the simulated device's runtime files share.
//
// Streams (streams.cpp): each stream is a queue run by its own worker thread.
// Ordering is tracked twice, for two purposes:
//   * execution: an operation starts only after its prerequisites finished (the
//     operations before it on its stream, the legacy default stream's implicit
//     waits, cudaStreamWaitEvent), so the device really runs asynchronously;
//   * the race check (race.cpp): a vector clock per stream and one for the host,
//     advanced when work is queued, merged by event waits, the legacy stream's
//     implicit waits and host synchronisation. "Stream S knows op n of stream T"
//     means op n of T is ordered before S's next operation — so the check does
//     not depend on timing: a missing wait is reported every run, not sometimes.
#pragma once
#include <cstdint>
#include <functional>
#include <mutex>
#include <string>
#include <vector>

#include "cuda_runtime.h"

namespace mpitron::cuda::sim {

// Makes `e` the pending error of cudaGetLastError; cudaGetErrorString(e) returns `what`.
void set_launch_error(cudaError_t e, const std::string& what);
// Queued work failed (a kernel's barrier, a collective's MPI call): the last error,
// and sticky — every synchronisation returns it from then on, as a GPU's fault does.
void set_async_error(cudaError_t e, const std::string& what);
// The sticky error of queued work (cudaSuccess while none failed).
cudaError_t pending_error();
// Appends this process's launch and NCCL call counts to $MPITRON_CUDA_SIM_COUNTS (at exit).
void write_counts();
// Counts one call of `name` in the report (NCCL calls: "nccl:<call>").
void count_call(const std::string& name);

// Where something was made: the calling frames, symbolized only when a report needs them.
struct Site {
  void* pc[12] = {};
  int n = 0;
};
Site capture_site();
// The first few frames outside the simulator and the caching allocator, "f (file:line) < g (…)".
std::string describe(const Site& s);

using Clock = std::vector<uint64_t>;  // per stream id: the last operation known to be ordered before
void join(Clock& into, const Clock& from);

struct Stream;  // streams.cpp
// The stream behind a handle (null: the current device's legacy default stream).
Stream* stream_of(cudaStream_t s);
int stream_id(const Stream* s);
// "the legacy default stream" or "stream 3 (non-blocking, created at …)".
std::string stream_name(int id);

// Queues work on st after `after` (extra prerequisites: (stream, op) pairs).
// Returns the new op's sequence number; 0 with *err set when the race check failed.
struct QueueResult {
  uint64_t seq = 0;
  cudaError_t err = cudaSuccess;
  std::string what;  // the race report when err is set
};
QueueResult queue(Stream* st, const char* call, std::vector<Access> acc, std::function<void()> work,
                  const std::vector<std::pair<Stream*, uint64_t>>& after = {}, bool delay = true);
// Host waits: until op `seq` of st finished (0: everything queued so far), then the
// host knows what st knew.
void host_wait(Stream* st, uint64_t seq = 0);
void host_wait_all();
bool finished(Stream* st, uint64_t seq);
// A snapshot of st's clock (what its last queued op is ordered after, itself included).
Clock clock_of(Stream* st);
void host_join(const Clock& c);
// The host's clock joined into st (for a wait that makes st follow an event).
void stream_join(Stream* st, const Clock& c);

// The lock of the streams and the race check's books.
std::mutex& sim_mutex();
// A stable copy of a call name ("kernel layernorm_forward_kernel") for the race records.
const char* intern(const std::string& name);

// ---- the race check (race.cpp), called with sim_mutex() held ----
// Checks acc for an op of stream `sid` whose clock is `c`; on a race returns the report.
std::string race_check(int sid, const Clock& c, const char* call, const std::vector<Access>& acc);
// Records the accesses of op `seq` of stream `sid`.
void race_record(int sid, uint64_t seq, const char* call, const std::vector<Access>& acc);
void track_segment(void* p, size_t bytes);  // cudaMalloc
void untrack_segment(void* p);              // cudaFree (after the device synchronised)
bool is_device_memory(const void* p);

// ---- the NCCL stand-in (nccl.cpp) ----
// Non-empty when this thread has an open ncclGroupStart holding operations for st:
// work queued on st now would be ordered before them.
std::string open_nccl_group_on(Stream* st);

}  // namespace mpitron::cuda::sim
