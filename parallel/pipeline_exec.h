// parallel/pipeline_exec.h — runs a pipeline Schedule (schedule.h) on real ranks.
//
// The executor walks schedule.ranks[pp_rank] in order. It owns the
// point-to-point traffic and the tensors in transit; a StageRunner does the
// compute (forward/backward of one model chunk for one micro-batch) and keeps
// whatever it needs between the two (saved activations, gradients).
//
// Semantics (docs/pipeline-schedules.md, "Executing"):
//   - F(mb, c) takes the activation RA(mb, c) received (or, when the previous
//     stage is on this rank — pp = 1 with virtual stages — the output of that
//     local forward; nothing on global stage 0) and hands it to runner.forward.
//     The returned output is kept until SA(mb, c) sent it (or handed on to the
//     next local chunk); on the last global stage it is dropped.
//   - B(mb, c) likewise takes the gradient RG(mb, c) received (or the local
//     B(mb, c+1)'s; nothing on the last global stage) and keeps the returned
//     input gradient until SG(mb, c) sent it (dropped on global stage 0).
//   - Split backward (zero bubble): when the schedule has W actions, B calls
//     runner.backward_input (input gradient only; the runner saves what the
//     weight gradient needs) and W(mb, c) calls runner.backward_weight.
//     Otherwise B calls runner.backward (both at once) and there is no W.
//   - Placement: neighbour stages on the same rank (pp = 1 with virtual stages,
//     or the V placement's turn on the last rank) hand tensors over locally;
//     Schedule::stage / rank_of_stage / chunk_of_stage say where stages live.
//   - A send/recv action, or a run of them chained by Action::batched, is posted
//     at once (every isend/irecv issued in action order) as one batch — torch's
//     batch_isend_irecv — and not waited for (Megatron's overlapped p2p): the
//     compute that follows runs while it is in flight. A received buffer is
//     waited for by the F/B that uses it; sends complete in the background (the
//     batch's Work holds their buffers; test() on every action drives MPI's
//     progress and drops completed batches); everything is waited for at the end.
//     On NCCL the batch is ordered after the compute queued before it (its
//     buffers' producers, and the users of the memory a receive buffer reuses) and
//     the F/B that uses a received buffer after the batch — nothing else waits.
//     With a profile, each batch is waited for at once (its time is measured).
//   - Every message uses tag 0 on the pp communicator: MPI matches in posting
//     order between a pair of ranks, exactly the checker's rule "the n-th send
//     src posts pairs with the n-th recv dst posts".
//   - Each buffer is freed as soon as it is used; when the list ends every one
//     must be gone and every forward must have had its backward (else Error).
//
// The executor does not run the checker: validate_schedule (schedule_check.h)
// proves the whole schedule (all ranks) complete and deadlock-free and should
// be called first. What the executor does check, locally and before anything
// of the offending action is posted, is everything that would make THIS rank's
// list impossible to run (B before its F, a send of an output not produced yet
// or already sent, a recv whose buffer is already held, a peer that does not
// hold the neighbour stage, …): it throws an Error naming the pipeline rank,
// the action's position and text ("F3.1") and, for parsed schedules, its
// line:column — instead of hanging on a message that can never come.
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "parallel/communicator.h"
#include "parallel/schedule.h"
#include "parallel/schedule_sim.h"  // Costs (what a profile measures)
#include "tensor/tensor.h"

