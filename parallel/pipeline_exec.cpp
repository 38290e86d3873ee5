// parallel/pipeline_exec.cpp — the pipeline executor (see pipeline_exec.h).
#include "parallel/pipeline_exec.h"

#include <algorithm>
#include <vector>

#include "core/error.h"

namespace mpitron::parallel {

namespace {

constexpr int kTag = 0;  // one tag: MPI's in-order matching per rank pair is the checker's pairing rule

struct Meta {
  Shape shape;
  DType dtype = DType::F32;
  Device device;
};

// Per-(micro-batch, chunk) state of this rank, indexed mb * v + chunk.
struct Slot {
  Tensor in_act;    // RA's buffer (or the local previous chunk's output) until F consumes it
  Tensor out_act;   // F's output until SA sends it
  Tensor in_grad;   // RG's buffer (or the local next chunk's input gradient) until B consumes it
  Tensor out_grad;  // B's input gradient until SG sends it
  bool has_meta = false;
  Meta out_meta;    // what F's output looked like (for RG's buffer)
  bool recv_act = false, fwd = false, sent_act = false;
  bool recv_grad = false, bwd = false, sent_grad = false;
};

class Executor {
 public:
  Executor(const Schedule& s, int rank, Communicator* comm, StageRunner& runner)
      : s_(s), rank_(rank), comm_(comm), runner_(runner) {}

  PipelineStats run() {
    check_sizes();
    slots_.assign(static_cast<size_t>(s_.micro_batches) * s_.virtual_stages, Slot{});
    const auto& acts = s_.ranks[static_cast<size_t>(rank_)];
    size_t i = 0;
    while (i < acts.size()) {
      if (is_compute(acts[i].op)) {
        if (acts[i].batched) fail(i, "a forward/backward cannot be part of a send/recv batch");
        compute(i);
        ++i;
        continue;
      }
      size_t j = i + 1;
      while (j < acts.size() && acts[j].batched) ++j;
      p2p_batch(i, j);
      i = j;
    }
    finish();
    return stats_;
  }

 private:
  // ---- errors ----
  std::string where(size_t i) const {
    const Action& a = s_.ranks[static_cast<size_t>(rank_)][i];
    std::string w = str("pipeline rank ", rank_, ", action ", i, " (", to_string(a));
    if (a.line > 0) w += str(", line ", a.line, ":", a.column);
    return w + ")";
  }
  std::string sched() const { return str("schedule '", s_.name, "' (pp ", s_.pp, ", virtual stages ",
                                         s_.virtual_stages, ", micro-batches ", s_.micro_batches, ")"); }
  [[noreturn]] void fail(size_t i, const std::string& why) const {
    MPT_THROW(str(sched(), ": ", where(i), ": ", why),
              "run validate_schedule() on the schedule first: it proves every rank's list complete, in "
              "dependency order and deadlock-free");
  }
  static std::string text(Op op, int mb, int chunk, int peer = -1) { return action_text(op, mb, chunk, peer); }

  void check_sizes() {
    if (s_.pp < 1 || s_.virtual_stages < 1 || s_.micro_batches < 1)
      MPT_THROW(str(sched(), ": bad sizes (each must be >= 1)"), "");
    if (static_cast<int>(s_.ranks.size()) != s_.pp)
      MPT_THROW(str(sched(), ": lists ", s_.ranks.size(), " ranks but pp is ", s_.pp), "");
    if (rank_ < 0 || rank_ >= s_.pp) MPT_THROW(str(sched(), ": pipeline rank ", rank_, " out of range"), "");
    if (comm_) {
      if (comm_->size() != s_.pp)
        MPT_THROW(str(sched(), ": the pipeline communicator ", comm_->describe(), " has ", comm_->size(),
                      " ranks, the schedule ", s_.pp),
                  "pass the pp group's communicator (Grid::pp_comm()) and a schedule built for its size");
      if (comm_->rank() != rank_)
        MPT_THROW(str(sched(), ": asked to run pipeline rank ", rank_, " but this is group rank ", comm_->rank(),
                      " of ", comm_->describe()),
                  "pp_rank must be the rank in the pipeline communicator");
    } else if (s_.pp != 1) {
      MPT_THROW(str(sched(), ": a schedule with pp ", s_.pp, " needs the pipeline communicator"),
                "call run_pipeline_schedule(schedule, pp_rank, communicator, runner)");
    }
  }

