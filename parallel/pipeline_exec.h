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
//   - A send/recv action, or a run of them chained by Action::batched, is posted
//     at once (every isend/irecv issued in action order), then every op of it
//     is waited — torch's batch_isend_irecv + wait. A rank never has p2p in
//     flight outside the batch it is in, so send buffers are dropped only after
//     their Work completed.
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

#include "parallel/communicator.h"
#include "parallel/schedule.h"
#include "tensor/tensor.h"

namespace mpitron::parallel {

// What a pipeline rank computes; the executor owns communication and buffers.
// `chunk` is always a LOCAL chunk (global stage = chunk * pp + pp_rank).
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
  int64_t forwards = 0, backwards = 0;  // runner calls
  // Most (micro-batch, chunk) forwards whose backward had not run yet: what the
  // runner must keep saved activations for (the checker's peak_in_flight).
  int64_t peak_live_activations = 0;
  // Most tensors the executor itself held at once (received activations and
  // gradients awaiting their F/B, outputs and input gradients awaiting their send).
  int64_t peak_live_buffers = 0;
};

// Runs schedule.ranks[pp_rank] on this rank. pp: the pipeline group
// communicator (group rank = pipeline rank; Action::peer is a group rank);
// pp.size() must be s.pp and pp.rank() must be pp_rank. Throws mpitron::Error
// (rank, position, action text) when the schedule asks for something
// impossible at run time; communication failures and timeouts propagate as the
// Communicator throws them.
PipelineStats run_pipeline_schedule(const Schedule& s, int pp_rank, Communicator& pp, StageRunner& runner);

// pp = 1 (one rank runs every stage, e.g. v local chunks): no communicator is
// needed, as no action may send or receive. Throws when s.pp != 1.
PipelineStats run_pipeline_schedule(const Schedule& s, StageRunner& runner);

}  // namespace mpitron::parallel
