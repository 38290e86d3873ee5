// parallel/comm_mpi.cpp — the MPI backend of Communicator (host tensors).
//
// Every operation is an MPI-3 nonblocking call (MPI_Iallreduce, …) on a
// private duplicate of the group's communicator, with MPI_ERRORS_RETURN so a
// failure comes back as a code we turn into an Error. wait() polls MPI_Test
// (which also drives Open MPI's progress of nonblocking collectives) with the
// timeout of the base class.
//
// bf16/f16: sums and maxima use user-defined MPI_Ops (created per
// communicator, commutative) that widen to f32, combine and round back to
// nearest-even per step, like NCCL. Traffic stays 2 bytes per element.
//
// Device tensors (only with CommOptions::force_mpi_for_device): copied to a
// host buffer when the call is issued and back in the epilogue that runs when
// test()/wait() first sees completion.
//
// A timed-out operation cannot be cancelled (MPI forbids cancelling or freeing
// a nonblocking collective's request): its request and buffers move to
// orphans_, the communicator is broken, and drain() can complete them later.
#include <climits>
#include <numeric>

#include "core/log.h"
#include "parallel/communicator.h"

namespace mpitron {

namespace {

std::string mpi_err(int code) {
  char buf[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(code, buf, &len);
  return std::string(buf, static_cast<size_t>(len));
}

MPI_Datatype mpi_type(DType t) {
  switch (t) {
    case DType::F32: return MPI_FLOAT;
    case DType::BF16:
    case DType::F16:
    case DType::U16: return MPI_UINT16_T;  // bit patterns; reductions go through our ops
    case DType::I32: return MPI_INT32_T;
    case DType::I64: return MPI_INT64_T;
  }
  return MPI_DATATYPE_NULL;
}

template <typename T, bool kMax>
void half_op(void* in, void* inout, int* len, MPI_Datatype*) {
  const T* a = static_cast<const T*>(in);
  T* b = static_cast<T*>(inout);
  for (int i = 0; i < *len; ++i) {
    const float x = to_f32(a[i]), y = to_f32(b[i]);
    b[i] = from_f32<T>(kMax ? (x > y || x != x ? x : y) : x + y);
  }
}

struct OpState {
  MPI_Request req = MPI_REQUEST_NULL;
  std::vector<Tensor> keep;          // buffers MPI reads or writes until completion
  std::vector<int> counts, displs;   // arrays the v-collectives read until completion
  std::function<void()> epilogue;    // copy results back from staging buffers
  bool done = false;
  bool p2p_recv = false;
  int64_t expect_bytes = 0;
  std::string what;  // "all_reduce(f32[1024], sum)"
  int64_t seq = -1;
  int peer = -1;
};

}  // namespace

class MpiCommunicator final : public Communicator {
 public:
  MpiCommunicator(MPI_Comm comm, const CommOptions& opts) : Communicator(comm, opts) {
    int rc = MPI_Comm_dup(comm, &coll_);
    if (rc != MPI_SUCCESS) fail("create", str("MPI_Comm_dup: ", mpi_err(rc)));
    MPI_Comm_set_errhandler(coll_, MPI_ERRORS_RETURN);
    MPI_Op_create(&half_op<bf16_t, false>, 1, &bf16_sum_);
    MPI_Op_create(&half_op<bf16_t, true>, 1, &bf16_max_);
    MPI_Op_create(&half_op<f16_t, false>, 1, &f16_sum_);
    MPI_Op_create(&half_op<f16_t, true>, 1, &f16_max_);
  }

  ~MpiCommunicator() override {
    drain(0.0);
    close_side_channel();
    size_t pending = 0;
    for (auto& o : orphans_) pending += !o->done;
    if (pending)
      log_warn("communicator ", describe(), ": ", pending,
               " operation(s) abandoned by a timeout never completed; their buffers are leaked");
    if (coll_ != MPI_COMM_NULL) MPI_Comm_free(&coll_);
    if (!pending) {
      for (MPI_Op* op : {&bf16_sum_, &bf16_max_, &f16_sum_, &f16_max_}) MPI_Op_free(op);
    }
  }

