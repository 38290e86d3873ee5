// parallel/pipeline_exec.cpp — the pipeline executor (see pipeline_exec.h).
#include "parallel/pipeline_exec.h"

#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <map>
#include <memory>
#include <vector>

#include "core/error.h"

namespace mpitron::parallel {

Tensor StageRunner::backward_input(int mb, int chunk, const Tensor&) {
  MPT_THROW(str("this runner cannot split backward (B", mb, ".", chunk,
                " of a schedule with W actions asks for the input gradient alone)"),
            "run a schedule without W actions (gpipe, 1f1b, interleaved), or implement "
            "StageRunner::backward_input and backward_weight");
}

void StageRunner::backward_weight(int mb, int chunk) {
  MPT_THROW(str("this runner cannot split backward (W", mb, ".", chunk, " asks for the weight gradient alone)"),
            "run a schedule without W actions (gpipe, 1f1b, interleaved), or implement "
            "StageRunner::backward_input and backward_weight");
}

// ---- profile ----------------------------------------------------------------------

namespace {

double median(std::vector<double> v) {
  if (v.empty()) return -1;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

}  // namespace

Costs PipelineProfile::costs() const {
  Costs c;
  std::map<std::pair<int, int>, std::vector<double>> by;  // (stage, op) -> times
  for (const Sample& x : compute) by[{x.stage, static_cast<int>(x.op)}].push_back(x.ms);
  const int S = stages;
  c.stage_forward.assign(static_cast<size_t>(S), -1);
  c.stage_backward.assign(static_cast<size_t>(S), -1);
  if (split) c.stage_weight.assign(static_cast<size_t>(S), -1);
  for (int st = 0; st < S; ++st) {
    c.stage_forward[st] = median(by[{st, static_cast<int>(Op::Forward)}]);
    c.stage_backward[st] = median(by[{st, static_cast<int>(Op::Backward)}]);
    if (split) c.stage_weight[st] = median(by[{st, static_cast<int>(Op::Weight)}]);
  }
  if (!p2p_ms.empty()) {
    std::vector<double> v = p2p_ms;
    std::sort(v.begin(), v.end());
    c.p2p = v[v.size() / 10];
  }
  c.weight = split ? 0 : -1;  // scalars matter only for stages nobody measured
  return c;
}

void PipelineProfile::clear() {
  compute.clear();
  p2p_ms.clear();
}

Costs gather_pipeline_costs(const PipelineProfile& mine, Communicator& pp) {
  Costs c = mine.costs();
  const size_t S = c.stage_forward.size();
  // [F..., B..., W..., p2p]: each stage is run by one rank, the others hold -1; MAX merges.
  std::vector<double> buf;
  buf.insert(buf.end(), c.stage_forward.begin(), c.stage_forward.end());
  buf.insert(buf.end(), c.stage_backward.begin(), c.stage_backward.end());
  std::vector<double> w = c.stage_weight;
  w.resize(S, -1);
  buf.insert(buf.end(), w.begin(), w.end());
  buf.push_back(c.p2p);
  buf.push_back(mine.split ? 1.0 : 0.0);
  std::vector<double> out(buf.size());
  MPI_Allreduce(buf.data(), out.data(), static_cast<int>(buf.size()), MPI_DOUBLE, MPI_MAX, pp.mpi_comm());
  Costs g;
  g.stage_forward.assign(out.begin(), out.begin() + static_cast<long>(S));
  g.stage_backward.assign(out.begin() + static_cast<long>(S), out.begin() + static_cast<long>(2 * S));
  const bool split = out[3 * S + 1] > 0;
  if (split) g.stage_weight.assign(out.begin() + static_cast<long>(2 * S), out.begin() + static_cast<long>(3 * S));
  g.p2p = out[3 * S];
  double f = 0, b = 0, ww = 0;
  for (size_t st = 0; st < S; ++st) {
    f += g.stage_forward[st];
    b += g.stage_backward[st];
    if (split) ww += g.stage_weight[st];
  }
  if (S > 0) {
    g.forward = f / S;
    g.backward = b / S;
    g.weight = split ? ww / S : -1;
  }
  return g;
}

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
  std::shared_ptr<Work> act_arrives;   // the batch receiving in_act, until F waited for it
  Tensor out_act;   // F's output until SA sends it
  Tensor in_grad;   // RG's buffer (or the local next chunk's input gradient) until B consumes it
  std::shared_ptr<Work> grad_arrives;  // the batch receiving in_grad, until B waited for it
  Tensor out_grad;  // B's input gradient until SG sends it
  bool has_meta = false;
  Meta out_meta;    // what F's output looked like (for RG's buffer)
  bool recv_act = false, fwd = false, sent_act = false;
  bool recv_grad = false, bwd = false, sent_grad = false;
  bool wgt = false;  // W ran (split backward)
};

double now_ms() {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

class Executor {
 public:
  Executor(const Schedule& s, int rank, Communicator* comm, StageRunner& runner, PipelineProfile* profile)
      : s_(s), rank_(rank), comm_(comm), runner_(runner), profile_(profile) {}

  PipelineStats run() {
    check_sizes();
    split_ = has_weight_actions(s_);
    if (split_ && !runner_.can_split_backward())
      MPT_THROW(str(sched(), " has W actions, but this runner cannot split backward (pipeline rank ", rank_, ")"),
                "run a schedule without W actions (gpipe, 1f1b, interleaved), or implement StageRunner::"
                "backward_input and backward_weight and return true from can_split_backward");
    if (!runner_.supports_placement(s_))
      MPT_THROW(str(sched(), " uses placement ", s_.placement_kind(), ", but this runner's model chunks are laid out "
                    "for another (pipeline rank ", rank_, ")"),
                "lay out the runner's chunks by Schedule::stage(rank, chunk) and override "
                "StageRunner::supports_placement, or use a round-robin schedule (gpipe, 1f1b, interleaved, zb-h1)");
    if (profile_) {
      profile_->stages = s_.stages();
      profile_->split = split_;
    }
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
    const std::string bad = placement_error(s_.placement, s_.pp, s_.virtual_stages);
    if (!bad.empty()) MPT_THROW(str(sched(), ": bad placement: ", bad), "see docs/pipeline-schedules.md, 'Placement'");
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

  // ---- timing ----
  double clock() const {
    if (profile_ && profile_->sync) profile_->sync();
    return now_ms();
  }
  void record(const Action& a, int stage, double t0) {
    if (profile_) profile_->compute.push_back({a.op, a.mb, a.chunk, stage, clock() - t0});
  }

  // ---- F / B / W ----
  // A received buffer is used only once its batch completed (the batch was posted earlier, so
  // the compute in between overlapped it).
  void arrived(std::shared_ptr<Work>& w) {
    if (!w) return;
    w->wait();
    w.reset();
  }
  // Completed batches go (their sent buffers with them); test() also drives MPI's progress.
  void reap() {
    in_flight_p2p_.erase(std::remove_if(in_flight_p2p_.begin(), in_flight_p2p_.end(),
                                        [](const std::shared_ptr<Work>& w) { return w->test(); }),
                         in_flight_p2p_.end());
  }

  void compute(size_t i) {
    check_range(i);
    reap();
    const Action& a = s_.ranks[static_cast<size_t>(rank_)][i];
    const int st = s_.stage(rank_, a.chunk);
    const int last = s_.stages() - 1;
    Slot& sl = slot(a.mb, a.chunk);
    if (a.op == Op::Weight) {
      if (!split_) fail(i, "a W in a schedule without split backward");  // unreachable: W makes split_
      if (!sl.bwd) fail(i, str("weight gradient before its input gradient: ", text(Op::Backward, a.mb, a.chunk),
                               " has not run on this rank"));
      if (sl.wgt) fail(i, "W runs twice");
      const double t0 = profile_ ? clock() : 0;
      runner_.backward_weight(a.mb, a.chunk);
      record(a, st, t0);
      ++stats_.weights;
      sl.wgt = true;
      --in_flight_;
      return;
    }
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
        arrived(sl.act_arrives);
        input = take(sl.in_act);
      }
      const double t0 = profile_ ? clock() : 0;
      Tensor out = runner_.forward(a.mb, a.chunk, input);
      record(a, st, t0);
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
      arrived(sl.grad_arrives);
      grad = take(sl.in_grad);
    }
    const double t0 = profile_ ? clock() : 0;
    Tensor din = split_ ? runner_.backward_input(a.mb, a.chunk, grad) : runner_.backward(a.mb, a.chunk, grad);
    record(a, st, t0);
    grad = Tensor();
    ++stats_.backwards;
    sl.bwd = true;
    sl.has_meta = false;
    sl.out_meta = Meta{};
    if (!split_) --in_flight_;  // with W, the activations stay until W
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
    const double t0 = profile_ ? clock() : 0;
    std::shared_ptr<Work> work = comm_->batch_p2p_async(ops);
    if (profile_) {  // measured per batch for schedule_sim: posted and completed here
      work->wait();
      profile_->p2p_ms.push_back(clock() - t0);
    }
    ops.clear();
    // Posted, not waited: sends complete in the background (the Work holds their
    // buffers), a received buffer is waited for by the F/B that uses it.
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
        case Op::RecvAct:
          sl.recv_act = true;
          sl.act_arrives = work;
          break;
        case Op::RecvGrad:
          sl.recv_grad = true;
          sl.grad_arrives = work;
          break;
        default: break;
      }
    }
    in_flight_p2p_.push_back(std::move(work));
    reap();
  }

  // ---- the end: nothing may be left ----
  void finish() {
    for (auto& w : in_flight_p2p_) w->wait();  // the last sends
    in_flight_p2p_.clear();
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
        if (split_ && sl.bwd && !sl.wgt)
          left.push_back(str(text(Op::Backward, mb, c), " ran but ", text(Op::Weight, mb, c),
                             " never did (its weight gradients are missing)"));
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
  PipelineProfile* profile_;
  bool split_ = false;  // the schedule has W actions: B is backward_input, W backward_weight
  std::vector<Slot> slots_;
  std::vector<std::shared_ptr<Work>> in_flight_p2p_;  // posted batches not known to be complete
  PipelineStats stats_;
  int64_t in_flight_ = 0, live_buffers_ = 0;
};

}  // namespace

PipelineStats run_pipeline_schedule(const Schedule& s, int pp_rank, Communicator& pp, StageRunner& runner,
                                    PipelineProfile* profile) {
  return Executor(s, pp_rank, &pp, runner, profile).run();
}

PipelineStats run_pipeline_schedule(const Schedule& s, StageRunner& runner, PipelineProfile* profile) {
  return Executor(s, 0, nullptr, runner, profile).run();
}

}  // namespace mpitron::parallel
