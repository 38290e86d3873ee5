// model/training/model_states.h — how a rank holds the model states (parameters,
// gradients, optimizer state): ONE interface, one implementation per strategy.
//
//   replicated   every rank holds everything; dp > 1 all-reduces gradients in buckets
//   ZeRO-1       optimizer state sharded over dp (--use-distributed-optimizer)
//   ZeRO-2       + gradients reduce-scattered to their owner every micro-batch
//   ZeRO-3       + parameters sharded: a unit (a block, an embedding table, the output
//                matrix) is all-gathered before its forward and again before its
//                backward, freed after use (model/training/states_zero3.cpp)
// Every implementation takes its optimizer step (--optimizer: AdamW or SGD) from
// parallel/flat_optimizer.h. The trainer calls only this interface (model/training/trainer.cpp
// has no branch on the strategy or the optimizer); make_model_states() picks the implementation from a table keyed by the stage.
//
// A training step, as the trainer drives it:
//   zero_grad();
//   per micro-batch (a pipeline step: once around the whole schedule):
//     begin_backward(last);  forward with add_hooks(o, ...);  backward;  end_backward();
//   step(lr, loss_scale, veto);
// Evaluation forwards take add_forward_hooks(); a checkpoint save reads only
// local_state(); whole() makes the model's values whole in the ParamSet (a load,
// statistics, the end of the run).
#pragma once
#include <functional>
#include <memory>
#include <string>
#include <utility>

#include <mpi.h>

#include "model/gpt.h"
#include "model/memory.h"
#include "model/checkpoint/checkpointing.h"
#include "parallel/data_parallel.h"
#include "parallel/flat_optimizer.h"
#include "parallel/zero.h"

namespace mpitron {

class Communicator;

struct StatesConfig {
  int stage = 0;                      // --zero-stage 0..3 (--use-distributed-optimizer = 1)
  OptimizerConfig optim;
  DDPConfig ddp;                      // gradient buckets (replicated, ZeRO-1/2)
  bool overlap_param_gather = false;  // --overlap-param-gather (ZeRO-1/2)
  Zero3Config zero3;
  // Expert parallelism: the experts' gradients over experts.edp; under ZeRO every state is
  // sharded over edp (the dense gradients summed over ep first). norm_group is then tp × pp × ep.
  ExpertGroups experts;
};

class ModelStates {
 public:
  virtual ~ModelStates() = default;
  virtual std::string describe() const = 0;  // for the start-up log

  // ---- a training step ----
  virtual void zero_grad() = 0;
  // Before a micro-batch's backward; last: the step's last micro-batch (a pipeline
  // step calls it once, last = true, around the whole schedule).
  virtual void begin_backward(bool last) = 0;
  // The hooks a chunk's forward/backward needs (parameters gathered before use,
  // gradients reduced when final); grads_final: this backward makes the chunk's
  // gradients final for the step (a pipeline chunk's last backward).
  virtual void add_hooks(ForwardOptions& o, bool grads_final) = 0;
  virtual void end_backward() = 0;
  // A forward without backward (evaluation): its parameters ready as it reads them.
  virtual void add_forward_hooks(ForwardOptions& o) = 0;
  // The update (gradients divided by loss_scale): norm, veto, clip, the --optimizer update; the
  // values are current for the next forward.
  virtual StepResult step(float lr, float loss_scale, const std::function<bool(double)>& veto) = 0;
  // The weight decay of the next steps' decaying parameters (the schedule's; default --weight-decay).
  virtual void set_weight_decay(float wd) = 0;

  // ---- outside steps ----
  // The ParamSet's flat value buffer holds every value (waits for in-flight gathers;
  // ZeRO-3 gathers the whole model until the next zero_grad() or install()): before
  // a checkpoint load, the params-norm statistic and at the end of the run.
  virtual void whole() = 0;

  // ---- checkpoint state: this rank's slice [begin, end) of the flat buffer ----
  virtual OptimState local_state() const = 0;
  virtual std::pair<int64_t, int64_t> state_range() const = 0;
  // After load_checkpoint (which wrote the whole values): install this rank's slice.
  virtual void install(const OptimState& s, bool with_optim) = 0;
  // Every rank holds its own slice (written by every rank), or replicas (one writes).
  virtual bool sharded() const = 0;
  // The gradients of state_range() after step() (statistics; f32).
  virtual Tensor grad_slice() const = 0;

  // ---- the start-up memory estimate (model/memory.h) ----
  // The ZeRO stage whose terms estimate_memory() applies (0: replicated), and this
  // strategy's own terms written into the rank's shard description.
  virtual int memory_stage() const = 0;
  virtual void account(RankShard&) const {}

  // ---- pipeline parallelism ----
  // After the last backward of a step, before end_backward(): parameter i's gradient (p: its Var)
  // summed over `group` (the word embedding's copies on the first and last stage). Default: the
  // all-reduce of p's gradient; ZeRO-3 sums its dp-reduced shard of a sharded table.
  virtual void sum_grad_over(const Var& p, size_t i, Communicator& group);
};

// ZeRO-3's units, in ParamSet order: each block (its parameters layers.<l>.*, contiguous
// in the flat buffer), each parameter outside blocks that the model hooks at every use
// (`hooked`: GPT::hooked_outside_params, the embedding tables and the output matrix), and each
// run of the other parameters outside blocks. Sharded (gathered on demand): the blocks and
// hooked parameters of more than `persistence_threshold` elements; the rest are persistent
// (kept whole on every rank, as DeepSpeed's stage3_param_persistence_threshold).
struct StateUnit {
  size_t first = 0, end = 0;    // parameters [first, end)
  int64_t begin = 0, stop = 0;  // flat elements [begin, stop)
  bool sharded = false;         // gathered on demand (else persistent)
  bool outside = false;         // outside blocks (a hooked parameter, or a run of others)
  int64_t size() const { return stop - begin; }
};
std::vector<StateUnit> zero3_units(const ParamSet& ps, int64_t persistence_threshold, const std::vector<size_t>& hooked);
// What a rank of ZeRO-3 holds besides its shards (model/memory.h's RankShard).
struct Zero3Footprint {
  int64_t largest_block = 0;    // elements of the largest sharded block
  int64_t largest_outside = 0;  // ... of the largest sharded parameter outside blocks (gathered alone)
  int64_t persistent = 0;       // elements kept whole
  int live_blocks = 1;          // blocks gathered at once (2 with the prefetch)
};
Zero3Footprint zero3_footprint(const ParamSet& ps, const Zero3Config& cfg, const std::vector<size_t>& hooked);

// The implementation for cfg.stage (0 with grad_comm of one rank: replicated).
// grad_comm: where gradients are reduced (dp, or dp x cp); norm_group: tp x pp.
std::unique_ptr<ModelStates> make_model_states(const StatesConfig& cfg, GPT& model, Communicator* grad_comm,
                                               Communicator* norm_group);

}  // namespace mpitron
