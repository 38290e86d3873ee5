// tests/cuda_sim/nccl.cpp — an NCCL stand-in for the simulated device: the NCCL
// calls mpitron makes (include/nccl.h), executed over MPI in stream order.
//
// Communicators: ncclGetUniqueId names its maker (world rank, a counter); every
// ncclCommInitRank sends its (rank, world rank) to the maker, which answers with
// the whole list, and the ranks build a private MPI communicator with
// MPI_Comm_create_group (collective over the members only, like NCCL's init).
// The communicator's stream worker makes MPI calls while the program's own
// threads make theirs: MPI must provide MPI_THREAD_MULTIPLE (checked at init).
//
// Operations: a call validates its arguments and is queued on its stream as one
// operation (tests/cuda_sim/streams.cpp) over the exact bytes it reads and writes
// — so the race check sees a collective that reads a buffer no cudaStreamWaitEvent
// ordered after its writer — and returns at once. The stream's worker posts it
// with nonblocking MPI and waits. Inputs are staged through host copies when the
// operation runs (NCCL's in-place forms alias input and output).
//
// Groups, as NCCL: ncclGroupStart/End nest per thread; calls inside a group are
// only collected, and the outermost ncclGroupEnd queues them — one operation per
// (communicator, stream), all posted before any is waited for, so a send and a
// receive between two ranks in one group cannot deadlock. Queuing other work on a
// stream while this thread's open group holds operations for it (an event
// record, a synchronisation) is refused: those operations would come after it
// (sim.h: open_nccl_group_on) — the symptom of a missing ncclGroupEnd.
//
// Errors: a bad argument returns ncclInvalidArgument / ncclInvalidUsage at the
// call, its text from ncclGetLastError; an MPI failure while running makes
// ncclCommGetAsyncError report ncclSystemError (and the CUDA error sticky).
// ncclCommAbort stops the operations of the communicator still waiting.
// Reductions: f32/f64/integers with MPI's built-in ops; f16/bf16 sum, prod, max,
// min with user ops that widen each pair to f32 and round back to nearest even
// (NCCL's per-step rounding). ncclAvg is not simulated.
#include "nccl.h"

#include <mpi.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "tests/cuda_sim/sim.h"

using namespace mpitron::cuda::sim;

struct ncclComm {
  MPI_Comm comm = MPI_COMM_NULL;
  int rank = 0, nranks = 1;
  std::atomic<int> async_error{ncclSuccess};
  std::atomic<bool> aborted{false};
  std::mutex mu;
  std::vector<std::pair<Stream*, uint64_t>> last;  // the last operation queued per stream
};

