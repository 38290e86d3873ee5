// model/training/moe_step.h — what a Mixture-of-Experts model adds to each training step
// and log line (model/layers/moe_shape.h), owned by the decoder kind
// (model/training/decoder_kind.cpp) when its configuration has experts.
//
//   before a step   the auxiliary losses' gradient scale (the main loss's backward seed)
//                   and empty statistics for the MoE layers to add to
//   after a step    the load-balancing and z losses summed over the layers (pipeline
//                   stages) and averaged over the micro-batches and data-parallel ranks,
//                   like the loss; tokens per expert and dropped choices summed over every
//                   layer, micro-batch and rank; with --moe-router-enable-expert-bias the
//                   biases move before the next forward (Megatron: in finalize_model_grads)
//   log line        load_balancing_loss, z_loss (when their coefficient is on), the busiest
//                   expert's choices over the mean, dropped tokens (Megatron's names)
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "model/layers/moe_shape.h"
#include "model/training/model_kind.h"

namespace mpitron {

class MoeStep {
 public:
  MoeStep(const TrainArgs& args, GPT& core);

  // The start-up line: experts, router, balancing, expert parallelism.
  std::string describe() const;

  void begin_step(float loss_seed);
  const MoeRun* run() const { return &run_; }  // ForwardOptions::moe of a training forward
  // Collective over the pipeline and data-parallel groups.
  void end_step(const HostGroups& groups, int64_t n_micro);
  void record_step(bool counted, TrainSummary& sum);
  void log_interval(LogFields& extra);

 private:
  // One step's (or an interval's) numbers.
  struct Totals {
    double aux = 0, z = 0, dropped = 0;
    std::vector<double> tokens;  // per expert
  };

  GPT& core_;
  GPTConfig cfg_;
  MoeRun run_;       // the flags' settings; loss_scale and stats set here
  MoeStats stats_;   // what the MoE layers add during the step
  int64_t ep_size_;
  std::string dispatcher_;
  Totals step_;      // the last end_step's
  Totals interval_;  // since the last log line: aux and z over the counted steps, the rest over all
  int64_t counted_ = 0;
};

}  // namespace mpitron