  Slot& slot(int mb, int chunk) { return slots_[static_cast<size_t>(mb) * s_.virtual_stages + chunk]; }

  void count_buffers(int delta) {
    live_buffers_ += delta;
    stats_.peak_live_buffers = std::max(stats_.peak_live_buffers, live_buffers_);
  }
  // Put t into an empty holder (counts it).
  void hold(Tensor& holder, Tensor t) {
    holder = std::move(t);
    count_buffers(1);
  }
  // Take the tensor out of a holder (frees the executor's reference).
  Tensor take(Tensor& holder) {
    Tensor t = std::move(holder);
    holder = Tensor();
    count_buffers(-1);
    return t;
  }

  void check_range(size_t i) const {
    const Action& a = s_.ranks[static_cast<size_t>(rank_)][i];
    if (a.mb < 0 || a.mb >= s_.micro_batches)
      fail(i, str("micro-batch ", a.mb, " out of range [0, ", s_.micro_batches, ")"));
    if (a.chunk < 0 || a.chunk >= s_.virtual_stages)
      fail(i, str("chunk ", a.chunk, " out of range [0, ", s_.virtual_stages, ")"));
  }

  // ---- F / B ----
  void compute(size_t i) {
    check_range(i);
    const Action& a = s_.ranks[static_cast<size_t>(rank_)][i];
    const int st = s_.stage(rank_, a.chunk);
    const int last = s_.stages() - 1;
    Slot& sl = slot(a.mb, a.chunk);
    if (a.op == Op::Forward) {
      if (sl.fwd) fail(i, "forward runs twice");
      Tensor input;
      if (st > 0) {
        if (!sl.in_act.defined()) {
          const int prev_rank = s_.rank_of_stage(st - 1);
          if (prev_rank == rank_)
            fail(i, str("its input is the output of ", text(Op::Forward, a.mb, s_.chunk_of_stage(st - 1)),
                        ", which has not run yet on this rank"));
          fail(i, str("its input activation has not been received: no ",
                      text(Op::RecvAct, a.mb, a.chunk, prev_rank), " before it"));
        }
        input = take(sl.in_act);
      }
      Tensor out = runner_.forward(a.mb, a.chunk, input);
      input = Tensor();  // the executor's reference goes now; the runner keeps what it saved
      ++stats_.forwards;
      sl.fwd = true;
      ++in_flight_;
      stats_.peak_live_activations = std::max(stats_.peak_live_activations, in_flight_);
      if (st == last) return;  // the loss stays inside the runner
      if (!out.defined())
        fail(i, str("the runner's forward returned no output, but stage ", st, " feeds stage ", st + 1));
      if (s_.rank_of_stage(st + 1) == rank_) {
        hold(slot(a.mb, s_.chunk_of_stage(st + 1)).in_act, std::move(out));
      } else {
        sl.has_meta = true;
        sl.out_meta = Meta{out.shape(), out.dtype(), out.device()};
        hold(sl.out_act, std::move(out));
      }
      return;
    }
    // Backward.
    if (!sl.fwd) fail(i, str("backward before its forward: ", text(Op::Forward, a.mb, a.chunk),
                             " has not run on this rank"));
    if (sl.bwd) fail(i, "backward runs twice");
    Tensor grad;
    if (st < last) {
      if (!sl.in_grad.defined()) {
        const int next_rank = s_.rank_of_stage(st + 1);
        if (next_rank == rank_)
          fail(i, str("its output gradient comes from ", text(Op::Backward, a.mb, s_.chunk_of_stage(st + 1)),
                      ", which has not run yet on this rank"));
        fail(i, str("its output gradient has not been received: no ",
                    text(Op::RecvGrad, a.mb, a.chunk, next_rank), " before it"));
      }
      grad = take(sl.in_grad);
    }
    Tensor din = runner_.backward(a.mb, a.chunk, grad);
    grad = Tensor();
    ++stats_.backwards;
    sl.bwd = true;
    sl.has_meta = false;
    sl.out_meta = Meta{};
    --in_flight_;
    if (st == 0) return;
    if (!din.defined())
      fail(i, str("the runner's backward returned no input gradient, but stage ", st, " has stage ", st - 1,
                  " before it"));
    if (s_.rank_of_stage(st - 1) == rank_)
      hold(slot(a.mb, s_.chunk_of_stage(st - 1)).in_grad, std::move(din));
    else
      hold(sl.out_grad, std::move(din));
  }

