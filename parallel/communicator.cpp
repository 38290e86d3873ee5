// parallel/communicator.cpp — the backend-independent part of a Communicator:
// naming, error text, and the side channel that turns a hang into an error
// naming the ranks that did not arrive.
//
// Side channel: at construction the group's MPI communicator is duplicated
// into side_. While a rank waits for an operation it polls side_ (MPI_Iprobe)
// and answers every QUERY with a REPLY carrying the collective sequence number
// it is waiting in. When its own wait times out it sends a QUERY (which itself
// says "I wait in collective #k") to every other rank and listens for
// CommOptions::diagnose_s. A rank that also waits in #k answers (or has already
// queried us), so it is known to have arrived; a rank that answers with
// another number is stuck elsewhere in this group; a rank that never answers
// is not inside any call of this group (busy elsewhere, hung in compute, in
// another group's collective, or dead). Those are the ranks named.
#include "parallel/communicator.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <thread>

#include "core/log.h"
#include "parallel/comm_stats.h"
#include "parallel/failure_record.h"

namespace mpitron {

const char* reduce_op_name(ReduceOp op) { return op == ReduceOp::Sum ? "sum" : "max"; }

double comm_timeout_from_env() {
  const char* e = std::getenv("MPITRON_COMM_TIMEOUT_S");
  if (!e || !*e) return 300.0;
  char* end = nullptr;
  const double v = std::strtod(e, &end);
  MPT_CHECK(end && *end == '\0' && v >= 0, str("MPITRON_COMM_TIMEOUT_S=", e, " is not a number of seconds >= 0"),
            "unset it (300 s) or give seconds, 0 = wait forever");
  return v;
}

namespace {
constexpr int kSideTag = 0x4d50;
constexpr int64_t kQuery = 1, kReply = 2;
double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}
std::string mpi_error_string(int code) {
  char buf[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(code, buf, &len);
  return std::string(buf, static_cast<size_t>(len));
}
}  // namespace

struct Communicator::SideMsg {
  int64_t type = 0;
  int64_t seq = -1;  // the collective the sender waits in (-1: none / point-to-point)
  char op[48] = {};
};

Communicator::Communicator(MPI_Comm comm, const CommOptions& opts) : comm_(comm), opts_(opts) {
  MPT_CHECK(comm != MPI_COMM_NULL, str("communicator '", opts.name, "' over MPI_COMM_NULL"),
            "this rank is not a member of the group; do not build a communicator for it here");
  MPI_Comm_rank(comm, &rank_);
  MPI_Comm_size(comm, &size_);
  // Group rank -> world rank, for error messages that a user can act on.
  MPI_Group g, wg;
  MPI_Comm_group(comm, &g);
  MPI_Comm_group(MPI_COMM_WORLD, &wg);
  std::vector<int> mine(static_cast<size_t>(size_));
  for (int i = 0; i < size_; ++i) mine[static_cast<size_t>(i)] = i;
  world_ranks_.resize(static_cast<size_t>(size_));
  MPI_Group_translate_ranks(g, size_, mine.data(), wg, world_ranks_.data());
  MPI_Group_free(&g);
  MPI_Group_free(&wg);
  const int rc = MPI_Comm_dup(comm, &side_);
  if (rc != MPI_SUCCESS) MPT_THROW(str("creating communicator ", describe(), ": MPI_Comm_dup: ", mpi_error_string(rc)), "");
  MPI_Comm_set_errhandler(side_, MPI_ERRORS_RETURN);
  peers_.resize(static_cast<size_t>(size_));
}

Communicator::~Communicator() { close_side_channel(); }

void Communicator::close_side_channel() {
  if (side_ == MPI_COMM_NULL) return;
  poll_side();
  reap_side_sends(true);
  MPI_Comm_free(&side_);
  side_ = MPI_COMM_NULL;
}

std::string Communicator::describe() const {
  std::string s = str("group '", opts_.name, "' (world ranks ");
  for (int i = 0; i < size_; ++i) s += str(i ? "," : "", world_ranks_[static_cast<size_t>(i)]);
  return s + str(") rank ", rank_, "/", size_);
}

void Communicator::check_usable(const char* op) const {
  if (broken_)
    MPT_THROW(str(op, " on ", describe(), ": the communicator is broken by an earlier timeout or error"),
              "destroy it and build a new one (and find out why a rank did not arrive)");
}

int64_t Communicator::begin_collective(const char* op) {
  check_usable(op);
  return ++seq_;
}

namespace {
std::atomic<CommFailureHook> g_failure_hook{nullptr};
}  // namespace

void set_comm_failure_hook(CommFailureHook hook) { g_failure_hook.store(hook); }

void Communicator::fail(const std::string& op, const std::string& what, const std::string& hint) {
  broken_ = true;
  const std::string msg = str(op, " on ", describe(), " (", backend(), "): ", what);
  if (const CommFailureHook hook = g_failure_hook.load()) hook(msg);
  throw Error(msg, hint, __FILE__, __LINE__);
}

void Communicator::send_side(int to, int type) {
  auto m = std::make_shared<SideMsg>();
  m->type = type;
  m->seq = waiting_seq_;
  std::strncpy(m->op, waiting_op_.c_str(), sizeof(m->op) - 1);
  MPI_Request r;
  if (MPI_Isend(m.get(), sizeof(SideMsg), MPI_BYTE, to, kSideTag, side_, &r) == MPI_SUCCESS)
    side_sends_.emplace_back(r, std::move(m));
}

void Communicator::reap_side_sends(bool all) {
  for (auto it = side_sends_.begin(); it != side_sends_.end();) {
    int done = 0;
    MPI_Test(&it->first, &done, MPI_STATUS_IGNORE);
    if (!done && all) {
      // A peer that never receives it: let MPI finish the (small, eager) send on its own.
      MPI_Request_free(&it->first);
      done = 1;
    }
    it = done ? side_sends_.erase(it) : std::next(it);
  }
}

void Communicator::poll_side() {
  if (side_ == MPI_COMM_NULL) return;
  for (;;) {
    int flag = 0;
    MPI_Status st;
    if (MPI_Iprobe(MPI_ANY_SOURCE, kSideTag, side_, &flag, &st) != MPI_SUCCESS || !flag) break;
    SideMsg m;
    MPI_Recv(&m, sizeof(SideMsg), MPI_BYTE, st.MPI_SOURCE, kSideTag, side_, MPI_STATUS_IGNORE);
    PeerStatus& p = peers_[static_cast<size_t>(st.MPI_SOURCE)];
    p.heard = true;
    p.when = now_s();
    p.seq = m.seq;
    p.op.assign(m.op, strnlen(m.op, sizeof(m.op)));
    if (m.type == kQuery) send_side(st.MPI_SOURCE, kReply);
  }
  reap_side_sends(false);
}

bool Communicator::poll_until(const std::function<bool()>& done, double seconds, bool answer_side) {
  const double t0 = now_s();
  for (int64_t it = 0;; ++it) {
    if (done()) return true;
    if (answer_side && (it & 15) == 0) poll_side();
    const double el = now_s() - t0;
    if (seconds > 0 && el > seconds) return false;
    // Spin briefly (latency), then back off: ranks are often oversubscribed on few cores.
    if (el < 1e-3)
      std::this_thread::yield();
    else
      std::this_thread::sleep_for(std::chrono::microseconds(el < 0.1 ? 50 : 500));
  }
}

std::string Communicator::wait_loop(const std::function<bool()>& done, const std::string& op, int64_t seq,
                                    int peer) {
  const CommWaitScope counted;  // straggler scores and failure records (parallel/comm_stats.h)
  waiting_seq_ = seq;
  waiting_op_ = op;
  wait_start_ = now_s();
  std::string err;
  if (!poll_until(done, opts_.timeout_s, true)) err = diagnose(done, op, seq, peer, opts_.timeout_s);
  if (!err.empty()) broken_ = true;
  waiting_seq_ = -1;
  waiting_op_.clear();
  return err;
}

std::string Communicator::diagnose(const std::function<bool()>& done, const std::string& op, int64_t seq, int peer,
                                   double waited_s) {
  for (int r = 0; r < size_; ++r)
    if (r != rank_) send_side(r, kQuery);
  // Listen (and keep answering) for diagnose_s; the op may still complete.
  if (poll_until(done, opts_.diagnose_s, true)) return "";
  std::vector<std::string> missing;
  std::vector<int> silent;  // world ranks that did not answer, for the failure record
  const auto status_of = [&](int r) {
    const PeerStatus& p = peers_[static_cast<size_t>(r)];
    const int wr = world_ranks_[static_cast<size_t>(r)];
    const std::string host = host_of_rank(wr);
    std::string who = str("world rank ", wr, " (group rank ", r, ")", host.empty() ? "" : " on host " + host);
    if (!p.heard || p.when < wait_start_ || p.op.empty()) {
      silent.push_back(wr);
      return who + ": no answer, not waiting in a call of this group (busy elsewhere, hung in compute or "
                   "another group's collective, or dead)";
    }
    return who + str(": waiting in ", p.op, p.seq >= 0 ? str(" #", p.seq) : std::string(), " instead");
  };
  if (seq >= 0) {
    for (int r = 0; r < size_; ++r) {
      if (r == rank_) continue;
      const PeerStatus& p = peers_[static_cast<size_t>(r)];
      // Sequence numbers only grow, so "it waited in #seq" stays true whenever we heard it.
      if (!(p.heard && p.seq == seq)) missing.push_back(status_of(r));
    }
  } else if (peer >= 0) {
    missing.push_back(status_of(peer));
  }
  note_silent_ranks(silent);
  std::string s = str(seq >= 0 ? str("collective #", seq, " ") : std::string(), "timed out after ", waited_s,
                      " s on world rank ", world_ranks_[static_cast<size_t>(rank_)], "; ");
  if (missing.empty()) {
    s += "every rank of the group is waiting in the same call (a transport problem, not a missing rank)";
  } else {
    s += str(missing.size(), " of ", size_ - 1, " other rank(s) did not arrive: ");
    for (size_t i = 0; i < missing.size(); ++i) s += (i ? "; " : "") + missing[i];
  }
  return s;
}

namespace {
// The Works of a batch as one.
class BatchWork final : public Work {
 public:
  explicit BatchWork(std::vector<WorkPtr> works) : works_(std::move(works)) {}
  void wait() override {
    for (auto& w : works_) w->wait();
  }
  bool test() override {
    bool all = true;
    for (auto& w : works_) all = w->test() && all;
    return all;
  }

