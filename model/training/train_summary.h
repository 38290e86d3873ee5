// model/training/train_summary.h — what Trainer::run returns: the run's losses, the final
// evaluation, and the per-iteration numbers tests and callers compare.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace mpitron {

struct TrainSummary {
  double first_loss = 0, last_loss = 0;  // train loss at the first and last logged iterations
  double valid_loss = 0, valid_ppl = 0;  // the final evaluation
  int64_t iterations = 0;
  int64_t steps_run = 0;       // optimizer steps this run took (0: a resumed run already at its end)
  int64_t spike_skips = 0;     // steps skipped as loss / grad-norm spikes (--skip-spike-zscore)
  int64_t spike_reruns = 0;    // of those, how many went back to the newest checkpoint (--spike-rerun)
  std::string checkpoint_dir;
  double tokens_per_second = 0;
  std::vector<double> losses;  // per iteration: the loss trained on (GPT: lm loss; BERT: lm + sop)
  std::vector<double> lm_losses, sop_losses;  // BERT: per iteration, the two parts of `losses`
  std::vector<double> grad_norms;  // per iteration (before clipping)
  std::vector<double> lrs, weight_decays;  // per iteration: the schedule's learning rate and weight decay it used
  std::vector<double> moe_aux_losses;  // MoE: per iteration, the load-balancing loss (summed over the layers)
  bool signalled = false;      // stopped by SIGTERM/SIGUSR1 (--exit-signal-handler)
  std::vector<double> accuracies;  // eval_sets() sources: after each evaluation, correct / total over every set
  int64_t peak_memory_bytes = 0;       // measured tensor memory peak (as of the last log line)
  int64_t estimated_memory_bytes = 0;  // model/memory.h's estimate printed at start-up
};

}  // namespace mpitron
