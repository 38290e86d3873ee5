// io/deepspeed_checkpoint.h — a DeepSpeed ZeRO checkpoint (engine.save_checkpoint) read as
// named fp32 tensors: the master weights and Adam's moments, reassembled from the data-parallel
// partitions with no PyTorch (io/torch_checkpoint.h reads the files).
//
// A directory DIR holds `latest` (the tag, e.g. "global_step2") and DIR/<tag>/ with
//   mp_rank_00_model_states.pt                          ZeRO-1/2: 'module' (the compute-dtype
//                                                       weights), 'param_shapes' (per param group
//                                                       an OrderedDict name -> torch.Size, in
//                                                       partition order), 'shared_params', ...
//   zero_pp_rank_R_mp_rank_00_model_states.pt           ZeRO-3: the same, one per rank
//   [bf16_]zero_pp_rank_R_mp_rank_00_optim_states.pt    per data-parallel rank R, under
//                                                       'optimizer_state_dict':
//     ZeRO-1/2: single_partition_of_fp32_groups[g]      rank R's slice of group g's flat fp32
//               base_optimizer_state (bf16) or          vector: the group's parameters back to
//               optimizer_state_dict .state[g]          back (+ param_alignment_paddings), the
//                 .exp_avg / .exp_avg_sq / .step        slices of the ranks concatenated
//     ZeRO-3:   fp32_flat_groups[g]                      each parameter split in ceil(numel / W)
//               optimizer_state_dict.state[g]....        elements per rank (zero padded), the
//                                                       parameters back to back in each rank's
//                                                       groups (concatenated)
// exactly as DeepSpeed's zero_to_fp32.py and ds_to_universal read them. Each read touches only
// the byte ranges of the parameter asked for.
//
// Refused by name: pipeline-engine checkpoints (layer_XX-model_states.pt), tensor-parallel
// ones (mp_rank_01...), several parameter groups with different partition counts (MoE), frozen
// parameters, a world size that is not the number of optim files.
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "io/torch_checkpoint.h"

namespace mpitron::io {

struct DeepSpeedParam {
  std::string name;            // the module's parameter name ("blocks.0.qkv.weight")
  std::vector<int64_t> shape;
  int64_t numel = 0;
  int64_t group = 0;
  int64_t offset = 0;  // ZeRO-1/2: in the group's merged vector; ZeRO-3: in each rank's concatenated groups
};

class DeepSpeedCheckpoint {
 public:
  // dir: the directory holding `latest`, or a tag directory (global_stepN/) itself.
  explicit DeepSpeedCheckpoint(const std::string& dir);
  const std::string& tag_dir() const { return tag_dir_; }
  int zero_stage() const { return stage_; }
  int world_size() const { return world_; }
  const std::vector<DeepSpeedParam>& params() const { return params_; }
  const DeepSpeedParam& param(const std::string& name) const;
  // The whole parameter, row-major, f32. key: "fp32" (master weights), "exp_avg", "exp_avg_sq".
  std::vector<float> read(const std::string& name, const std::string& key) const;
  // Adam's step count (state[0].step).
  int64_t step() const;
  // The model states file (rank 0's): 'module', 'global_steps', 'lr_scheduler', 'ds_config', ...
  const TorchFile& model_states() const { return model_states_.front(); }

 private:
  const TorchTensor& flat(int rank, int64_t group, const std::string& key) const;
  // Elements [begin, begin + n) of the concatenation over ranks of each rank's `part(rank)` tensor.
  void read_span(int64_t group, const std::string& key, int64_t begin, int64_t n, float* dst) const;
  std::string tag_dir_;
  int stage_ = 0, world_ = 0;
  std::vector<TorchFile> model_states_;  // one: rank 0's
  std::vector<TorchFile> optim_;  // by rank
  std::vector<DeepSpeedParam> params_;
  std::map<std::string, size_t> by_name_;
};

}  // namespace mpitron::io