 private:
  std::vector<WorkPtr> works_;
};
}  // namespace

WorkPtr Communicator::batch_p2p_async(const std::vector<P2POp>& ops) {
  std::vector<WorkPtr> works;
  works.reserve(ops.size());
  for (const P2POp& op : ops) works.push_back(op.send ? send_async(op.t, op.peer, op.tag) : recv_async(op.t, op.peer, op.tag));
  return std::make_unique<BatchWork>(std::move(works));
}

WorkPtr Communicator::reduce_scatter_async(const Tensor& in, const Tensor& out, ReduceOp op) {
  MPT_CHECK(in.numel() == out.numel() * size_,
            str("reduce_scatter on ", describe(), ": in ", in.describe(), " must hold size x out ", out.describe()), "");
  return reduce_scatter_v_async(in, out, std::vector<int64_t>(static_cast<size_t>(size_), out.numel()), op);
}

WorkPtr Communicator::all_gather_async(const Tensor& in, const Tensor& out) {
  MPT_CHECK(out.numel() == in.numel() * size_,
            str("all_gather on ", describe(), ": out ", out.describe(), " must hold size x in ", in.describe()), "");
  return all_gather_v_async(in, out, std::vector<int64_t>(static_cast<size_t>(size_), in.numel()));
}

std::unique_ptr<Communicator> make_communicator(MPI_Comm comm, Device device, const CommOptions& opts) {
  if (device.is_cuda() && !opts.force_mpi_for_device) return make_nccl_communicator(comm, opts);
  return make_mpi_communicator(comm, opts);
}

}  // namespace mpitron
