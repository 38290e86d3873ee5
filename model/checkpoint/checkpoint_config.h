// model/checkpoint/checkpoint_config.h — what a --load directory holds before any model is
// built: whether it has a checkpoint, and the model configuration of its newest one (the
// `model_config` attribute). Training (--use-checkpoint-args, the vocabulary check) and the
// inference tools (the flags checked against it) both read it here.
#pragma once
#include <string>

#include "io/checkpoint.h"
#include "model/config.h"

namespace mpitron {

// True when load_dir names a --save directory that has committed a checkpoint.
bool checkpoint_exists(const std::string& load_dir);

// The GPTConfig stored in the newest checkpoint's `model_config` attribute (dropout 0).
// Throws when load_dir holds no checkpoint.
GPTConfig read_checkpoint_config(const std::string& load_dir);

// The newest intact checkpoint of load_dir, open for reading; throws naming the directory
// when there is none.
io::CheckpointReader open_latest_checkpoint(const std::string& load_dir);
// The GPTConfig of an open checkpoint (throws when it has no model_config).
GPTConfig checkpoint_config(const io::CheckpointReader& r);

}  // namespace mpitron