namespace mpitron::parallel {

// What a pipeline rank computes; the executor owns communication and buffers.
// `chunk` is always a LOCAL chunk (global stage = schedule.stage(pp_rank, chunk);
// chunk * pp + pp_rank under the default round-robin placement).
class StageRunner {
 public:
  virtual ~StageRunner() = default;
  // Forward of micro-batch mb through local chunk `chunk`. `input` is the
  // activation received for (mb, chunk) — undefined (Tensor()) when this chunk
  // is the first global stage. Returns the output activation to send; on the
  // last global stage return Tensor() (the loss stays inside the runner; a
  // returned tensor is ignored there).
  virtual Tensor forward(int mb, int chunk, const Tensor& input) = 0;
  // Backward of (mb, chunk). grad_output: the gradient received for the output
  // — undefined on the last global stage (the runner seeds from its loss).
  // Returns d(input) to send; Tensor() on the first global stage (ignored there).
  virtual Tensor backward(int mb, int chunk, const Tensor& grad_output) = 0;
  // Split backward, for schedules with W actions (zb-h1, zbv, files with W):
  // backward_input is B — d(input) only, same arguments and return as
  // backward — and must keep whatever the weight gradient needs (layer inputs,
  // output gradients) for backward_weight(mb, chunk), which is W: accumulate
  // this micro-batch's weight gradients of the chunk and free what B kept.
  // backward_weight runs exactly once after backward_input of the same
  // (mb, chunk), possibly after other micro-batches' F/B. The defaults throw:
  // a runner that cannot split runs only schedules without W.
  virtual Tensor backward_input(int mb, int chunk, const Tensor& grad_output);
  virtual void backward_weight(int mb, int chunk);
  // Override to return true together with backward_input/backward_weight: the
  // executor refuses a schedule with W actions up front otherwise.
  virtual bool can_split_backward() const { return false; }
  // Whether this runner's local chunks are the stages `s` places on this rank
  // (chunk c = s.stage(pp_rank, c)). The default accepts only the round-robin
  // placement (Megatron's virtual-pipeline layout: chunk c is stage c*pp + r);
  // a runner that builds its chunks from Schedule::stage overrides it to accept
  // V and explicit placements. The executor refuses other placements up front.
  virtual bool supports_placement(const Schedule& s) const { return s.placement_kind() == "round-robin"; }
  // A tensor to receive the input activation of (mb, chunk) into (RA): its
  // shape, dtype and device. Contents are overwritten.
  virtual Tensor make_recv_buffer(int mb, int chunk) = 0;
  // A tensor to receive the gradient of (mb, chunk)'s OUTPUT into (RG). By
  // default it looks like the output forward(mb, chunk) returned (shape, dtype
  // and device are remembered after the output itself is freed).
  virtual Tensor make_grad_recv_buffer(int mb, int chunk, const Shape& output_shape, DType output_dtype,
                                       Device output_device) {
    (void)mb;
    (void)chunk;
    return Tensor::empty(output_shape, output_dtype, output_device);
  }
};

struct PipelineStats {
  int64_t sends = 0, recvs = 0;         // p2p ops posted
  int64_t batches = 0;                  // p2p posts (a batch of k ops counts once)
  int64_t forwards = 0, backwards = 0;  // runner calls (backwards: backward or backward_input)
  int64_t weights = 0;                  // backward_weight calls (W actions)
  // Most (micro-batch, chunk) forwards whose backward (W, when the schedule
  // splits it) had not run yet: what the runner must keep saved activations for
  // (the checker's peak_in_flight).
  int64_t peak_live_activations = 0;
  // Most tensors the executor itself held at once (received activations and
  // gradients awaiting their F/B, outputs and input gradients awaiting their send).
  int64_t peak_live_buffers = 0;
};

// Per-action wall times of one or more steps on this rank, for schedule_sim.
// Pass the same profile to run_pipeline_schedule for every profiled step; then
// write a costs file (parse_costs / schedule_sim --costs):
//
//   parallel::PipelineProfile prof;
//   prof.sync = [&] { device_synchronize(); };            // GPU: time the work, not the launch
//   for (each profiled step) run_pipeline_schedule(sched, pp_rank, pp, runner, &prof);
//   parallel::Costs c = parallel::gather_pipeline_costs(prof, pp);  // collective over pp
//   if (pp_rank == 0) parallel::write_costs_file(c, path);
//
// (pp = 1: prof.costs() is already complete.) Times are milliseconds.
struct PipelineProfile {
  // Called right before each clock reading when set, e.g. a device
  // synchronize: CUDA work is asynchronous, the host clock would time launches.
  std::function<void()> sync;
  struct Sample {
    Op op = Op::Forward;  // F, B or W
    int mb = 0, chunk = 0, stage = 0;
    double ms = 0;
  };
  std::vector<Sample> compute;  // every F/B/W this rank ran, in order
  std::vector<double> p2p_ms;   // every send/recv batch: from posting to completion
  int stages = 0;               // global stages of the profiled schedule
  bool split = false;           // the profiled schedule had W actions (B = input gradient only)

  // Medians per stage this rank ran (stage vectors of size `stages`, -1 for
  // stages it did not run) and p2p = the 10th percentile of the batch times
  // (batches whose peer was already waiting time the transfer alone; the
  // others include waiting). Without W, B is the whole backward (weight unset).
  Costs costs() const;
  void clear();
};

// Every pipeline rank's profile merged (collective over pp: all ranks call it,
// all get the result): each stage's medians from the rank that ran it, p2p the
// largest of the ranks' estimates.
Costs gather_pipeline_costs(const PipelineProfile& mine, Communicator& pp);

// Runs schedule.ranks[pp_rank] on this rank. pp: the pipeline group
// communicator (group rank = pipeline rank; Action::peer is a group rank);
// pp.size() must be s.pp and pp.rank() must be pp_rank. Throws mpitron::Error
// (rank, position, action text) when the schedule asks for something
// impossible at run time; communication failures and timeouts propagate as the
// Communicator throws them.
// profile: when given, every F/B/W and p2p batch is timed into it.
PipelineStats run_pipeline_schedule(const Schedule& s, int pp_rank, Communicator& pp, StageRunner& runner,
                                    PipelineProfile* profile = nullptr);

// pp = 1 (one rank runs every stage, e.g. v local chunks): no communicator is
// needed, as no action may send or receive. Throws when s.pp != 1.
PipelineStats run_pipeline_schedule(const Schedule& s, StageRunner& runner, PipelineProfile* profile = nullptr);

}  // namespace mpitron::parallel
