// model/training/adamw_checkpoint.h — one-process conveniences over the checkpoint layer
// (model/checkpoint/checkpointing.h): save and load a whole ReplicatedOptimizer.
#pragma once
#include "model/checkpoint/checkpointing.h"
#include "model/training/optimizer.h"

namespace mpitron {

SaveInfo save_checkpoint(const std::string& save_dir, const GPT& model, const ReplicatedOptimizer& opt,
                         const LossScaler& scaler, const TrainState& st, const std::string& flags_json,
                         const std::string& lr_schedule_json, int keep_last = 0);
bool load_checkpoint(const std::string& load_dir, GPT& model, ReplicatedOptimizer& opt, LossScaler& scaler,
                     TrainState& st, const LoadOptions& o, SaveInfo* info = nullptr);

}  // namespace mpitron
