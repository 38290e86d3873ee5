// parallel/comm_nccl.cpp — the NCCL backend of Communicator (device tensors).
//
// Built only with MPITRON_WITH_CUDA (otherwise make_nccl_communicator throws
// with the reason). Rank 0 of the group makes the ncclUniqueId and broadcasts
// it over the group's MPI communicator; every rank then joins with
// ncclCommInitRank on its current CUDA device.
//
// Streams: the communicator owns a non-blocking CUDA stream. An operation
// first makes that stream wait for everything already queued on the legacy
// default stream (where our kernels run by default: an event recorded there),
// then enqueues the NCCL call and records a completion event. test() queries
// the event; wait() polls it on the host (with the timeout and the side-channel
// diagnosis of the base class, and ncclCommGetAsyncError), so after wait() the
// result may be read by any stream or copied to the host.
//
// Uneven chunks: reduce_scatter_v is a group of ncclReduce (one per owner),
// all_gather_v a group of ncclBroadcast (one per source), both inside
// ncclGroupStart/End; in-place use is allowed as NCCL allows it for these.
// On timeout the NCCL communicator is aborted (ncclCommAbort) and this
// communicator is broken.
#include "parallel/communicator.h"

#if defined(MPITRON_WITH_CUDA)  // (the simulated device's NCCL is a stand-in over MPI: tests/cuda_sim/nccl.cpp)
#include <cuda_runtime.h>
#include <nccl.h>

#include <algorithm>
#include <numeric>

#include "core/log.h"

