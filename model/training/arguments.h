// model/training/arguments.h — pretrain_gpt's and pretrain_bert's flags, with Megatron-LM's names.
//
// Every flag listed in `pretrain_gpt --help` works; flags Megatron has that
// mpitron does not (yet) are unknown options and rejected by the parser with
// the flag's name. Impossible combinations are rejected naming the flags.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "model/config.h"
#include "model/layers/moe_shape.h"
#include "model/training/optimizer.h"
#include "parallel/zero.h"
#include "model/training/lr_schedule.h"

namespace mpitron {

struct TrainArgs {
  GPTConfig model;
  OptimizerConfig optim;
  LossScalerConfig scaler;
  // batch
  int64_t micro_batch_size = 1;            // --micro-batch-size
  int64_t global_batch_size = 0;           // --global-batch-size (default: micro × dp)
  std::vector<int64_t> rampup_batch_size;  // --rampup-batch-size START INCR SAMPLES
  // length of the run (exactly one of the two)
  int64_t train_iters = 0;                 // --train-iters
  int64_t train_samples = 0;               // --train-samples
  // learning rate
  double lr = 1e-4;                        // --lr
  double min_lr = 0.0;                     // --min-lr
  std::string lr_decay_style = "linear";   // --lr-decay-style
  int64_t lr_decay_iters = 0;              // --lr-decay-iters (default: train iters)
  int64_t lr_decay_samples = 0;            // --lr-decay-samples (default: train samples)
  double lr_warmup_fraction = -1;          // --lr-warmup-fraction
  int64_t lr_warmup_iters = 0;             // --lr-warmup-iters
  int64_t lr_warmup_samples = 0;           // --lr-warmup-samples
  double lr_warmup_init = 0.0;             // --lr-warmup-init: the learning rate the warmup starts from
  std::string lr_wsd_decay_style = "exponential";  // --lr-wsd-decay-style (WSD's annealing)
  int64_t lr_wsd_decay_iters = 0;          // --lr-wsd-decay-iters: WSD's annealing length (iteration runs)
  int64_t lr_wsd_decay_samples = 0;        // --lr-wsd-decay-samples: the same in samples (--train-samples runs)
  // weight decay schedule (--weight-decay is optim.weight_decay): start → end over the run
  double start_weight_decay = -1;          // --start-weight-decay (with a linear or cosine incr style)
  double end_weight_decay = -1;            // --end-weight-decay
  std::string weight_decay_incr_style = "constant";  // --weight-decay-incr-style constant | linear | cosine
  // the schedule a --load checkpoint recorded (Megatron's rule): by default it must equal the flags'
  bool override_opt_param_scheduler = false;        // --override-opt_param-scheduler: the flags win
  bool use_checkpoint_opt_param_scheduler = false;  // --use-checkpoint-opt_param-scheduler: the checkpoint's wins
  // precision and memory
  bool fp16 = false, bf16 = false;         // --fp16 / --bf16
  bool recompute_activations = false;      // --recompute-activations (= --recompute-granularity full,
                                           //   --checkpoint-activations): recompute blocks in backward
  int64_t recompute_num_layers = 0;        // --recompute-method block --recompute-num-layers N: only the
                                           //   first N blocks of each model chunk (0: every block)
  // non-finite values and loss spikes (docs/training.md "NaN, Inf and spikes")
  bool check_for_nan = true;               // --check-for-nan-in-loss-and-grad (default) / --no-…
  double spike_zscore = 0;                 // --skip-spike-zscore Z: skip steps whose loss or grad norm is
                                           //   more than Z standard deviations above the window's mean (0: off)
  int64_t spike_window = 100;              // --spike-window N: moving window of accepted steps
  int64_t spike_max_skips = 10;            // --spike-max-consecutive-skips N: error after N spike skips in a row
  bool spike_rerun = false;                // --spike-rerun: on a spike, reload the newest checkpoint of --save
  std::string rerun_mode = "disabled";     // --rerun-mode disabled|validate_results|report_stats (model/training/rerun.h)
                                           //   and go on with the data after the spike's batch
  // data
  std::vector<std::string> data_path;      // --data-path [W1] P1 [W2 P2 ...]
  std::vector<std::string> train_data_path, valid_data_path, test_data_path;  // --{train,valid,test}-data-path:
                                           //   one dataset per split instead of --data-path + --split
  bool mock_data = false;                  // --mock-data: synthetic tokens, no files
  std::string data_cache_path;             // --data-cache-path: where index caches go (default: beside the data)
  std::string split = "969, 30, 1";        // --split
  std::string vocab_file, merge_file;      // --vocab-file / --merge-file (default: bundled GPT-2)
  std::string tokenizer_type = "GPT2BPETokenizer";
  std::string tokenizer_model;             // --tokenizer-model (HF tokenizer.json / SentencePiece .model)
  int64_t make_vocab_size_divisible_by = 128;
  uint64_t seed = 1234;                    // --seed
  std::string tokenizer_identity;          // JSON (data::tokenizer_identity), set by pretrain_main; "" = unknown
  bool allow_tokenizer_change = false;     // --allow-tokenizer-change: --load a checkpoint of another tokenizer
  // pretrain_bert only (the caller sets model.bert before parsing; docs/model-families.md "BERT")
  double mask_prob = 0.15;                 // --mask-prob: fraction of tokens masked for the MLM loss
  double short_seq_prob = 0.1;             // --short-seq-prob: chance a sample targets a shorter length
  // pretrain_t5 only (the caller sets model.t5 before parsing; docs/model-families.md "T5"; --mask-prob and
  // --short-seq-prob too)
  int64_t vocab_extra_ids = 0;             // --vocab-extra-ids: the sentinel tokens <extra_id_j> (Megatron: 100)
  // logging, evaluation, exit
  int64_t log_interval = 100;              // --log-interval
  int64_t eval_interval = 1000;            // --eval-interval
  int64_t eval_iters = 100;                // --eval-iters
  int64_t exit_interval = 0;               // --exit-interval: stop after an iteration divisible by it
  int64_t epoch_iters = 0;                 // finetune: iterations per epoch; after each, an evaluation
                                           //   (and with --save a checkpoint); 0: no epochs
  bool log_params_norm = false;            // --log-params-norm: L2 norm of the weights on the log line
  bool log_num_zeros_in_grad = false;      // --log-num-zeros-in-grad: zero gradient elements on the log line
  bool log_straggler = false;              // --log-straggler: slow ranks at each log line (model/training/straggler.h)
  int64_t straggler_minmax_count = 1;      // --straggler-minmax-count: how many slowest / fastest ranks it names
  std::string ft_timeouts;                 // --ft-timeouts setup=S,step=S|auto,...: a deadline per phase
                                           //   (parallel/phase_watch.h; empty: none)
  bool log_timers_to_tensorboard = false;  // --log-timers-to-tensorboard: forward-backward and optimizer ms
  std::string tensorboard_dir;             // --tensorboard-dir
  std::string metrics_file;                // --metrics-file (JSONL; default <tensorboard-dir>/metrics.jsonl)
  // checkpoints
  std::string save, load;                  // --save / --load
  int64_t save_interval = 0;               // --save-interval
  bool no_load_optim = false, no_load_rng = false, finetune = false;
  std::string ckpt_format;                 // --ckpt-format torch|torch_dist: the Megatron format --load must be
  int64_t keep_last = 0;                   // --keep-last N: keep only the newest N checkpoints (0: all)
  bool overwrite_save = false;             // --overwrite-save: --save may hold another run's checkpoints
  bool async_save = false;                 // --async-save: write checkpoints in a background thread (model/training/async_save.h)
  bool exit_signal_handler = false;        // --exit-signal-handler: SIGTERM/SIGUSR1 → save and exit 0
  double exit_duration_in_mins = 0;        // --exit-duration-in-mins: save and exit after this long
  // placement
  std::string device = "auto";             // --device: auto | cpu | cuda
  int64_t memory_cap_mb = 0;               // --memory-cap MB: the memory a rank may use (0: the device's)
  // parallel layout: world = tp · cp · dp · pp (rank order tp fastest, then cp, then dp, then pp)
  int64_t tensor_model_parallel_size = 1;   // --tensor-model-parallel-size
  int64_t pipeline_model_parallel_size = 1; // --pipeline-model-parallel-size
  int64_t context_parallel_size = 1;        // --context-parallel-size: each sequence split over cp ranks
                                            //   (chunks r and 2·cp − 1 − r; parallel/context_parallel.h)
  std::string cp_comm_type = "p2p";         // --cp-comm-type p2p | all_gather | a2a: attention across the cp group
  bool sequence_parallel = false;           // --sequence-parallel (needs tp > 1)
  int64_t num_layers_per_virtual_pipeline_stage = 0;  // --num-layers-per-virtual-pipeline-stage (0: none)
  std::string pipeline_schedule;            // --pipeline-schedule gpipe|1f1b|interleaved|zb-h1|zbv|FILE ("" = 1f1b/interleaved)
  std::string profile_pipeline;             // --profile-pipeline FILE: measured F/B/W/p2p costs for schedule_sim
  int64_t virtual_pipeline_stages() const {
    return num_layers_per_virtual_pipeline_stage > 0
               ? model.num_layers / (pipeline_model_parallel_size * num_layers_per_virtual_pipeline_stage)
               : 1;
  }