  // ---- send / recv ----
  // Everything that would make action i impossible, checked before the batch posts anything.
  void check_p2p(size_t i) {
    check_range(i);
    const Action& a = s_.ranks[static_cast<size_t>(rank_)][i];
    const int st = s_.stage(rank_, a.chunk);
    const int last = s_.stages() - 1;
    const bool toward_next = a.op == Op::SendAct || a.op == Op::RecvGrad;
    if (toward_next && st == last) fail(i, str("stage ", st, " is the last stage: there is no next stage"));
    if (!toward_next && st == 0) fail(i, "stage 0 is the first stage: there is no previous stage");
    const int nb = toward_next ? st + 1 : st - 1;
    const int want = s_.rank_of_stage(nb);
    if (a.peer != want)
      fail(i, str("peer ", a.peer, " does not hold stage ", nb, " (rank ", want, " does)"));
    if (want == rank_) fail(i, str("stage ", nb, " is on this rank: nothing to send or receive"));
    const Slot& sl = slot(a.mb, a.chunk);
    switch (a.op) {
      case Op::RecvAct:
        if (sl.recv_act) fail(i, "the input activation is received twice");
        if (sl.fwd) fail(i, str("receives the input of ", text(Op::Forward, a.mb, a.chunk), ", which already ran"));
        break;
      case Op::RecvGrad:
        if (sl.recv_grad) fail(i, "the output gradient is received twice");
        if (sl.bwd)
          fail(i, str("receives the gradient for ", text(Op::Backward, a.mb, a.chunk), ", which already ran"));
        if (!sl.fwd)
          fail(i, str("receives the gradient of an output not produced yet: ", text(Op::Forward, a.mb, a.chunk),
                      " has not run, so stage ", nb, " can never send it"));
        break;
      case Op::SendAct:
        if (sl.sent_act) fail(i, "the output activation is sent twice");
        if (!sl.fwd) fail(i, str("sends an output never produced: ", text(Op::Forward, a.mb, a.chunk),
                                 " has not run yet"));
        break;
      case Op::SendGrad:
        if (sl.sent_grad) fail(i, "the input gradient is sent twice");
        if (!sl.bwd) fail(i, str("sends an input gradient never produced: ", text(Op::Backward, a.mb, a.chunk),
                                 " has not run yet"));
        break;
      default: break;
    }
  }

