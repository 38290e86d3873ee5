// model/checkpoint/checkpointing.h — what a GPT training checkpoint holds, on top of io/checkpoint.h:
// writing and reading it under any parallel layout. Below both training (which saves and
// resumes) and inference (which reads the weights), so neither includes the other.
//
// Datasets (global shapes; see docs/checkpoint-format.md):
//   model/<param>              f32 master weights, e.g. model/layers.0.attn.qkv.weight (3C, C)
//   optim/exp_avg/<param>      f32 Adam first moment
//   optim/exp_avg_sq/<param>   f32 Adam second moment
// Root attributes: iteration, consumed_train_samples, consumed_valid_samples,
// optimizer_steps, skipped_iterations, flags (JSON), tokenizer (the type),
// tokenizer_identity (JSON, data::tokenizer_identity), vocab_size,
// padded_vocab_size, model_config (JSON), lr_schedule (JSON), loss_scaler (JSON),
// rng (JSON: the seed; every random stream is a pure function of it and of
// the iteration, so this is the whole RNG state of every rank).
#pragma once
#include <mpi.h>

#include <cstdint>
#include <string>
#include <vector>

#include "model/gpt.h"
#include "model/checkpoint/loss_scaler.h"

namespace mpitron {

struct TrainState {
  int64_t iteration = 0;
  int64_t consumed_train_samples = 0;
  int64_t consumed_valid_samples = 0;
  int64_t skipped_iterations = 0;
  int64_t skipped_samples = 0;  // samples of the skipped steps: the LR schedule does not count them (Megatron)
  uint64_t seed = 1234;
  // The tokenizer the run trains with (JSON, data::tokenizer_identity; "" = unknown).
  std::string tokenizer;
  // The run's lineage: an id made at a fresh start and kept by every resume.
  // Saved in each checkpoint's manifest; --keep-last deletes only checkpoints
  // of owned_runs (this id, and the lineage it resumed from).
  std::string run_id;
  std::vector<std::string> owned_runs;
};

// The optimizer state this rank holds: elements [begin, begin + numel) of its
// flat parameter buffer (ParamSet order), f32 — the whole buffer, or the ZeRO
// shard. Any device.
struct OptimState {
  Tensor master, exp_avg, exp_avg_sq;  // exp_avg / exp_avg_sq: the optimizer's states in order
                                       //   (parallel/update_rule.h; sgd: exp_avg its momentum buffer)
  int64_t begin = 0;
  int64_t steps = 0;
  std::string optimizer = "adam";      // --optimizer: which states, and their dataset names
};

struct SaveInfo {
  std::string dir;
  double seconds = 0;
  double bytes = 0;
  std::string lr_schedule;  // a load: the checkpoint's lr_schedule attribute (JSON; "" if none)
};

// Collective over comm (every rank of the run; MPI_COMM_NULL: one process).
// Every tensor is stored once in its GLOBAL shape (GPT::global_layout), whatever
// the layout that saves it: each rank writes the hyperslabs of the canonical
// parameters it holds (ParamInfo::canonical: TP slices, its pipeline stage's
// layers) intersected with its optimizer slice (ZeRO shards). `writer` false:
// this rank's state is a data-parallel replica of another rank's (no ZeRO,
// dp rank > 0), it writes nothing.
// (layer, dataset) of every MoE layer's expert bias (MTP layers included): buffers/layers.<l>.mlp.router.expert_bias.
std::vector<std::pair<int64_t, std::string>> expert_bias_datasets(const GPTConfig& c);

SaveInfo save_checkpoint(const std::string& save_dir, const GPT& model, const OptimState& opt,
                         const LossScaler& scaler, const TrainState& st, const std::string& flags_json,
                         const std::string& lr_schedule_json, int keep_last = 0, MPI_Comm comm = MPI_COMM_NULL,
                         bool writer = true);

struct LoadOptions {
  bool load_optim = true;   // false: --no-load-optim / --finetune
  bool load_rng = true;     // false: --no-load-rng
  bool finetune = false;    // weights only; iteration and samples start at 0
  // This run's --optimizer: a checkpoint of another one's state is refused when the
  // optimizer state is loaded (load_optim), naming both.
  std::string optimizer = "adam";
  // The tokenizer of this run (data::tokenizer_identity JSON; "" = do not check).
  // A checkpoint trained with another one is refused (the embedding rows would
  // mean other tokens) unless allow_tokenizer_change; a checkpoint without an
  // identity is checked by its vocab_size only.
  std::string tokenizer;
  bool allow_tokenizer_change = false;
  // A Megatron-LM checkpoint (model/checkpoint/megatron_checkpoint.h): the format Megatron's
  // --ckpt-format names ("" = detect), and this run's LR schedule (Trainer's lr_json; "" = not
  // checked) with its global batch, which the checkpoint's opt_param_scheduler must agree with.
  std::string ckpt_format;
  std::string lr_schedule;
  int64_t global_batch_size = 0;
};

// The error (or, with allow, the warning) for a checkpoint whose tokenizer is
// not this run's. `saved_identity` "" means a checkpoint without one: only
// the vocabulary sizes are compared. Throws naming `where` and both tokenizers.
void check_checkpoint_tokenizer(const std::string& where, const std::string& saved_identity, int64_t saved_vocab,
                                const std::string& identity, int64_t vocab, bool allow);

// Loads the newest intact checkpoint of load_dir into model/opt/scaler/st,
// under any layout: every rank reads the hyperslabs of its own parameters
// (values: all of them, from the f32 master weights) and of its optimizer
// slice [begin, end) of the flat buffer into opt (host f32; exp_avg/exp_avg_sq
// undefined when the optimizer state is not loaded). Returns false (and
// changes nothing) when load_dir holds no checkpoint. Collective over comm.
bool load_checkpoint(const std::string& load_dir, GPT& model, OptimState& opt, int64_t begin, int64_t end,
                     LossScaler& scaler, TrainState& st, const LoadOptions& o, SaveInfo* info = nullptr,
                     MPI_Comm comm = MPI_COMM_NULL);

// The weights of load_dir's newest checkpoint and nothing of the optimizer or the RNG (o's
// load_optim and load_rng are turned off): inference, conversion, export. st (optional) gets the
// run's counters. Returns false when load_dir holds no checkpoint. Collective over comm.
bool load_weights(const std::string& load_dir, GPT& model, LoadOptions o = {}, TrainState* st = nullptr,
                  SaveInfo* info = nullptr, MPI_Comm comm = MPI_COMM_NULL);

}  // namespace mpitron