namespace mpitron {

bool nccl_built() { return true; }

namespace {

ncclDataType_t nccl_type(DType t) {
  switch (t) {
    case DType::F32: return ncclFloat32;
    case DType::BF16: return ncclBfloat16;
    case DType::F16: return ncclFloat16;
    case DType::I32: return ncclInt32;
    case DType::I64: return ncclInt64;
    case DType::U16: return ncclUint8;  // moved as bytes, never reduced
  }
  return ncclUint8;
}
// Element count in units of nccl_type(t).
size_t nccl_count(const Tensor& t) { return t.dtype() == DType::U16 ? t.nbytes() : static_cast<size_t>(t.numel()); }
size_t nccl_count(DType t, int64_t n) { return static_cast<size_t>(t == DType::U16 ? 2 * n : n); }
size_t elem_bytes(DType t) { return dtype_size(t); }

}  // namespace

class NcclCommunicator final : public Communicator {
 public:
  NcclCommunicator(MPI_Comm comm, const CommOptions& opts) : Communicator(comm, opts) {
    MPT_CHECK(cuda_available(), str("NCCL communicator for ", describe(), ": no GPU"), cuda_unavailable_reason());
    cuda_ok(cudaGetDevice(&device_), "cudaGetDevice");
    ncclUniqueId id;
    if (rank_ == 0) nccl_ok(ncclGetUniqueId(&id), "ncclGetUniqueId");
    const int rc = MPI_Bcast(&id, sizeof(id), MPI_BYTE, 0, comm);
    if (rc != MPI_SUCCESS) fail("create", "MPI_Bcast of the ncclUniqueId failed");
    nccl_ok(ncclCommInitRank(&nccl_, size_, id, rank_), "ncclCommInitRank",
            "each rank of an NCCL group needs its own GPU; to share one GPU use --force-mpi-for-device");
    cuda_ok(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreateWithFlags");
    cuda_ok(cudaEventCreateWithFlags(&ready_, cudaEventDisableTiming), "cudaEventCreate");
  }

  ~NcclCommunicator() override {
    close_side_channel();
    if (nccl_) {
      if (broken_)
        ncclCommAbort(nccl_);
      else {
        cudaStreamSynchronize(stream_);
        ncclCommDestroy(nccl_);
      }
    }
    if (ready_) cudaEventDestroy(ready_);
    if (stream_) cudaStreamDestroy(stream_);
  }

  const char* backend() const override { return "nccl"; }

  struct OpState {
    cudaEvent_t done_ev = nullptr;
    std::vector<Tensor> keep;
    bool done = false;
    std::string what;
    int64_t seq = -1;
    int peer = -1;
  };

  class NcclWork final : public Work {
   public:
    NcclWork(NcclCommunicator* c, std::shared_ptr<OpState> st) : c_(c), st_(std::move(st)) {}
    ~NcclWork() override {
      if (!st_->done && !c_->broken()) {
        try {
          wait();
        } catch (const std::exception& e) {
          log_error("an unwaited operation failed while its Work was destroyed: ", e.what());
        }
      }
      if (st_->done_ev) cudaEventDestroy(st_->done_ev);
    }
    bool test() override {
      if (st_->done) return true;
      c_->check_usable(st_->what.c_str());
      return c_->test_state(*st_);
    }
    void wait() override {
      if (st_->done) return;
      c_->check_usable(st_->what.c_str());
      const std::string err = c_->wait_loop([&] { return c_->test_state(*st_); }, st_->what, st_->seq, st_->peer);
      if (!err.empty()) {
        ncclCommAbort(c_->nccl_);
        c_->nccl_ = nullptr;
        c_->fail(st_->what, err, "a rank skipped or reordered a collective, or is stuck; MPITRON_COMM_TIMEOUT_S sets "
                                 "the timeout");
      }
    }

   private:
    NcclCommunicator* c_;
    std::shared_ptr<OpState> st_;
  };

  WorkPtr all_reduce_async(const Tensor& t, ReduceOp op) override {
    check_tensor("all_reduce", t, true);
    auto st = start(str("all_reduce(", t.describe(), ", ", reduce_op_name(op), ")"), true, {t});
    nccl_ok(ncclAllReduce(t.data_ptr(), t.data_ptr(), nccl_count(t), nccl_type(t.dtype()), red(op), nccl_, stream_),
            "ncclAllReduce");
    return finish(st);
  }

  WorkPtr reduce_scatter_v_async(const Tensor& in, const Tensor& out, const std::vector<int64_t>& counts,
                                 ReduceOp op) override {
    check_tensor("reduce_scatter", in, true);
    check_tensor("reduce_scatter", out, true);
    check_counts("reduce_scatter", counts, in.numel(), out.numel(), in.dtype() == out.dtype());
    auto st = start(str("reduce_scatter(", in.describe(), " -> ", out.describe(), ", ", reduce_op_name(op), ")"),
                    true, {in, out});
    const DType dt = in.dtype();
    const bool even = std::all_of(counts.begin(), counts.end(), [&](int64_t c) { return c == counts[0]; });
    char* base = static_cast<char*>(in.data_ptr());
    if (even) {
      nccl_ok(ncclReduceScatter(base, out.data_ptr(), nccl_count(dt, counts[0]), nccl_type(dt), red(op), nccl_,
                                stream_),
              "ncclReduceScatter");
    } else {
      NcclGroup group(*this);
      int64_t at = 0;
      for (int r = 0; r < size_; ++r) {
        const int64_t n = counts[static_cast<size_t>(r)];
        void* src = base + at * elem_bytes(dt);
        if (n > 0)
          nccl_ok(ncclReduce(src, r == rank_ ? out.data_ptr() : src, nccl_count(dt, n), nccl_type(dt), red(op), r,
                             nccl_, stream_),
                  "ncclReduce");
        at += n;
      }
      group.end();
    }
    return finish(st);
  }

  WorkPtr all_gather_v_async(const Tensor& in, const Tensor& out, const std::vector<int64_t>& counts) override {
    check_tensor("all_gather", in, false);
    check_tensor("all_gather", out, false);
    check_counts("all_gather", counts, out.numel(), in.numel(), in.dtype() == out.dtype());
    auto st = start(str("all_gather(", in.describe(), " -> ", out.describe(), ")"), true, {in, out});
    const DType dt = in.dtype();
    const bool even = std::all_of(counts.begin(), counts.end(), [&](int64_t c) { return c == counts[0]; });
    char* base = static_cast<char*>(out.data_ptr());
    if (even) {
      nccl_ok(ncclAllGather(in.data_ptr(), base, nccl_count(dt, counts[0]), nccl_type(dt), nccl_, stream_),
              "ncclAllGather");
    } else {
      NcclGroup group(*this);
      int64_t at = 0;
      for (int r = 0; r < size_; ++r) {
        const int64_t n = counts[static_cast<size_t>(r)];
        void* dst = base + at * elem_bytes(dt);
        if (n > 0)
          nccl_ok(ncclBroadcast(r == rank_ ? in.data_ptr() : dst, dst, nccl_count(dt, n), nccl_type(dt), r, nccl_,
                                stream_),
                  "ncclBroadcast");
        at += n;
      }
      group.end();
    }
    return finish(st);
  }

  WorkPtr broadcast_async(const Tensor& t, int root) override {
    check_tensor("broadcast", t, false);
    check_rank("broadcast", root);
    auto st = start(str("broadcast(", t.describe(), ", root ", root, ")"), true, {t});
    nccl_ok(ncclBroadcast(t.data_ptr(), t.data_ptr(), nccl_count(t), nccl_type(t.dtype()), root, nccl_, stream_),
            "ncclBroadcast");
    return finish(st);
  }

  WorkPtr send_async(const Tensor& t, int peer, int tag) override {
    check_tensor("send", t, false);
    check_rank("send", peer);
    auto st = start(str("send(", t.describe(), " to group rank ", peer, ")"), false, {t});
    st->peer = peer;
    nccl_ok(ncclSend(t.data_ptr(), nccl_count(t), nccl_type(t.dtype()), peer, nccl_, stream_), "ncclSend");
    return finish(st);
  }

  WorkPtr recv_async(const Tensor& t, int peer, int tag) override {
    check_tensor("recv", t, false);
    check_rank("recv", peer);
    auto st = start(str("recv(", t.describe(), " from group rank ", peer, ")"), false, {t});
    st->peer = peer;
    nccl_ok(ncclRecv(t.data_ptr(), nccl_count(t), nccl_type(t.dtype()), peer, nccl_, stream_), "ncclRecv");
    return finish(st);
  }

  WorkPtr batch_p2p_async(const std::vector<P2POp>& ops) override {
    if (ops.empty()) return Communicator::batch_p2p_async(ops);
    std::vector<Tensor> keep;
    std::string what = "batch(";
    for (const P2POp& op : ops) {
      check_tensor(op.send ? "send" : "recv", op.t, false);
      check_rank(op.send ? "send" : "recv", op.peer);
      keep.push_back(op.t);
      what += str(keep.size() > 1 ? ", " : "", op.send ? "send " : "recv ", op.t.describe(), op.send ? " to " : " from ",
                  op.peer);
    }
    auto st = start(what + ")", false, std::move(keep));
    st->peer = ops.front().peer;
    NcclGroup group(*this);
    for (const P2POp& op : ops) {
      if (op.send)
        nccl_ok(ncclSend(op.t.data_ptr(), nccl_count(op.t), nccl_type(op.t.dtype()), op.peer, nccl_, stream_),
                "ncclSend");
      else
        nccl_ok(ncclRecv(op.t.data_ptr(), nccl_count(op.t), nccl_type(op.t.dtype()), op.peer, nccl_, stream_),
                "ncclRecv");
    }
    group.end();
    return finish(st);
  }

  void barrier() override {
    // A host-side barrier of the group (what callers of barrier() want): one
    // tiny all-reduce through NCCL, so it also orders against queued NCCL work.
    Tensor one = Tensor::zeros({1}, DType::F32, Device::cuda(device_));
    all_reduce_async(one, ReduceOp::Sum)->wait();
  }

 private:
  // ncclGroupStart … ncclGroupEnd, closed on every exit: an exception thrown
  // between them (a failed ncclReduce) would otherwise leave the group open and
  // every later NCCL call on this thread would silently join it.
  class NcclGroup {
   public:
    explicit NcclGroup(NcclCommunicator& c) : c_(c) { c_.nccl_ok(ncclGroupStart(), "ncclGroupStart"); }
    NcclGroup(const NcclGroup&) = delete;
    NcclGroup& operator=(const NcclGroup&) = delete;
    void end() {
      open_ = false;
      c_.nccl_ok(ncclGroupEnd(), "ncclGroupEnd");
    }
    // Unwinding: close the group; the error already being thrown is the one to report.
    ~NcclGroup() {
      if (open_) ncclGroupEnd();
    }

   private:
    NcclCommunicator& c_;
    bool open_ = true;
  };

  std::shared_ptr<OpState> start(const std::string& what, bool collective, std::vector<Tensor> keep) {
    check_usable(what.c_str());
    auto st = std::make_shared<OpState>();
    st->what = what;
    st->seq = collective ? begin_collective(what.c_str()) : -1;
    st->keep = std::move(keep);
    cuda_ok(cudaEventCreateWithFlags(&st->done_ev, cudaEventDisableTiming), "cudaEventCreate");
    // Order after the kernels already queued on the default stream (they wrote the inputs).
    cuda_ok(cudaEventRecord(ready_, nullptr), "cudaEventRecord");
    cuda_ok(cudaStreamWaitEvent(stream_, ready_, 0), "cudaStreamWaitEvent");
    return st;
  }

  WorkPtr finish(const std::shared_ptr<OpState>& st) {
    cuda_ok(cudaEventRecord(st->done_ev, stream_), "cudaEventRecord");
    return std::make_unique<NcclWork>(this, st);
  }

  bool test_state(OpState& st) {
    if (st.done) return true;
    const cudaError_t e = cudaEventQuery(st.done_ev);
    if (e == cudaErrorNotReady) {
      ncclResult_t async = ncclSuccess;
      if (nccl_) ncclCommGetAsyncError(nccl_, &async);
      if (async != ncclSuccess && async != ncclInProgress)
        fail(st.what, str("NCCL asynchronous error: ", ncclGetErrorString(async)));
      return false;
    }
    if (e != cudaSuccess) fail(st.what, str("cudaEventQuery: ", cudaGetErrorString(e)));
    st.done = true;
    st.keep.clear();
    return true;
  }

  ncclRedOp_t red(ReduceOp op) { return op == ReduceOp::Sum ? ncclSum : ncclMax; }

  void nccl_ok(ncclResult_t r, const char* fn, const char* hint = "") {
    if (r == ncclSuccess) return;
    const char* detail = ncclGetLastError(nccl_);
    fail(fn, str(fn, ": ", ncclGetErrorString(r), detail && *detail ? str(" (", detail, ")") : std::string()), hint);
  }
  void cuda_ok(cudaError_t e, const char* fn) {
    if (e != cudaSuccess) fail(fn, str(fn, ": ", cudaGetErrorString(e)));
  }

  void check_tensor(const char* op, const Tensor& t, bool reduces) {
    check_usable(op);
    MPT_CHECK(t.defined() && t.is_contiguous(),
              str(op, " on ", describe(), ": tensor ", t.defined() ? t.describe() : "undefined", " is not contiguous"),
              "");
    MPT_CHECK(t.device().is_cuda(), str(op, " on ", describe(), ": the NCCL backend got host tensor ", t.describe()),
              "use the MPI communicator for host tensors");
    MPT_CHECK(!reduces || t.dtype() != DType::U16, str(op, " on ", describe(), ": cannot reduce u16"), "");
  }
  void check_rank(const char* op, int r) {
    MPT_CHECK(r >= 0 && r < size_, str(op, " on ", describe(), ": rank ", r, " is not in the group"), "");
  }
  void check_counts(const char* op, const std::vector<int64_t>& counts, int64_t total, int64_t mine, bool same_dtype) {
    MPT_CHECK(same_dtype, str(op, " on ", describe(), ": in and out dtypes differ"), "");
    MPT_CHECK(static_cast<int>(counts.size()) == size_,
              str(op, " on ", describe(), ": ", counts.size(), " counts for ", size_, " ranks"), "");
    const int64_t sum = std::accumulate(counts.begin(), counts.end(), int64_t{0});
    MPT_CHECK(sum == total && counts[static_cast<size_t>(rank_)] == mine,
              str(op, " on ", describe(), ": counts sum to ", sum, " (need ", total, ") and give this rank ",
                  counts[static_cast<size_t>(rank_)], " (need ", mine, ")"),
              "");
  }

  int device_ = 0;
  ncclComm_t nccl_ = nullptr;
  cudaStream_t stream_ = nullptr;
  cudaEvent_t ready_ = nullptr;
};

std::unique_ptr<Communicator> make_nccl_communicator(MPI_Comm comm, const CommOptions& opts) {
  return std::make_unique<NcclCommunicator>(comm, opts);
}

}  // namespace mpitron

#else  // !MPITRON_WITH_CUDA

namespace mpitron {
bool nccl_built() { return false; }
std::unique_ptr<Communicator> make_nccl_communicator(MPI_Comm, const CommOptions& opts) {
  MPT_THROW(str("NCCL communicator '", opts.name, "' requested"),
            "this build has no CUDA (MPITRON_CUDA=OFF); device tensors are not available");
}
}  // namespace mpitron

#endif