  void p2p_batch(size_t first, size_t end) {
    const auto& acts = s_.ranks[static_cast<size_t>(rank_)];
    for (size_t i = first; i < end; ++i) {
      if (!is_send(acts[i].op) && !is_recv(acts[i].op))
        fail(i, "a forward/backward cannot be part of a send/recv batch");
      check_p2p(i);
      // The same message twice in one batch (the flags move only after posting).
      for (size_t k = first; k < i; ++k)
        if (acts[k].op == acts[i].op && acts[k].mb == acts[i].mb && acts[k].chunk == acts[i].chunk)
          fail(i, "the same send/recv appears twice in one batch");
    }
    if (!comm_) fail(first, "a send/recv needs the pipeline communicator");
    // Post every op in action order (in-order pairing per rank pair) as one
    // batch (NCCL groups it: crossing sends cannot deadlock), then wait.
    std::vector<Communicator::P2POp> ops;
    ops.reserve(end - first);
    for (size_t i = first; i < end; ++i) {
      const Action& a = acts[i];
      Slot& sl = slot(a.mb, a.chunk);
      switch (a.op) {
        case Op::SendAct:
          ops.push_back({true, sl.out_act, a.peer, kTag});
          ++stats_.sends;
          break;
        case Op::SendGrad:
          ops.push_back({true, sl.out_grad, a.peer, kTag});
          ++stats_.sends;
          break;
        case Op::RecvAct: {
          Tensor buf = runner_.make_recv_buffer(a.mb, a.chunk);
          if (!buf.defined()) fail(i, "the runner's make_recv_buffer returned an undefined tensor");
          ops.push_back({false, buf, a.peer, kTag});
          hold(sl.in_act, std::move(buf));
          ++stats_.recvs;
          break;
        }
        case Op::RecvGrad: {
          Tensor buf = runner_.make_grad_recv_buffer(a.mb, a.chunk, sl.out_meta.shape, sl.out_meta.dtype,
                                                     sl.out_meta.device);
          if (!buf.defined()) fail(i, "the runner's make_grad_recv_buffer returned an undefined tensor");
          ops.push_back({false, buf, a.peer, kTag});
          hold(sl.in_grad, std::move(buf));
          ++stats_.recvs;
          break;
        }
        default: break;
      }
    }
    ++stats_.batches;
    comm_->batch_p2p_async(ops)->wait();
    ops.clear();
    // Completed: sent buffers go now, received ones wait for their F/B.
    for (size_t i = first; i < end; ++i) {
      const Action& a = acts[i];
      Slot& sl = slot(a.mb, a.chunk);
      switch (a.op) {
        case Op::SendAct:
          take(sl.out_act);
          sl.sent_act = true;
          break;
        case Op::SendGrad:
          take(sl.out_grad);
          sl.sent_grad = true;
          break;
        case Op::RecvAct: sl.recv_act = true; break;
        case Op::RecvGrad: sl.recv_grad = true; break;
        default: break;
      }
    }
  }

  // ---- the end: nothing may be left ----
  void finish() {
    std::vector<std::string> left;
    for (int mb = 0; mb < s_.micro_batches; ++mb)
      for (int c = 0; c < s_.virtual_stages; ++c) {
        const Slot& sl = slot(mb, c);
        const int st = s_.stage(rank_, c);
        if (sl.out_act.defined())
          left.push_back(str("the output of ", text(Op::Forward, mb, c), " was never sent (no ",
                             text(Op::SendAct, mb, c, s_.rank_of_stage(st + 1)), ")"));
        if (sl.out_grad.defined())
          left.push_back(str("the input gradient of ", text(Op::Backward, mb, c), " was never sent (no ",
                             text(Op::SendGrad, mb, c, s_.rank_of_stage(st - 1)), ")"));
        if (sl.in_act.defined())
          left.push_back(str("the input received for ", text(Op::Forward, mb, c), " was never used (no forward)"));
        if (sl.in_grad.defined())
          left.push_back(str("the gradient received for ", text(Op::Backward, mb, c),
                             " was never used (no backward)"));
        if (sl.fwd && !sl.bwd)
          left.push_back(str(text(Op::Forward, mb, c), " ran but ", text(Op::Backward, mb, c), " never did"));
      }
    if (left.empty()) return;
    std::string why;
    for (size_t k = 0; k < left.size() && k < 8; ++k) why += (k ? "; " : "") + left[k];
    if (left.size() > 8) why += str("; and ", left.size() - 8, " more");
    MPT_THROW(str(sched(), ": pipeline rank ", rank_, " finished its ", s_.ranks[static_cast<size_t>(rank_)].size(),
                  " actions with work left: ", why),
              "run validate_schedule() on the schedule first: it proves every rank's list complete");
  }

  const Schedule& s_;
  int rank_;
  Communicator* comm_;
  StageRunner& runner_;
  std::vector<Slot> slots_;
  PipelineStats stats_;
  int64_t in_flight_ = 0, live_buffers_ = 0;
};

}  // namespace

PipelineStats run_pipeline_schedule(const Schedule& s, int pp_rank, Communicator& pp, StageRunner& runner) {
  return Executor(s, pp_rank, &pp, runner).run();
}

PipelineStats run_pipeline_schedule(const Schedule& s, StageRunner& runner) {
  return Executor(s, 0, nullptr, runner).run();
}

}  // namespace mpitron::parallel
