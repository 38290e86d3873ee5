#include "model/training/adamw_checkpoint.h"

namespace mpitron {

SaveInfo save_checkpoint(const std::string& save_dir, const GPT& model, const ReplicatedOptimizer& opt,
                         const LossScaler& scaler, const TrainState& st, const std::string& flags_json,
                         const std::string& lr_schedule_json, int keep_last) {
  return save_checkpoint(save_dir, model,
                         OptimState{opt.master(), opt.exp_avg(), opt.exp_avg_sq(), 0, opt.steps_taken(), opt.optimizer()},
                         scaler, st, flags_json, lr_schedule_json, keep_last, MPI_COMM_NULL, true);
}

bool load_checkpoint(const std::string& load_dir, GPT& model, ReplicatedOptimizer& opt, LossScaler& scaler,
                     TrainState& st, const LoadOptions& o, SaveInfo* info) {
  OptimState full;
  if (!load_checkpoint(load_dir, model, full, 0, model.params().numel(), scaler, st, o, info, MPI_COMM_NULL))
    return false;
  opt.master().copy_from(full.master.to(opt.master().device()));
  if (full.exp_avg.defined()) {
    opt.exp_avg().copy_from(full.exp_avg.to(opt.exp_avg().device()));
    if (opt.exp_avg_sq().defined()) opt.exp_avg_sq().copy_from(full.exp_avg_sq.to(opt.exp_avg_sq().device()));
  }
  if (o.load_optim && !o.finetune) opt.set_steps_taken(full.steps);
  opt.sync_values_from_master();
  return true;
}

}  // namespace mpitron