namespace {

enum class Kind { AllReduce, Reduce, ReduceScatter, AllGather, Broadcast, Send, Recv };
const char* kind_name(Kind k) {
  switch (k) {
    case Kind::AllReduce: return "ncclAllReduce";
    case Kind::Reduce: return "ncclReduce";
    case Kind::ReduceScatter: return "ncclReduceScatter";
    case Kind::AllGather: return "ncclAllGather";
    case Kind::Broadcast: return "ncclBroadcast";
    case Kind::Send: return "ncclSend";
    case Kind::Recv: return "ncclRecv";
  }
  return "?";
}

struct Call {
  Kind kind;
  const void* send;
  void* recv;
  size_t count;
  ncclDataType_t type;
  ncclRedOp_t op;
  int root;  // root, or peer for send/recv
  ncclComm_t comm;
  cudaStream_t stream;
};

thread_local int g_depth = 0;
thread_local std::vector<Call> g_pending;
thread_local std::string g_last_error;

ncclResult_t fail(ncclResult_t r, const std::string& what) {
  g_last_error = what;
  std::fprintf(stderr, "cuda-sim NCCL: %s\n", what.c_str());
  return r;
}

size_t type_size(ncclDataType_t t) {
  switch (t) {
    case ncclInt8: case ncclUint8: return 1;
    case ncclFloat16: case ncclBfloat16: return 2;
    case ncclInt32: case ncclUint32: case ncclFloat32: return 4;
    case ncclInt64: case ncclUint64: case ncclFloat64: return 8;
  }
  return 0;
}

MPI_Datatype mpi_type(ncclDataType_t t) {
  switch (t) {
    case ncclInt8: return MPI_INT8_T;
    case ncclUint8: return MPI_UINT8_T;
    case ncclInt32: return MPI_INT32_T;
    case ncclUint32: return MPI_UINT32_T;
    case ncclInt64: return MPI_INT64_T;
    case ncclUint64: return MPI_UINT64_T;
    case ncclFloat16: case ncclBfloat16: return MPI_UINT16_T;
    case ncclFloat32: return MPI_FLOAT;
    case ncclFloat64: return MPI_DOUBLE;
  }
  return MPI_DATATYPE_NULL;
}

// ---- 16-bit floats: widen, combine, round back (nearest even) ----
float bf16_f(uint16_t h) {
  const uint32_t u = uint32_t(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
uint16_t f_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}
float f16_f(uint16_t h) {
  _Float16 x;
  std::memcpy(&x, &h, 2);
  return static_cast<float>(x);
}
uint16_t f_f16(float f) {
  const _Float16 x = static_cast<_Float16>(f);
  uint16_t h;
  std::memcpy(&h, &x, 2);
  return h;
}
template <bool BF, int OP> void half_op(void* in, void* inout, int* len, MPI_Datatype*) {
  const auto* a = static_cast<const uint16_t*>(in);
  auto* b = static_cast<uint16_t*>(inout);
  for (int i = 0; i < *len; ++i) {
    const float x = BF ? bf16_f(a[i]) : f16_f(a[i]), y = BF ? bf16_f(b[i]) : f16_f(b[i]);
    const float r = OP == ncclSum ? x + y : OP == ncclProd ? x * y : OP == ncclMax ? (x > y ? x : y) : (x < y ? x : y);
    b[i] = BF ? f_bf16(r) : f_f16(r);
  }
}

MPI_Op mpi_op(ncclRedOp_t op, ncclDataType_t t) {
  if (t == ncclFloat16 || t == ncclBfloat16) {
    static std::once_flag once;
    static MPI_Op ops[2][4];
    std::call_once(once, [] {
      MPI_Op_create(&half_op<true, ncclSum>, 1, &ops[1][0]);
      MPI_Op_create(&half_op<true, ncclProd>, 1, &ops[1][1]);
      MPI_Op_create(&half_op<true, ncclMax>, 1, &ops[1][2]);
      MPI_Op_create(&half_op<true, ncclMin>, 1, &ops[1][3]);
      MPI_Op_create(&half_op<false, ncclSum>, 1, &ops[0][0]);
      MPI_Op_create(&half_op<false, ncclProd>, 1, &ops[0][1]);
      MPI_Op_create(&half_op<false, ncclMax>, 1, &ops[0][2]);
      MPI_Op_create(&half_op<false, ncclMin>, 1, &ops[0][3]);
    });
    return ops[t == ncclBfloat16][op];
  }
  switch (op) {
    case ncclSum: return MPI_SUM;
    case ncclProd: return MPI_PROD;
    case ncclMax: return MPI_MAX;
    case ncclMin: return MPI_MIN;
    default: return MPI_OP_NULL;
  }
}

std::string mpi_error(int rc) {
  char buf[MPI_MAX_ERROR_STRING];
  int n = 0;
  MPI_Error_string(rc, buf, &n);
  return std::string(buf, static_cast<size_t>(n));
}

// ---- running one queued operation (on its stream's worker) ----
void run(ncclComm* c, const std::vector<Call>& calls) {
  using Buf = std::vector<char>;
  std::vector<std::unique_ptr<Buf>> tmp;
  std::vector<MPI_Request> reqs;
  std::vector<bool> p2p;
  std::vector<std::function<void()>> copy_out;
  const auto stage = [&](const void* p, size_t bytes) {
    tmp.push_back(std::make_unique<Buf>(bytes));
    if (p && bytes) std::memcpy(tmp.back()->data(), p, bytes);
    return tmp.back()->data();
  };
  int rc = MPI_SUCCESS;
  for (const Call& k : calls) {
    const size_t sz = type_size(k.type), bytes = k.count * sz;
    const int n = static_cast<int>(k.count);
    const MPI_Datatype dt = mpi_type(k.type);
    MPI_Request r = MPI_REQUEST_NULL;
    switch (k.kind) {
      case Kind::AllReduce:
        rc = MPI_Iallreduce(stage(k.send, bytes), k.recv, n, dt, mpi_op(k.op, k.type), c->comm, &r);
        break;
      case Kind::Reduce: {
        char* out = k.root == c->rank ? stage(nullptr, bytes) : nullptr;
        rc = MPI_Ireduce(stage(k.send, bytes), out, n, dt, mpi_op(k.op, k.type), k.root, c->comm, &r);
        if (out) copy_out.push_back([out, dst = k.recv, bytes] { std::memcpy(dst, out, bytes); });
        break;
      }
      case Kind::ReduceScatter:
        rc = MPI_Ireduce_scatter_block(stage(k.send, bytes * c->nranks), k.recv, n, dt, mpi_op(k.op, k.type), c->comm,
                                       &r);
        break;
      case Kind::AllGather:
        rc = MPI_Iallgather(stage(k.send, bytes), n, dt, k.recv, n, dt, c->comm, &r);
        break;
      case Kind::Broadcast: {
        char* b = stage(k.root == c->rank ? k.send : nullptr, bytes);
        rc = MPI_Ibcast(b, n, dt, k.root, c->comm, &r);
        copy_out.push_back([b, dst = k.recv, bytes] { std::memmove(dst, b, bytes); });
        break;
      }
      case Kind::Send: rc = MPI_Isend(k.send, n, dt, k.root, 0, c->comm, &r); break;
      case Kind::Recv: rc = MPI_Irecv(k.recv, n, dt, k.root, 0, c->comm, &r); break;
    }
    if (rc != MPI_SUCCESS) break;
    reqs.push_back(r);
    p2p.push_back(k.kind == Kind::Send || k.kind == Kind::Recv);
  }
  // Wait, giving way to the other threads, until done or the communicator is aborted:
  // spin (yielding) for a millisecond, then back off (ranks are oversubscribed on few cores).
  int done = 0;
  const auto t0 = std::chrono::steady_clock::now();
  while (rc == MPI_SUCCESS && !reqs.empty()) {
    rc = MPI_Testall(static_cast<int>(reqs.size()), reqs.data(), &done, MPI_STATUSES_IGNORE);
    if (rc != MPI_SUCCESS || done) break;
    if (c->aborted) {
      for (size_t i = 0; i < reqs.size(); ++i)
        if (p2p[i] && reqs[i] != MPI_REQUEST_NULL) MPI_Cancel(&reqs[i]);
      c->async_error = ncclRemoteError;  // collectives cannot be cancelled: abandoned (buffers leak)
      for (auto& b : tmp) (void)b.release();
      return;
    }
    if (std::chrono::steady_clock::now() - t0 < std::chrono::milliseconds(1)) std::this_thread::yield();
    else std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
  if (rc != MPI_SUCCESS) {
    c->async_error = ncclSystemError;
    const std::string what = std::string(kind_name(calls.front().kind)) + " failed in MPI: " + mpi_error(rc);
    std::fprintf(stderr, "cuda-sim NCCL: %s\n", what.c_str());
    set_async_error(cudaErrorLaunchFailure, what);
    return;
  }
  for (auto& f : copy_out) f();
}

// Queues calls (same communicator and stream) as one stream operation.
ncclResult_t launch(std::vector<Call> calls, bool grouped) {
  ncclComm* c = calls.front().comm;
  std::vector<Access> acc;
  std::string name = grouped ? "ncclGroupEnd(" : "";
  for (size_t i = 0; i < calls.size(); ++i) {
    const Call& k = calls[i];
    const size_t bytes = k.count * type_size(k.type);
    name += std::string(i ? ", " : "") + kind_name(k.kind);
    const bool root = k.root == c->rank;
    switch (k.kind) {
      case Kind::AllReduce:
        if (k.send != k.recv) acc.push_back({k.send, bytes, false});
        acc.push_back({k.recv, bytes, true});
        break;
      case Kind::Reduce:
        acc.push_back({k.send, bytes, false});
        if (root) acc.push_back({k.recv, bytes, true});
        break;
      case Kind::ReduceScatter:
        acc.push_back({k.send, bytes * c->nranks, false});
        acc.push_back({k.recv, bytes, true});
        break;
      case Kind::AllGather:
        acc.push_back({k.send, bytes, false});
        acc.push_back({k.recv, bytes * c->nranks, true});
        break;
      case Kind::Broadcast:
        if (root) acc.push_back({k.send, bytes, false});
        acc.push_back({k.recv, bytes, true});
        break;
      case Kind::Send: acc.push_back({k.send, bytes, false}); break;
      case Kind::Recv: acc.push_back({k.recv, bytes, true}); break;
    }
  }
  if (grouped) name += ")";
  Stream* st = stream_of(calls.front().stream);
  const QueueResult r = queue(st, intern(name), std::move(acc), [c, calls = std::move(calls)] { run(c, calls); });
  if (r.err != cudaSuccess) return fail(ncclInvalidUsage, r.what);
  std::lock_guard<std::mutex> lock(c->mu);
  for (auto& [s, n] : c->last)
    if (s == st) {
      n = r.seq;
      return ncclSuccess;
    }
  c->last.emplace_back(st, r.seq);
  return ncclSuccess;
}

ncclResult_t group_end_all() {
  std::vector<Call> pending = std::move(g_pending);
  g_pending.clear();
  const bool grouped = pending.size() > 1;
  // One operation per (communicator, stream), in the order of their first call.
  while (!pending.empty()) {
    const ncclComm_t comm = pending.front().comm;
    const cudaStream_t stream = pending.front().stream;
    std::vector<Call> mine, rest;
    for (Call& k : pending) (k.comm == comm && k.stream == stream ? mine : rest).push_back(k);
    pending = std::move(rest);
    if (comm->aborted) return fail(ncclInvalidUsage, "an operation on an aborted communicator");
    const ncclResult_t r = launch(std::move(mine), grouped);
    if (r != ncclSuccess) return r;
  }
  return ncclSuccess;
}

ncclResult_t add(const Call& k) {
  count_call(std::string("nccl:") + kind_name(k.kind));
  if (!k.comm) return fail(ncclInvalidArgument, std::string(kind_name(k.kind)) + ": null communicator");
  if (k.comm->aborted) return fail(ncclInvalidUsage, std::string(kind_name(k.kind)) + ": the communicator was aborted");
  if (type_size(k.type) == 0) return fail(ncclInvalidArgument, std::string(kind_name(k.kind)) + ": bad data type");
  if (k.count > size_t(INT32_MAX))
    return fail(ncclInvalidArgument, std::string(kind_name(k.kind)) + ": counts above 2^31 are not simulated");
  const bool reduces = k.kind == Kind::AllReduce || k.kind == Kind::Reduce || k.kind == Kind::ReduceScatter;
  if (reduces && (k.op < ncclSum || k.op > ncclMin))
    return fail(ncclInvalidArgument, std::string(kind_name(k.kind)) + ": only sum, prod, max and min are simulated");
  if (k.root < 0 || k.root >= k.comm->nranks)
    return fail(ncclInvalidArgument, std::string(kind_name(k.kind)) + ": rank " + std::to_string(k.root) +
                                         " is not in the communicator of " + std::to_string(k.comm->nranks));
  if (k.count && ((!k.send && k.kind != Kind::Recv) || (!k.recv && k.kind != Kind::Send)))
    return fail(ncclInvalidArgument, std::string(kind_name(k.kind)) + ": null buffer");
  g_pending.push_back(k);
  if (g_depth > 0) return ncclSuccess;
  return group_end_all();
}

}  // namespace

namespace mpitron::cuda::sim {
std::string open_nccl_group_on(Stream* st) {
  if (g_depth == 0) return "";
  for (const Call& k : g_pending)
    if (stream_of(k.stream) == st)
      return std::string("an open ncclGroupStart (depth ") + std::to_string(g_depth) + ") holds " + kind_name(k.kind) +
             " for this stream, which is queued only at the outermost ncclGroupEnd: work queued on the stream now "
             "would run before it (is an ncclGroupEnd missing?)";
  return "";
}
}  // namespace mpitron::cuda::sim

ncclResult_t ncclGetVersion(int* version) {
  if (!version) return ncclInvalidArgument;
  *version = NCCL_MAJOR * 10000 + NCCL_MINOR * 100 + NCCL_PATCH;
  return ncclSuccess;
}

namespace {
constexpr char kMagic[16] = "mpitron-nccl-id";
struct IdBody {
  char magic[16];
  int root_world;
  int counter;
  uint64_t nonce;
};
}  // namespace

ncclResult_t ncclGetUniqueId(ncclUniqueId* id) {
  int init = 0;
  MPI_Initialized(&init);
  if (!init) return fail(ncclInvalidUsage, "ncclGetUniqueId: the NCCL stand-in runs over MPI: initialise MPI first");
  static std::atomic<int> counter{0};
  IdBody b{};
  std::memcpy(b.magic, kMagic, sizeof kMagic);
  MPI_Comm_rank(MPI_COMM_WORLD, &b.root_world);
  b.counter = counter++;
  b.nonce = std::random_device{}();
  std::memset(id, 0, sizeof *id);
  std::memcpy(id->internal, &b, sizeof b);
  count_call("nccl:ncclGetUniqueId");
  return ncclSuccess;
}

ncclResult_t ncclCommInitRank(ncclComm_t* comm, int nranks, ncclUniqueId id, int rank) {
  count_call("nccl:ncclCommInitRank");
  if (!comm) return fail(ncclInvalidArgument, "ncclCommInitRank: null comm");
  *comm = nullptr;
  int init = 0, level = 0;
  MPI_Initialized(&init);
  if (!init) return fail(ncclInvalidUsage, "ncclCommInitRank: the NCCL stand-in runs over MPI: initialise MPI first");
  MPI_Query_thread(&level);
  if (level < MPI_THREAD_MULTIPLE)
    return fail(ncclInvalidUsage,
                "ncclCommInitRank: the NCCL stand-in needs MPI_THREAD_MULTIPLE (a communicator's stream makes MPI "
                "calls from its own worker thread); initialise MPI with MPI_Init_thread(..., MPI_THREAD_MULTIPLE, ...)");
  IdBody b;
  std::memcpy(&b, id.internal, sizeof b);
  if (std::memcmp(b.magic, kMagic, sizeof kMagic) != 0)
    return fail(ncclInvalidArgument, "ncclCommInitRank: not an id from ncclGetUniqueId (broadcast it to every rank)");
  if (nranks < 1 || rank < 0 || rank >= nranks)
    return fail(ncclInvalidArgument, "ncclCommInitRank: rank " + std::to_string(rank) + " of " + std::to_string(nranks));
  int me = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &me);
  if ((rank == 0) != (me == b.root_world))
    return fail(ncclInvalidUsage, "ncclCommInitRank: rank 0 must be the process that called ncclGetUniqueId");
  // Who is who: the members report to the id's maker, which answers with the world ranks in rank order.
  const int tag = 12288 + b.counter % 4096;
  std::vector<int> worlds(static_cast<size_t>(nranks), -1);
  if (rank == 0) {
    worlds[0] = me;
    for (int i = 1; i < nranks; ++i) {
      int msg[2];
      MPI_Recv(msg, 2, MPI_INT, MPI_ANY_SOURCE, tag, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
      if (msg[0] <= 0 || msg[0] >= nranks || worlds[static_cast<size_t>(msg[0])] != -1)
        return fail(ncclInvalidUsage, "ncclCommInitRank: two processes claim rank " + std::to_string(msg[0]));
      worlds[static_cast<size_t>(msg[0])] = msg[1];
    }
    for (int i = 1; i < nranks; ++i) MPI_Send(worlds.data(), nranks, MPI_INT, worlds[i], tag, MPI_COMM_WORLD);
  } else {
    const int msg[2] = {rank, me};
    MPI_Send(msg, 2, MPI_INT, b.root_world, tag, MPI_COMM_WORLD);
    MPI_Recv(worlds.data(), nranks, MPI_INT, b.root_world, tag, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
  }
  auto c = std::make_unique<ncclComm>();
  c->rank = rank;
  c->nranks = nranks;
  MPI_Group world_group, group;
  MPI_Comm_group(MPI_COMM_WORLD, &world_group);
  MPI_Group_incl(world_group, nranks, worlds.data(), &group);
  const int rc = MPI_Comm_create_group(MPI_COMM_WORLD, group, tag, &c->comm);
  MPI_Group_free(&group);
  MPI_Group_free(&world_group);
  if (rc != MPI_SUCCESS) return fail(ncclSystemError, "ncclCommInitRank: MPI_Comm_create_group: " + mpi_error(rc));
  MPI_Comm_set_errhandler(c->comm, MPI_ERRORS_RETURN);
  *comm = c.release();
  return ncclSuccess;
}

ncclResult_t ncclCommDestroy(ncclComm_t comm) {
  if (!comm) return ncclInvalidArgument;
  if (!comm->aborted) {
    std::vector<std::pair<Stream*, uint64_t>> last;
    {
      std::lock_guard<std::mutex> lock(comm->mu);
      last = comm->last;
    }
    for (auto& [s, n] : last) host_wait(s, n);  // its operations finish first
    MPI_Comm_free(&comm->comm);
    delete comm;
  }
  return ncclSuccess;
}

ncclResult_t ncclCommAbort(ncclComm_t comm) {
  if (!comm) return ncclInvalidArgument;
  comm->aborted = true;  // operations still waiting give up; the communicator is left to leak
  return ncclSuccess;
}

ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t* asyncError) {
  if (!comm || !asyncError) return ncclInvalidArgument;
  *asyncError = static_cast<ncclResult_t>(comm->async_error.load());
  return ncclSuccess;
}
ncclResult_t ncclCommCount(const ncclComm_t comm, int* count) {
  if (!comm || !count) return ncclInvalidArgument;
  *count = comm->nranks;
  return ncclSuccess;
}
ncclResult_t ncclCommUserRank(const ncclComm_t comm, int* rank) {
  if (!comm || !rank) return ncclInvalidArgument;
  *rank = comm->rank;
  return ncclSuccess;
}

const char* ncclGetErrorString(ncclResult_t r) {
  switch (r) {
    case ncclSuccess: return "no error";
    case ncclUnhandledCudaError: return "unhandled cuda error (run with NCCL_DEBUG=INFO for details)";
    case ncclSystemError: return "unhandled system error (run with NCCL_DEBUG=INFO for details)";
    case ncclInternalError: return "internal error - please report this issue to the NCCL developers";
    case ncclInvalidArgument: return "invalid argument (run with NCCL_DEBUG=WARN for details)";
    case ncclInvalidUsage: return "invalid usage (run with NCCL_DEBUG=WARN for details)";
    case ncclRemoteError: return "remote process exited or there was a network error";
    case ncclInProgress: return "NCCL operation in progress";
    default: return "unknown result code";
  }
}
const char* ncclGetLastError(ncclComm_t) { return g_last_error.c_str(); }

ncclResult_t ncclGroupStart() {
  ++g_depth;
  return ncclSuccess;
}
ncclResult_t ncclGroupEnd() {
  if (g_depth == 0) return fail(ncclInvalidUsage, "ncclGroupEnd without ncclGroupStart");
  if (--g_depth > 0) return ncclSuccess;
  if (!g_pending.empty()) count_call("nccl:ncclGroupEnd");
  return group_end_all();
}

ncclResult_t ncclAllReduce(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype, ncclRedOp_t op,
                           ncclComm_t comm, cudaStream_t stream) {
  return add({Kind::AllReduce, sendbuff, recvbuff, count, datatype, op, 0, comm, stream});
}
ncclResult_t ncclReduce(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype, ncclRedOp_t op,
                        int root, ncclComm_t comm, cudaStream_t stream) {
  return add({Kind::Reduce, sendbuff, recvbuff, count, datatype, op, root, comm, stream});
}
ncclResult_t ncclReduceScatter(const void* sendbuff, void* recvbuff, size_t recvcount, ncclDataType_t datatype,
                               ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream) {
  return add({Kind::ReduceScatter, sendbuff, recvbuff, recvcount, datatype, op, 0, comm, stream});
}
ncclResult_t ncclAllGather(const void* sendbuff, void* recvbuff, size_t sendcount, ncclDataType_t datatype,
                           ncclComm_t comm, cudaStream_t stream) {
  return add({Kind::AllGather, sendbuff, recvbuff, sendcount, datatype, ncclSum, 0, comm, stream});
}
ncclResult_t ncclBroadcast(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype, int root,
                           ncclComm_t comm, cudaStream_t stream) {
  return add({Kind::Broadcast, sendbuff, recvbuff, count, datatype, ncclSum, root, comm, stream});
}
ncclResult_t ncclSend(const void* sendbuff, size_t count, ncclDataType_t datatype, int peer, ncclComm_t comm,
                      cudaStream_t stream) {
  return add({Kind::Send, sendbuff, nullptr, count, datatype, ncclSum, peer, comm, stream});
}
ncclResult_t ncclRecv(void* recvbuff, size_t count, ncclDataType_t datatype, int peer, ncclComm_t comm,
                      cudaStream_t stream) {
  return add({Kind::Recv, nullptr, recvbuff, count, datatype, ncclSum, peer, comm, stream});
}