  int64_t expert_model_parallel_size = 1;  // --expert-model-parallel-size: the experts split over dp ranks
  std::string moe_token_dispatcher_type = "allgather";  // --moe-token-dispatcher-type allgather | alltoall
  MoeRun moe;                              // --moe-aux-loss-coeff, --moe-z-loss-coeff, capacity, drop policy
                                           //   (model/training/moe_flags.h; the experts' shape is in model)

  // data parallelism (dp = MPI ranks / (tp · pp))
  int64_t zero_stage = 0;                  // --zero-stage 1|2|3 (--use-distributed-optimizer = 1)
  Zero3Config zero3;                       // ZeRO-3's prefetch and persistence (DeepSpeed's stage3_* keys)
  int64_t ddp_bucket_size = 40000000;      // --ddp-bucket-size: elements per gradient bucket
  bool overlap_grad_reduce = true;         // --no-overlap-grad-reduce turns it off
  bool overlap_param_gather = false;       // --overlap-param-gather: ZeRO's all-gather overlaps the next forward
  bool force_mpi_for_device = false;       // --force-mpi-for-device: MPI (host-staged) for GPU tensors

  std::string flags_json;                  // every flag as given, for checkpoints
  bool deepspeed = false;                  // --deepspeed: a Megatron-DeepSpeed script (its TensorBoard tags)
  std::vector<std::string> startup_notes;  // one line each, logged at start-up: flags accepted for
                                           //   compatibility and what mpitron does instead
  int64_t world_size = 0;                  // set by the caller before parsing (MPI world size);
                                           //   parsing sets data_parallel_size = world / (tp · cp · pp)
  int64_t data_parallel_size = 1;          // dp; set directly when world_size is 0
  bool uses_samples() const { return train_samples > 0; }
};

// Parse argv (and --config FILE, `flag = value` lines). Throws mpitron::Error on
// bad flags. Returns false when --help was printed. With out.model.bert set
// before the call these are pretrain_bert's flags: the BERT group (--bert-no-binary-head,
// --bert-post-ln, --mask-prob, --short-seq-prob) is added and a BERT configured.
bool parse_train_args(int argc, char** argv, TrainArgs& out);

// The learning-rate and weight-decay schedule of the flags, in samples (Megatron's unit: an
// iteration run's iterations × --global-batch-size), as megatron/training/training.py's
// get_optimizer_param_scheduler builds it.
LRScheduleConfig lr_schedule_config(const TrainArgs& a);

// --ckpt-format torch on --save: the Megatron layout written beside each save (this run's TP × PP).
struct MegatronSaveOptions;
MegatronSaveOptions megatron_save_options(const TrainArgs& a);

}  // namespace mpitron