  const char* backend() const override { return "mpi"; }

  class MpiWork final : public Work {
   public:
    MpiWork(MpiCommunicator* c, std::shared_ptr<OpState> st) : c_(c), st_(std::move(st)) {}
    ~MpiWork() override {
      if (st_ && !st_->done && !c_->broken()) {
        try {
          wait();
        } catch (const std::exception& e) {
          log_error("an unwaited operation failed while its Work was destroyed: ", e.what());
        }
      }
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
        c_->orphans_.push_back(st_);
        c_->fail(st_->what, err,
                 "a rank skipped or reordered a collective, or is stuck; MPITRON_COMM_TIMEOUT_S sets the timeout");
      }
    }

   private:
    MpiCommunicator* c_;
    std::shared_ptr<OpState> st_;
  };

  WorkPtr all_reduce_async(const Tensor& t, ReduceOp op) override {
    check_tensor("all_reduce", t, "t", true);
    auto st = start(str("all_reduce(", t.describe(), ", ", reduce_op_name(op), ")"), true);
    Tensor h = stage_in(t, *st);
    issue(*st, "MPI_Iallreduce",
          MPI_Iallreduce(MPI_IN_PLACE, h.data_ptr(), count_of(h), mpi_type(t.dtype()), mpi_op(t.dtype(), op), coll_,
                         &st->req));
    if (!h.shares_storage(t)) st->epilogue = [t, h] { t.copy_from(h); };
    return finish(st);
  }

  WorkPtr reduce_scatter_v_async(const Tensor& in, const Tensor& out, const std::vector<int64_t>& counts,
                                 ReduceOp op) override {
    check_tensor("reduce_scatter", in, "in", true);
    check_tensor("reduce_scatter", out, "out", true);
    check_counts("reduce_scatter", counts, in.numel(), out.numel(), in.dtype() == out.dtype());
    auto st = start(str("reduce_scatter(", in.describe(), " -> ", out.describe(), ", ", reduce_op_name(op), ")"), true);
    Tensor hin = stage_in(in, *st);
    // MPI_IN_PLACE for reduce-scatter leaves the result at the START of the
    // buffer, not at this rank's chunk, so an aliasing out gets its own buffer.
    Tensor hout = (out.device().is_cpu() && !out.shares_storage(in)) ? out : Tensor::empty(out.shape(), out.dtype());
    st->keep.push_back(hout);
    set_counts(*st, counts);
    issue(*st, "MPI_Ireduce_scatter",
          MPI_Ireduce_scatter(hin.data_ptr(), hout.data_ptr(), st->counts.data(), mpi_type(in.dtype()),
                              mpi_op(in.dtype(), op), coll_, &st->req));
    if (!hout.shares_storage(out)) st->epilogue = [out, hout] { out.copy_from(hout); };
    return finish(st);
  }

  WorkPtr all_gather_v_async(const Tensor& in, const Tensor& out, const std::vector<int64_t>& counts) override {
    check_tensor("all_gather", in, "in", false);
    check_tensor("all_gather", out, "out", false);
    check_counts("all_gather", counts, out.numel(), in.numel(), in.dtype() == out.dtype());
    auto st = start(str("all_gather(", in.describe(), " -> ", out.describe(), ")"), true);
    set_counts(*st, counts);
    const int64_t my_displ = st->displs[static_cast<size_t>(rank_)];
    const bool in_place = in.shares_storage(out) && in.offset() == out.offset() + my_displ;
    Tensor hout = out.device().is_cpu() ? out : Tensor::empty(out.shape(), out.dtype());
    st->keep.push_back(hout);
    const void* send = MPI_IN_PLACE;
    if (!in_place || !out.device().is_cpu()) {
      // Overlapping but misplaced input, or a device tensor: a host copy of it.
      Tensor hin = (in.device().is_cpu() && !in.shares_storage(out)) ? in : in.to(Device::cpu()).clone();
      st->keep.push_back(hin);
      send = hin.data_ptr();
    }
    issue(*st, "MPI_Iallgatherv",
          MPI_Iallgatherv(send, st->counts[static_cast<size_t>(rank_)], mpi_type(in.dtype()), hout.data_ptr(),
                          st->counts.data(), st->displs.data(), mpi_type(in.dtype()), coll_, &st->req));
    if (!hout.shares_storage(out)) st->epilogue = [out, hout] { out.copy_from(hout); };
    return finish(st);
  }

