// parallel/communicator.h — collectives over one process group, as an object.
//
// A Communicator wraps one MPI communicator (a grid group: tp, dp, pp, …) and
// moves tensors between its ranks. Two backends behind one interface:
//   - MPI  (comm_mpi.cpp): host tensors; device tensors too when
//          CommOptions::force_mpi_for_device is set (staged through host
//          memory, so several ranks may share one GPU);
//   - NCCL (comm_nccl.cpp, CUDA builds only): device tensors; the unique id is
//          broadcast over the MPI communicator.
// make_communicator() picks one from the device the tensors will live on.
//
// Contract (every backend, every call):
//   - every rank of the group issues the same collectives in the same order
//     (point-to-point calls excepted); tensors are contiguous, dtypes f32, bf16,
//     f16, i32, i64 (u16 only for send/recv/broadcast/all_gather);
//   - sync calls return when the result is in the output tensor;
//   - async calls return a Work handle; wait() blocks until the result is in the
//     output (for NCCL: the host waits for the completion event, so afterwards the
//     data may be read by any stream or by the host); test() polls;
//   - tensors passed to an async call stay alive until the Work completes (the
//     Work holds references to them);
//   - a failure throws mpitron::Error naming this rank, the group (name and
//     world ranks) and the operation;
//   - a wait longer than CommOptions::timeout_s throws an Error that names the
//     ranks of the group that did not arrive at the same collective (see
//     "Timeouts" in docs/parallel.md). After a timeout the communicator is
//     broken: further calls throw until it is destroyed and rebuilt.
//
// Reductions: f32/i32/i64 use MPI's built-in ops. bf16/f16 sum and max use
// user-defined MPI_Ops that widen each pair to f32, combine, and round back to
// nearest-even (the same per-step rounding NCCL does), so bf16 traffic stays
// 2 bytes per element. Summation order is the library's; results are bitwise
// identical across ranks of the group, not across algorithms or group sizes.
#pragma once
#include <mpi.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "tensor/tensor.h"

namespace mpitron {

enum class ReduceOp { Sum, Max };
const char* reduce_op_name(ReduceOp op);

// Default collective timeout: MPITRON_COMM_TIMEOUT_S if set (seconds, 0 = never), else 300.
double comm_timeout_from_env();

struct CommOptions {
  std::string name = "world";           // the group's name in errors and logs ("tp", "dp", …)
  double timeout_s = comm_timeout_from_env();  // 0 = wait forever
  bool force_mpi_for_device = false;    // MPI backend accepts device tensors (staged via host)
  // After a timeout, how long the side-channel check listens for the other
  // ranks' status before naming the missing ones (seconds).
  double diagnose_s = 2.0;
};

// Completion handle of an async operation.
class Work {
 public:
  virtual ~Work() = default;
  // Block until complete (throws on error or timeout). Idempotent.
  virtual void wait() = 0;
  // True when complete; never blocks (may finish the op's epilogue, e.g. a copy back to the device).
  virtual bool test() = 0;
};
using WorkPtr = std::unique_ptr<Work>;

class Communicator {
 public:
  virtual ~Communicator();
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;

  int rank() const { return rank_; }  // in this group
  int size() const { return size_; }
  const std::string& name() const { return opts_.name; }
  const CommOptions& options() const { return opts_; }
  MPI_Comm mpi_comm() const { return comm_; }           // the group (owned by the caller)
  const std::vector<int>& world_ranks() const { return world_ranks_; }  // group rank -> world rank
  virtual const char* backend() const = 0;              // "mpi" or "nccl"
  // "group dp (world ranks 0,2) rank 1/2"
  std::string describe() const;

  // ---- async ----
  // t (N) in place: every rank ends with op over the group of t.
  virtual WorkPtr all_reduce_async(const Tensor& t, ReduceOp op = ReduceOp::Sum) = 0;
  // in (size·N), out (N): out = this rank's N-chunk of op over the group of in.
  // out may be in's own chunk (in.flat_range(rank·N, N)).
  WorkPtr reduce_scatter_async(const Tensor& in, const Tensor& out, ReduceOp op = ReduceOp::Sum);
  // Uneven chunks: counts[r] elements go to rank r, chunks laid out back to back in `in`
  // (Σ counts = in.numel()); out (counts[rank]). out may be in's own chunk.
  virtual WorkPtr reduce_scatter_v_async(const Tensor& in, const Tensor& out, const std::vector<int64_t>& counts,
                                         ReduceOp op = ReduceOp::Sum) = 0;
  // in (N), out (size·N): out = the ranks' in concatenated in rank order. in may be
  // out's own chunk (out.flat_range(rank·N, N)): in place.
  WorkPtr all_gather_async(const Tensor& in, const Tensor& out);
  // Uneven chunks: in (counts[rank]), out (Σ counts) laid out back to back.
  virtual WorkPtr all_gather_v_async(const Tensor& in, const Tensor& out, const std::vector<int64_t>& counts) = 0;
  virtual WorkPtr broadcast_async(const Tensor& t, int root) = 0;
  virtual WorkPtr send_async(const Tensor& t, int peer, int tag = 0) = 0;
  virtual WorkPtr recv_async(const Tensor& t, int peer, int tag = 0) = 0;
  // Several sends/receives posted as one batch (torch's batch_isend_irecv, e.g.
  // a pipeline's send_forward_recv_backward): one Work for all of them. NCCL
  // groups them (ncclGroupStart/End), so two ranks sending to each other at
  // once cannot deadlock; the MPI backend posts each nonblocking.
  struct P2POp {
    bool send = true;
    Tensor t;
    int peer = 0;
    int tag = 0;
  };
  virtual WorkPtr batch_p2p_async(const std::vector<P2POp>& ops);

