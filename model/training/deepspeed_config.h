// model/training/deepspeed_config.h — a DeepSpeed JSON (`--deepspeed --deepspeed_config ds.json`)
// read into the training options it stands for, as Megatron-DeepSpeed scripts use it.
//
//   train_micro_batch_size_per_gpu  → --micro-batch-size
//   train_batch_size                → --global-batch-size
//   gradient_accumulation_steps     → checked: global = micro × accumulation × dp
//   gradient_clipping               → --clip-grad
//   zero_optimization.stage 0–3     → --zero-stage (also overlap_comm → --[no-]overlap-grad-reduce,
//                                     reduce_bucket_size → --ddp-bucket-size; stage 3's
//                                     stage3_prefetch_bucket_size, stage3_param_persistence_threshold,
//                                     stage3_max_live_parameters → Zero3Config; offload_optimizer
//                                     {device: cpu} → --optimizer-cpu-offload; nvme, offload_param refused)
//   fp16.enabled, loss_scale (0: dynamic), initial_scale_power, loss_scale_window,
//   hysteresis, min_loss_scale      → --fp16, --loss-scale, --initial-loss-scale 2^p, …
//   bf16.enabled                    → --bf16
//   optimizer.type Adam / AdamW / SGD / Muon → --optimizer adam / sgd / muon, with optimizer.params
//                                     lr → --lr, betas → --adam-beta1/2, eps → --adam-eps, weight_decay →
//                                     --weight-decay, momentum → --sgd-momentum / --muon-momentum (other types and
//                                     params refused; Adam with adam_w_mode false: L2 Adam, refused)
//   steps_per_print, wall_clock_breakdown and other display-only keys: accepted with a note
// A key mpitron cannot honour is an error listing every such key; a value that
// disagrees with a flag given on the command line is an error naming both.
#pragma once
#include <boost/program_options/variables_map.hpp>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace mpitron {

struct DeepSpeedConfig {
  std::string file;
  std::optional<int64_t> micro_batch, global_batch, grad_accum;
  std::optional<double> clip_grad;
  std::optional<int64_t> zero_stage;
  std::optional<bool> overlap_comm;
  std::optional<int64_t> reduce_bucket_size;
  // stage 3: prefetch (> 0: the next block is gathered ahead), blocks this small kept
  // whole, the most parameters gathered at once (at least one block)
  std::optional<int64_t> prefetch_bucket_size, persistence_threshold, max_live_parameters;
  std::optional<bool> offload_optimizer;  // offload_optimizer.device: cpu (true) or none
  std::optional<bool> fp16, bf16;
  std::optional<double> loss_scale;           // 0: dynamic
  std::optional<int64_t> initial_scale_power;  // initial dynamic scale 2^p
  std::optional<int64_t> loss_scale_window, hysteresis;
  std::optional<double> min_loss_scale;
  std::optional<std::string> optimizer;  // optimizer.type mapped: adam | sgd | muon
  std::optional<double> lr, beta1, beta2, eps, weight_decay, momentum;  // optimizer.params
  std::vector<std::string> notes;  // display-only keys: one start-up line each
};

// Reads and checks `path`. Throws mpitron::Error naming the file for unreadable
// JSON, a wrong type or range, or keys that mpitron cannot honour (all listed).
DeepSpeedConfig read_deepspeed_config(const std::string& path);

struct TrainArgs;
// Sets the options the JSON names. A flag given on the command line (in `vm`, not
// defaulted) that disagrees with the JSON is an error naming both. Display-only
// keys become start-up notes. gradient_accumulation_steps is checked later, once
// the data-parallel size is known (check_deepspeed_batch).
void apply_deepspeed_config(const DeepSpeedConfig& ds, const boost::program_options::variables_map& vm, TrainArgs& a);
// train_batch_size = micro × gradient_accumulation_steps × dp, as DeepSpeed requires.
void check_deepspeed_batch(const DeepSpeedConfig& ds, const TrainArgs& a);

}  // namespace mpitron
