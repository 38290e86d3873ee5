#include "model/checkpoint/checkpoint_config.h"

#include <filesystem>

#include "core/error.h"
#include "model/arch_fields.h"
#include "model/checkpoint/megatron_checkpoint.h"

namespace mpitron {

bool checkpoint_exists(const std::string& load_dir) {
  return std::filesystem::exists(std::filesystem::path(load_dir) / io::kTrackerFileName);
}

io::CheckpointReader open_latest_checkpoint(const std::string& load_dir) {
  io::CheckpointReader r = io::CheckpointReader::open_latest(load_dir);
  MPT_CHECK(r.found(), str("no checkpoint in ", load_dir),
            "pass the directory given to pretrain_gpt --save (it holds latest_checkpointed_iteration.txt)");
  return r;
}

GPTConfig checkpoint_config(const io::CheckpointReader& r) {
  MPT_CHECK(r.has_attr("model_config"), str("checkpoint ", r.path(), " has no model_config attribute"),
            "was it written by mpitron's save_checkpoint?");
  return config_from_json(r.attr_json("model_config"), str("checkpoint ", r.path()));
}

GPTConfig read_checkpoint_config(const std::string& load_dir) {
  if (detect_megatron_checkpoint(load_dir).format != MegatronFormat::None) return megatron_config(load_dir);
  return checkpoint_config(open_latest_checkpoint(load_dir));
}

}  // namespace mpitron