  WorkPtr broadcast_async(const Tensor& t, int root) override {
    check_tensor("broadcast", t, "t", false);
    check_rank("broadcast", root);
    auto st = start(str("broadcast(", t.describe(), ", root ", root, ")"), true);
    Tensor h = stage_in(t, *st);
    issue(*st, "MPI_Ibcast", MPI_Ibcast(h.data_ptr(), count_of(h), mpi_type(t.dtype()), root, coll_, &st->req));
    if (!h.shares_storage(t) && rank_ != root) st->epilogue = [t, h] { t.copy_from(h); };
    return finish(st);
  }

  WorkPtr send_async(const Tensor& t, int peer, int tag) override {
    check_tensor("send", t, "t", false);
    check_rank("send", peer);
    auto st = start(str("send(", t.describe(), " to group rank ", peer, ", tag ", tag, ")"), false);
    st->peer = peer;
    Tensor h = stage_in(t, *st);
    issue(*st, "MPI_Isend", MPI_Isend(h.data_ptr(), count_of(h), mpi_type(t.dtype()), peer, tag, coll_, &st->req));
    return finish(st);
  }

  WorkPtr recv_async(const Tensor& t, int peer, int tag) override {
    check_tensor("recv", t, "t", false);
    check_rank("recv", peer);
    auto st = start(str("recv(", t.describe(), " from group rank ", peer, ", tag ", tag, ")"), false);
    st->peer = peer;
    st->p2p_recv = true;
    st->expect_bytes = static_cast<int64_t>(t.nbytes());
    Tensor h = t.device().is_cpu() ? t : Tensor::empty(t.shape(), t.dtype());
    st->keep.push_back(h);
    issue(*st, "MPI_Irecv", MPI_Irecv(h.data_ptr(), count_of(h), mpi_type(t.dtype()), peer, tag, coll_, &st->req));
    if (!h.shares_storage(t)) st->epilogue = [t, h] { t.copy_from(h); };
    return finish(st);
  }

  void barrier() override {
    auto st = start("barrier", true);
    issue(*st, "MPI_Ibarrier", MPI_Ibarrier(coll_, &st->req));
    finish(st)->wait();
  }

  bool drain(double timeout_s) override {
    const auto all_done = [&] {
      bool ok = true;
      for (auto& o : orphans_)
        if (!o->done) {
          int flag = 0;
          if (MPI_Test(&o->req, &flag, MPI_STATUS_IGNORE) != MPI_SUCCESS) flag = 0;
          o->done = flag != 0;
          ok = ok && o->done;
        }
      return ok;
    };
    const bool ok = poll_until(all_done, timeout_s > 0 ? timeout_s : 1e-9, true) || all_done();
    poll_side();
    return ok;
  }

 private:
  std::shared_ptr<OpState> start(const std::string& what, bool collective) {
    check_usable(what.c_str());
    auto st = std::make_shared<OpState>();
    st->what = what;
    st->seq = collective ? begin_collective(what.c_str()) : -1;
    return st;
  }

  void issue(OpState& st, const char* fn, int rc) {
    if (rc != MPI_SUCCESS) fail(st.what, str(fn, ": ", mpi_err(rc)));
  }