  // ---- sync (the async call, then wait()) ----
  void all_reduce(const Tensor& t, ReduceOp op = ReduceOp::Sum) { all_reduce_async(t, op)->wait(); }
  void reduce_scatter(const Tensor& in, const Tensor& out, ReduceOp op = ReduceOp::Sum) {
    reduce_scatter_async(in, out, op)->wait();
  }
  void reduce_scatter_v(const Tensor& in, const Tensor& out, const std::vector<int64_t>& counts,
                        ReduceOp op = ReduceOp::Sum) {
    reduce_scatter_v_async(in, out, counts, op)->wait();
  }
  void all_gather(const Tensor& in, const Tensor& out) { all_gather_async(in, out)->wait(); }
  void all_gather_v(const Tensor& in, const Tensor& out, const std::vector<int64_t>& counts) {
    all_gather_v_async(in, out, counts)->wait();
  }
  void broadcast(const Tensor& t, int root) { broadcast_async(t, root)->wait(); }
  void send(const Tensor& t, int peer, int tag = 0) { send_async(t, peer, tag)->wait(); }
  void recv(const Tensor& t, int peer, int tag = 0) { recv_async(t, peer, tag)->wait(); }
  virtual void barrier() = 0;

  // Collectives issued so far (the sequence number the timeout check compares).
  int64_t collectives_issued() const { return seq_; }
  // True after a timeout or a failed call: every further call throws.
  bool broken() const { return broken_; }

  // Wait for operations abandoned by a timeout (their buffers are kept alive)
  // to complete, e.g. after the late rank finally joined. True when none is
  // left. The communicator stays broken either way.
  virtual bool drain(double timeout_s) { return true; }

 protected:
  // Collective over comm: duplicates it for the side channel.
  Communicator(MPI_Comm comm, const CommOptions& opts);
  // Frees the side channel; derived destructors call it first.
  void close_side_channel();
  // Throw when broken; count a collective and return its sequence number.
  int64_t begin_collective(const char* op);
  void check_usable(const char* op) const;
  [[noreturn]] void fail(const std::string& op, const std::string& what, const std::string& hint = "");

  // Poll `done` until it returns true. Meanwhile answer the side channel. On
  // timeout: ask every rank where it is, listen for opts_.diagnose_s, mark the
  // communicator broken and return the error text naming the missing ranks
  // (done() turning true during the check returns "" after all). `seq` is the
  // collective's sequence number, or -1 for point-to-point with `peer`.
  std::string wait_loop(const std::function<bool()>& done, const std::string& op, int64_t seq, int peer);
  // Receive and answer pending side-channel messages (never blocks).
  void poll_side();
  // Poll done() (answering the side channel when asked) for up to `seconds` (0 = forever).
  bool poll_until(const std::function<bool()>& done, double seconds, bool answer_side);

  MPI_Comm comm_;
  CommOptions opts_;
  int rank_ = 0, size_ = 1;
  std::vector<int> world_ranks_;
  int64_t seq_ = 0;
  bool broken_ = false;

 private:
  struct SideMsg;
  struct PeerStatus {
    bool heard = false;  // it told us its status …
    double when = 0;     // … at this time (steady clock, s): statuses older than the current wait are stale
    int64_t seq = -1;    // the collective it was waiting in (-1: none or point-to-point)
    std::string op;      // the call it was waiting in ("" = none)
  };
  void send_side(int to, int type);
  void reap_side_sends(bool all);
  std::string diagnose(const std::function<bool()>& done, const std::string& op, int64_t seq, int peer,
                       double waited_s);

  MPI_Comm side_ = MPI_COMM_NULL;
  std::vector<PeerStatus> peers_;
  int64_t waiting_seq_ = -1;
  double wait_start_ = 0;
  std::string waiting_op_;
  std::vector<std::pair<MPI_Request, std::shared_ptr<SideMsg>>> side_sends_;
};


// Process-wide: called with the error text when a communicator fails (a
// timeout, a failed MPI/NCCL call), just before its Error is thrown. Apps that
// run as one MPI job install parallel/job_exit.h's, which bounds how long the
// process may live after it; tests that recover from a timeout install none.
using CommFailureHook = void (*)(const std::string& what);
void set_comm_failure_hook(CommFailureHook hook);

// A communicator over `comm` (which the caller keeps alive and frees after the
// communicator is destroyed). MPI: for host tensors (and device tensors staged
// through host with opts.force_mpi_for_device).
std::unique_ptr<Communicator> make_mpi_communicator(MPI_Comm comm, const CommOptions& opts = {});
// NCCL: for device tensors on the current CUDA device. Collective over `comm`.
// Throws (with the reason) in a build without CUDA or when no GPU is usable.
std::unique_ptr<Communicator> make_nccl_communicator(MPI_Comm comm, const CommOptions& opts = {});
// NCCL when `device` is CUDA and not opts.force_mpi_for_device, else MPI.
std::unique_ptr<Communicator> make_communicator(MPI_Comm comm, Device device, const CommOptions& opts = {});
// True when this build has the NCCL backend.
bool nccl_built();

}  // namespace mpitron