  WorkPtr finish(const std::shared_ptr<OpState>& st) { return std::make_unique<MpiWork>(this, st); }

  // Completes st when MPI says so; throws on an MPI error. Never blocks.
  bool test_state(OpState& st) {
    if (st.done) return true;
    int flag = 0;
    MPI_Status status;
    const int rc = MPI_Test(&st.req, &flag, &status);
    if (rc != MPI_SUCCESS) fail(st.what, str("MPI_Test: ", mpi_err(rc)));
    if (!flag) return false;
    if (st.p2p_recv) {
      int bytes = 0;
      MPI_Get_count(&status, MPI_BYTE, &bytes);
      if (bytes != st.expect_bytes)
        fail(st.what, str("received ", bytes, " bytes, expected ", st.expect_bytes),
             "the sender's tensor has another size or dtype");
    }
    st.done = true;
    if (st.epilogue) st.epilogue();
    st.keep.clear();
    return true;
  }

  // The host buffer MPI uses for t: t itself, or a host copy of a device tensor.
  Tensor stage_in(const Tensor& t, OpState& st) {
    Tensor h = t.device().is_cpu() ? t : t.to(Device::cpu());
    st.keep.push_back(h);
    return h;
  }

  int count_of(const Tensor& t) {
    MPT_CHECK(t.numel() <= INT_MAX, str("tensor ", t.describe(), " has more than 2^31-1 elements"),
              "split the operation (for example into buckets)");
    return static_cast<int>(t.numel());
  }

  void set_counts(OpState& st, const std::vector<int64_t>& counts) {
    st.counts.resize(counts.size());
    st.displs.resize(counts.size());
    int64_t at = 0;
    for (size_t i = 0; i < counts.size(); ++i) {
      MPT_CHECK(at + counts[i] <= INT_MAX, str(st.what, ": more than 2^31-1 elements"), "split the operation");
      st.counts[i] = static_cast<int>(counts[i]);
      st.displs[i] = static_cast<int>(at);
      at += counts[i];
    }
  }

  MPI_Op mpi_op(DType t, ReduceOp op) {
    switch (t) {
      case DType::BF16: return op == ReduceOp::Sum ? bf16_sum_ : bf16_max_;
      case DType::F16: return op == ReduceOp::Sum ? f16_sum_ : f16_max_;
      default: return op == ReduceOp::Sum ? MPI_SUM : MPI_MAX;
    }
  }

  void check_tensor(const char* op, const Tensor& t, const char* name, bool reduces) {
    check_usable(op);
    MPT_CHECK(t.defined(), str(op, " on ", describe(), ": ", name, " is undefined"), "");
    MPT_CHECK(t.is_contiguous(), str(op, " on ", describe(), ": ", name, " ", t.describe(), " is not contiguous"),
              "pass .contiguous()");
    MPT_CHECK(!reduces || t.dtype() != DType::U16,
              str(op, " on ", describe(), ": cannot reduce u16 tensor ", t.describe()), "");
    MPT_CHECK(t.device().is_cpu() || opts_.force_mpi_for_device,
              str(op, " on ", describe(), ": the MPI backend got device tensor ", name, " ", t.describe()),
              "use the NCCL communicator for device tensors, or set CommOptions::force_mpi_for_device "
              "(--force-mpi-for-device) to stage them through host memory");
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

  MPI_Comm coll_ = MPI_COMM_NULL;
  MPI_Op bf16_sum_ = MPI_OP_NULL, bf16_max_ = MPI_OP_NULL, f16_sum_ = MPI_OP_NULL, f16_max_ = MPI_OP_NULL;
  std::vector<std::shared_ptr<OpState>> orphans_;
};

std::unique_ptr<Communicator> make_mpi_communicator(MPI_Comm comm, const CommOptions& opts) {
  return std::make_unique<MpiCommunicator>(comm, opts);
}

}  // namespace mpitron
