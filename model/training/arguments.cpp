#include "model/training/arguments.h"
#include "model/flags/flag_given.h"

#include <boost/program_options.hpp>
#include <algorithm>
#include <cmath>
#include <fstream>
#include <limits>
#include <iostream>
#include <optional>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "model/families.h"
#include "model/flags/model_flags.h"
#include "model/training/deepspeed_config.h"
#include "model/checkpoint/checkpoint_config.h"
#include "model/checkpoint/megatron_save.h"
#include "model/flags/megatron_compat.h"
#include "model/training/moe_flags.h"
#include "model/training/muon_flags.h"
#include "model/training/pretrain_flags.h"
#include "model/training/rerun.h"
#include "parallel/phase_watch.h"
#include "data/gpt_dataset.h"
#include "parallel/context_parallel.h"
#include "parallel/schedule.h"
#include "parallel/update_rule.h"

namespace po = boost::program_options;

namespace mpitron {

namespace {

// The model-flag groups a tool's model takes: every model's, plus BERT's or T5's own.
std::set<FlagScope> model_scopes(const GPTConfig& m) {
  if (m.bert) return {FlagScope::Model, FlagScope::Bert};
  if (m.t5) return {FlagScope::Model, FlagScope::T5};
  return {FlagScope::Model};
}

// pretrain's "Training" flags: batch sizes, run length, AdamW, recompute, NaN and spike checks.
void add_train_flags(po::options_description& train, TrainArgs& a, std::vector<std::string>& rampup) {
  train.add_options()
      ("micro-batch-size", po::value(&a.micro_batch_size)->default_value(1), "samples per forward/backward")
      ("global-batch-size", po::value(&a.global_batch_size), "samples per optimizer step (default micro × dp)")
      ("rampup-batch-size", po::value(&rampup)->multitoken(), "START INCREMENT SAMPLES")
      ("train-iters", po::value(&a.train_iters), "optimizer steps to run (or --train-samples)")
      ("train-samples", po::value(&a.train_samples), "samples to train on (or --train-iters)")
      ("clip-grad", po::value(&a.optim.clip_grad)->default_value(1.0f), "max global gradient norm (0: off)")
      ("weight-decay", po::value(&a.optim.weight_decay)->default_value(0.01f),
       "weight decay (decoupled, as AdamW; not on biases and norms)")
      ("start-weight-decay", po::value(&a.start_weight_decay),
       "weight decay at the start of the run (with --weight-decay-incr-style linear|cosine)")
      ("end-weight-decay", po::value(&a.end_weight_decay), "weight decay at the end of the run")
      ("weight-decay-incr-style", po::value(&a.weight_decay_incr_style)->default_value("constant"),
       "constant (--weight-decay) | linear | cosine: from --start- to --end-weight-decay over the run")
      ("optimizer", po::value(&a.optim.optimizer)->default_value("adam"),
       "adam (AdamW: decoupled weight decay) | sgd (momentum --sgd-momentum, L2 weight decay) | muon | dist_muon "
       "(Newton-Schulz-orthogonalised momentum on weight matrices, AdamW on the rest; dist_muon shards its states)")
      ("sgd-momentum", po::value(&a.optim.sgd_momentum)->default_value(0.9f), "SGD's momentum (0: none)")
      ("adam-beta1", po::value(&a.optim.beta1)->default_value(0.9f), "AdamW beta1")
      ("adam-beta2", po::value(&a.optim.beta2)->default_value(0.999f), "AdamW beta2")
      ("adam-eps", po::value(&a.optim.eps)->default_value(1e-8f), "AdamW epsilon")
      ("recompute-activations", po::bool_switch(&a.recompute_activations), "recompute each block in backward")
      ("checkpoint-activations", po::bool_switch(), "= --recompute-activations (Megatron-DeepSpeed's name)")
      ("recompute-granularity", po::value<std::string>(),
       "full: recompute blocks in backward; selective: the attention core only (what fused attention always does)")
      ("recompute-method", po::value<std::string>(),
       "with full: uniform (every block) or block (the first --recompute-num-layers blocks of each chunk)")
      ("recompute-num-layers", po::value<int64_t>(), "uniform: 1 (per-block recompute); block: blocks per chunk")
      ("check-for-nan-in-loss-and-grad", po::bool_switch(),
       "stop with an error on a non-finite loss or gradient norm (the default; fp16 skips the step instead)")
      ("no-check-for-nan-in-loss-and-grad", po::bool_switch(), "do not check the loss and gradient norm for NaN/Inf")
      ("skip-spike-zscore", po::value(&a.spike_zscore),
       "skip a step whose loss or grad norm is more than Z standard deviations above the --spike-window mean")
      ("spike-window", po::value(&a.spike_window)->default_value(100), "accepted steps in the spike statistics")
      ("spike-max-consecutive-skips", po::value(&a.spike_max_skips)->default_value(10),
       "error after this many spike skips in a row")
      ("spike-rerun", po::bool_switch(&a.spike_rerun),
       "on a spike, reload the newest checkpoint of --save and go on with the data after the spike")
      ("rerun-mode", po::value(&a.rerun_mode)->default_value("disabled"),
       "disabled | validate_results (re-run a NaN or spiking step on the same data: not reproduced is a hardware "
       "fault, exit code 16) | report_stats (re-run and log, never stop)")
      ("seed", po::value(&a.seed)->default_value(1234), "random seed");
}

// pretrain's "Learning rate" flags: the learning-rate schedule.
void add_lr_flags(po::options_description& lr, TrainArgs& a) {
  lr.add_options()
      ("lr", po::value(&a.lr)->required(), "peak learning rate")
      ("min-lr", po::value(&a.min_lr)->default_value(0.0), "learning rate floor")
      ("lr-decay-style", po::value(&a.lr_decay_style)->default_value("linear"),
       "constant | linear | cosine | inverse-square-root | WSD")
      ("lr-wsd-decay-style", po::value(&a.lr_wsd_decay_style)->default_value("exponential"),
       "WSD's annealing: exponential | linear | cosine | minus_sqrt")
      ("lr-wsd-decay-iters", po::value(&a.lr_wsd_decay_iters),
       "WSD: iterations of annealing, ending at the decay's end (--lr-decay-iters)")
      ("lr-wsd-decay-samples", po::value(&a.lr_wsd_decay_samples), "WSD: the annealing in samples (--train-samples runs)")
      ("lr-warmup-init", po::value(&a.lr_warmup_init)->default_value(0.0), "learning rate the warmup starts from")
      ("override-opt_param-scheduler", po::bool_switch(&a.override_opt_param_scheduler),
       "on --load, take the schedule from the flags even where the checkpoint's differs")
      ("use-checkpoint-opt_param-scheduler", po::bool_switch(&a.use_checkpoint_opt_param_scheduler),
       "on --load, take the schedule (lr, min lr, warmup, decay, style, weight decays) from the checkpoint")
      ("lr-decay-iters", po::value(&a.lr_decay_iters), "decay length in iterations (default: train iters)")
      ("lr-decay-samples", po::value(&a.lr_decay_samples), "decay length in samples (default: train samples)")
      ("lr-warmup-fraction", po::value(&a.lr_warmup_fraction), "warmup as a fraction of the decay length")
      ("lr-warmup-iters", po::value(&a.lr_warmup_iters), "warmup iterations")
      ("lr-warmup-samples", po::value(&a.lr_warmup_samples), "warmup samples");
}

// pretrain's "Mixed precision" flags: fp16 / bf16 and fp16's loss scaler.
void add_prec_flags(po::options_description& prec, TrainArgs& a) {
  prec.add_options()
      ("fp16", po::bool_switch(&a.fp16), "fp16 compute with dynamic loss scaling")
      ("bf16", po::bool_switch(&a.bf16), "bf16 compute, fp32 master weights")
      ("loss-scale", po::value(&a.scaler.constant), "static loss scale (fp16)")
      ("initial-loss-scale", po::value(&a.scaler.initial_scale)->default_value(4294967296.0f, "2^32"), "dynamic scale start")
      ("min-loss-scale", po::value(&a.scaler.min_scale)->default_value(1.0f), "dynamic scale floor")
      ("loss-scale-window", po::value(&a.scaler.window)->default_value(1000), "clean steps before doubling")
      ("hysteresis", po::value(&a.scaler.hysteresis)->default_value(2), "overflows before halving");
}

// pretrain's "Data" flags: the samples and the tokenizer.
void add_data_flags(po::options_description& data, TrainArgs& a) {
  data.add_options()
      ("data-path", po::value(&a.data_path)->multitoken()->composing(), "PREFIX, or W1 PREFIX1 W2 PREFIX2 …")
      ("train-data-path", po::value(&a.train_data_path)->multitoken()->composing(),
       "training data only (PREFIX or W1 P1 W2 P2 …); with --valid-data-path/--test-data-path instead of --split")
      ("valid-data-path", po::value(&a.valid_data_path)->multitoken()->composing(), "validation data only")
      ("test-data-path", po::value(&a.test_data_path)->multitoken()->composing(), "test data only")
      ("mock-data", po::bool_switch(&a.mock_data), "train on synthetic tokens (no data files)")
      ("data-cache-path", po::value(&a.data_cache_path), "directory for the dataset index caches (default: beside the data)")
      ("split", po::value(&a.split)->default_value("969, 30, 1"), "train, valid, test weights")
      ("vocab-file", po::value(&a.vocab_file), "GPT-2 vocab json (default: bundled)")
      ("merge-file", po::value(&a.merge_file), "GPT-2 merges (default: bundled)")
      ("tokenizer-type", po::value(&a.tokenizer_type)->default_value("GPT2BPETokenizer"),
       "GPT2BPETokenizer, HuggingFaceTokenizer, SentencePieceTokenizer, Llama2Tokenizer, GPTSentencePieceTokenizer")
      ("tokenizer-model", po::value(&a.tokenizer_model), "tokenizer.json (HuggingFaceTokenizer) or tokenizer.model");
}

// pretrain's "Logging and evaluation" flags: log lines, TensorBoard, metrics, evaluation, the memory cap.
void add_log_flags(po::options_description& log, TrainArgs& a) {
  log.add_options()
      ("log-interval", po::value(&a.log_interval)->default_value(100), "iterations between log lines")
      ("eval-interval", po::value(&a.eval_interval)->default_value(1000), "iterations between evaluations")
      ("eval-iters", po::value(&a.eval_iters)->default_value(100), "batches per evaluation")
      ("exit-interval", po::value(&a.exit_interval), "exit after an iteration divisible by this")
      ("memory-cap", po::value(&a.memory_cap_mb), "MB per rank the run may use (below the device's memory: a shared "
       "GPU, a budget); a start-up estimate above it is refused")
      ("tensorboard-dir", po::value(&a.tensorboard_dir), "write TensorBoard events here")
      ("log-params-norm", po::bool_switch(&a.log_params_norm), "add the weights' L2 norm to the log line (params-norm)")
      ("log-num-zeros-in-grad", po::bool_switch(&a.log_num_zeros_in_grad),
       "add the number of zero gradient elements to the log line (num-zeros)")
      ("log-timers-to-tensorboard", po::bool_switch(&a.log_timers_to_tensorboard),
       "write forward-backward-time and optimizer-time (ms per iteration) to TensorBoard")
      ("metrics-file", po::value(&a.metrics_file), "JSONL metrics (default <tensorboard-dir>/metrics.jsonl)")
      ("log-straggler", po::bool_switch(&a.log_straggler),
       "at each log line, every rank's compute time per iteration and its score against the fastest rank; "
       "the slowest and fastest ranks with their hosts")
      ("straggler-minmax-count", po::value(&a.straggler_minmax_count)->default_value(1),
       "how many slowest and fastest ranks --log-straggler names")
      ("ft-timeouts", po::value(&a.ft_timeouts),
       "a heartbeat per phase: setup=S,step=S,checkpoint=S,evaluation=S seconds (or =auto: learned, the longest "
       "seen x 5 after a warm-up; or auto for all); a phase that overruns ends the job naming rank, host and phase");
}

// pretrain's "Checkpoints" flags: saving, loading, exiting.
void add_ckpt_flags(po::options_description& ckpt, TrainArgs& a) {
  ckpt.add_options()
      ("save", po::value(&a.save), "checkpoint directory to save to")
      ("load", po::value(&a.load), "checkpoint directory to resume from")
      ("save-interval", po::value(&a.save_interval), "iterations between checkpoints")
      ("use-checkpoint-args", po::bool_switch(), "take the model flags not given from the --load checkpoint")
      ("no-load-optim", po::bool_switch(&a.no_load_optim), "do not load optimizer state")
      ("no-load-rng", po::bool_switch(&a.no_load_rng), "do not load RNG state")
      ("finetune", po::bool_switch(&a.finetune), "load weights only; reset iteration and optimizer")
      ("keep-last", po::value(&a.keep_last)->default_value(0), "keep only the newest N checkpoints (0: all)")
      ("overwrite-save", po::bool_switch(&a.overwrite_save),
       "save into a --save directory that holds another run's checkpoints (--keep-last still deletes only this run's)")
      ("allow-tokenizer-change", po::bool_switch(&a.allow_tokenizer_change),
       "--load a checkpoint trained with another tokenizer (refused otherwise)")
      ("async-save", po::bool_switch(&a.async_save),
       "write checkpoints from a host copy in a background thread while training continues")
      ("exit-signal-handler", po::bool_switch(&a.exit_signal_handler),
       "on SIGTERM or SIGUSR1 finish the step, save (--save) and exit 0")
      ("exit-duration-in-mins", po::value(&a.exit_duration_in_mins), "save and exit after this many minutes");
}

// pretrain's "Other" flags: device, sharding, parallel layout, pipeline schedule, DeepSpeed, --config.
void add_misc_flags(po::options_description& misc, TrainArgs& a, std::string& config_file) {
  misc.add_options()
      ("device", po::value(&a.device)->default_value("auto"), "auto | cpu | cuda")
      ("use-distributed-optimizer", po::bool_switch(), "shard optimizer state over data-parallel ranks (ZeRO-1)")
      ("zero-stage", po::value(&a.zero_stage)->default_value(0),
       "0: replicated, 1: shard optimizer state, 2: also gradients, 3: also parameters (gathered block by block)")
      ("use-megatron-fsdp", po::bool_switch(), "Megatron-FSDP: shard over data-parallel ranks as "
       "--data-parallel-sharding-strategy says")
      ("data-parallel-sharding-strategy", po::value<std::string>(),
       "with --use-megatron-fsdp: no_shard | optim | optim_grads | optim_grads_params (= --zero-stage 0..3)")
      ("use-torch-fsdp2", po::bool_switch(), "refused: mpitron has no PyTorch FSDP2 (use --zero-stage 3)")
      ("optimizer-cpu-offload", po::bool_switch(), "master weights and Adam moments in host memory, the update on the CPU")
      ("optimizer-offload-fraction", po::value<double>(), "with --optimizer-cpu-offload: the share offloaded (1.0, the "
       "only one built)")
      ("ddp-bucket-size", po::value(&a.ddp_bucket_size)->default_value(40000000), "gradient bucket size (elements)")
      ("overlap-grad-reduce", po::bool_switch(), "reduce gradient buckets during backward (the default; Megatron's spelling)")
      ("no-overlap-grad-reduce", po::bool_switch(), "reduce gradients after backward instead of during it")
      ("overlap-param-gather", po::bool_switch(&a.overlap_param_gather),
       "distributed optimizer: all-gather the updated parameters bucket by bucket during the next forward")
      ("force-mpi-for-device", po::bool_switch(&a.force_mpi_for_device), "MPI (host-staged) instead of NCCL for GPU tensors")
      ("tensor-model-parallel-size", po::value(&a.tensor_model_parallel_size)->default_value(1), "TP size")
      ("pipeline-model-parallel-size", po::value(&a.pipeline_model_parallel_size)->default_value(1), "PP size")
      ("context-parallel-size", po::value(&a.context_parallel_size)->default_value(1),
       "CP size: each sequence is cut into 2 x CP chunks, rank r of the cp group holding chunks r and 2CP-1-r; "
       "attention runs across the group")
      ("cp-comm-type", po::value(&a.cp_comm_type)->default_value("p2p"),
       "attention across the cp group: p2p (ring, K/V on non-blocking send/recv), all_gather (K/V gathered first) "
       "or a2a (DeepSpeed Ulysses all-to-all; heads and query groups per TP rank divisible by CP)")
      ("sequence-parallel", po::bool_switch(&a.sequence_parallel), "split layernorm/dropout regions along the sequence over TP ranks")
      ("num-layers-per-virtual-pipeline-stage", po::value(&a.num_layers_per_virtual_pipeline_stage),
       "layers per virtual stage: interleaved 1F1B with num-layers / (PP x this) model chunks per rank")
      ("pipeline-schedule", po::value(&a.pipeline_schedule),
       "gpipe | 1f1b | interleaved | zb-h1 | zbv | FILE (docs/pipeline-schedules.md); default 1f1b, interleaved "
       "with virtual stages")
      ("profile-pipeline", po::value(&a.profile_pipeline),
       "write the measured per-stage F/B/W and p2p times (ms) of the run to FILE, for schedule_sim --costs")
      ("deepspeed", po::bool_switch(), "read --deepspeed_config (Megatron-DeepSpeed scripts)")
      ("deepspeed_config", po::value<std::string>(), "DeepSpeed JSON: batch sizes, clipping, ZeRO stage, fp16/bf16")
      ("config", po::value(&config_file), "file of `flag = value` lines (command line wins)")
      ("help,h", "print this help");
}

po::options_description describe_flags(TrainArgs& a, std::string& config_file, std::vector<std::string>& rampup) {
  po::options_description model("Model"), train("Training"), lr("Learning rate"), prec("Mixed precision"),
      data("Data"), log("Logging and evaluation"), ckpt("Checkpoints"), misc("Other");
  GPTConfig& m = a.model;
  model.add_options()
      ("init-method-std", po::value(&m.init_method_std)->default_value(0.02f), "weight init std")
      ("hidden-dropout", po::value(&m.hidden_dropout)->default_value(0.1f), "dropout after embeddings and blocks")
      ("attention-dropout", po::value(&m.attention_dropout)->default_value(0.1f), "dropout on the attention probabilities")
      ("make-vocab-size-divisible-by", po::value(&a.make_vocab_size_divisible_by)->default_value(128), "vocab padding");
  add_train_flags(train, a, rampup);
  add_lr_flags(lr, a);
  add_prec_flags(prec, a);
  add_data_flags(data, a);
  add_log_flags(log, a);
  add_ckpt_flags(ckpt, a);
  add_misc_flags(misc, a, config_file);
  po::options_description all(a.model.bert ? "pretrain_bert: pretrain a BERT (masked LM + sentence order) on Megatron "
                                              "sentence data (preprocess_data --split-sentences)"
                              : a.model.t5 ? "pretrain_t5: pretrain a T5 encoder-decoder (span corruption) on Megatron "
                                             "sentence data (preprocess_data --split-sentences)"
                                           : "pretrain_gpt: train a GPT on Megatron .bin/.idx data");
  add_model_flags(model, model_scopes(a.model), "Model and architecture (docs/model-families.md)");
  all.add(model).add(train).add(lr).add(prec).add(data).add(log).add(ckpt).add(misc);
  if (a.model.bert || a.model.t5) {
    po::options_description masked(a.model.bert ? "BERT (pretrain_bert)" : "T5 (pretrain_t5)");
    masked.add_options()
        ("mask-prob", po::value(&a.mask_prob)->default_value(0.15, "0.15"), "fraction of tokens masked")
        ("short-seq-prob", po::value(&a.short_seq_prob)->default_value(0.1, "0.1"), "chance of a shorter sample");
    if (a.model.t5)
      masked.add_options()
          ("encoder-seq-length", po::value<int64_t>(), "the encoder's tokens per sample (Megatron's name; = --seq-length)")
          ("vocab-extra-ids", po::value(&a.vocab_extra_ids)->default_value(0),
           "sentinel tokens <extra_id_j> appended to the WordPiece vocabulary (span corruption needs them; "
           "Megatron's pretrain_t5 uses 100)");
    all.add(masked);
  }
  if (!a.model.bert && !a.model.t5) add_moe_flags(all, a);
  add_muon_flags(all, a);
  add_noop_flags(all);
  return all;
}

void need(bool ok, const std::string& what, const std::string& hint = "") {
  if (!ok) MPT_THROW(what, hint);
}

// --context-parallel-size / --cp-comm-type: what context parallelism needs and what it
// does not (yet) combine with, refused naming the flags (parallel/context_parallel.h).
void check_context_parallel_flags(const po::variables_map& vm, TrainArgs& a) {
  const int64_t cp = a.context_parallel_size, tp = a.tensor_model_parallel_size;
  const GPTConfig& m = a.model;
  if (a.cp_comm_type == "allgather") a.cp_comm_type = "all_gather";  // Megatron's spelling
  need(a.cp_comm_type != "a2a+p2p",
       "--cp-comm-type a2a+p2p (Megatron's hierarchical CP) is not supported", "use p2p, all_gather or a2a");
  const CpCommType type = parse_cp_comm_type(a.cp_comm_type);
  if (cp == 1) {
    if (flag_given(vm, "cp-comm-type"))
      a.startup_notes.push_back(str("--cp-comm-type ", a.cp_comm_type, ": no effect without --context-parallel-size > 1"));
    return;
  }
  need(!m.bert, "--context-parallel-size > 1 is not supported for BERT: its padding mask and bidirectional attention "
                "do not split into causal chunks",
       "drop --context-parallel-size");
  need(m.seq_length % (2 * cp) == 0,
       str("--seq-length ", m.seq_length, " is not divisible by 2 x --context-parallel-size = ", 2 * cp,
           " (each sequence is cut into 2 x CP equal chunks)"),
       str("choose --seq-length a multiple of ", 2 * cp));
  need(m.hidden_size % 4 == 0,
       str("--context-parallel-size needs --hidden-size divisible by 4 (each rank's dropout masks start at a Philox "
           "block), got ", m.hidden_size));
  if (type == CpCommType::AllToAll && tp > 0) {
    const int64_t heads = m.num_attention_heads / tp, groups = m.query_groups() / tp;
    need(heads % cp == 0 && groups % cp == 0,
         str("--cp-comm-type a2a splits each tensor-parallel rank's ", heads, " attention heads and ", groups,
             " query groups (--num-attention-heads, --num-query-groups / --tensor-model-parallel-size) over "
             "--context-parallel-size ", cp, ": not divisible"),
         "use --cp-comm-type p2p or all_gather, or a context-parallel size that divides them");
  }
}

// pretrain_bert: what a BERT cannot be (its choices are set in parse_train_args).
void check_bert_flags(const TrainArgs& a) {
  const GPTConfig& m = a.model;
  need(a.tokenizer_type == "BertWordPieceLowerCase" || a.tokenizer_type == "BertWordPieceCase",
       str("pretrain_bert: --tokenizer-type ", a.tokenizer_type, " is not a BERT tokenizer"),
       "use --tokenizer-type BertWordPieceLowerCase or BertWordPieceCase with --vocab-file vocab.txt");
  need(!a.vocab_file.empty(), "pretrain_bert needs --vocab-file (a BERT vocab.txt)",
       "the vocabulary the data was preprocessed with");
  const std::string misses = family_misses(find_family("bert"), m);
  need(misses.empty(),
       str("pretrain_bert trains BERT's architecture (LayerNorm, GELU, learned positions, tied MLM decoder, biases, "
           "multi-head attention), which needs ", misses, ": the flags that change them are GPT-family flags"),
       "drop them");
  need(!(a.sequence_parallel && a.tensor_model_parallel_size > 1 && m.binary_head),
       "--sequence-parallel with BERT's binary head is not supported (the pooler reads the [CLS] row of every "
       "sequence, which sequence parallelism splits over ranks)",
       "drop --sequence-parallel, or add --bert-no-binary-head");
  need(a.mask_prob > 0 && a.mask_prob < 1, str("--mask-prob must be in (0, 1), got ", a.mask_prob));
  need(a.short_seq_prob >= 0 && a.short_seq_prob <= 1, str("--short-seq-prob must be in [0, 1], got ", a.short_seq_prob));
  need(a.seed > 0 && a.seed < (uint64_t{1} << 31), str("pretrain_bert: --seed ", a.seed, " must be in [1, 2^31)"),
       "Megatron's BERT sample mapping takes a positive 32-bit seed");
}

// pretrain_t5: the tokenizer, the sentinels, and the parallelism T5 takes (model/t5.h).
void check_t5_flags(const TrainArgs& a) {
  need(a.tokenizer_type == "BertWordPieceLowerCase" || a.tokenizer_type == "BertWordPieceCase",
       str("pretrain_t5: --tokenizer-type ", a.tokenizer_type, " is not a WordPiece tokenizer"),
       "use --tokenizer-type BertWordPieceLowerCase or BertWordPieceCase with --vocab-file vocab.txt (Megatron's T5)");
  need(!a.vocab_file.empty(), "pretrain_t5 needs --vocab-file (a BERT vocab.txt)",
       "the vocabulary the data was preprocessed with");
  need(a.vocab_extra_ids >= 1, str("pretrain_t5: --vocab-extra-ids is ", a.vocab_extra_ids,
                                   ": span corruption replaces each masked span with a sentinel <extra_id_j>"),
       "pass --vocab-extra-ids 100 (Megatron's pretrain_t5 setting)");
  need(a.pipeline_model_parallel_size == 1,
       str("pretrain_t5: --pipeline-model-parallel-size ", a.pipeline_model_parallel_size,
           " is not supported: the encoder-decoder is not pipelined (Megatron-Core refuses pipeline parallelism for T5 "
           "too)"),
       "train T5 with --tensor-model-parallel-size, --sequence-parallel and data parallelism");
  need(a.context_parallel_size == 1, "pretrain_t5: --context-parallel-size > 1 is not supported",
       "train T5 with --tensor-model-parallel-size, --sequence-parallel and data parallelism");
  need(a.mask_prob > 0 && a.mask_prob < 1, str("--mask-prob must be in (0, 1), got ", a.mask_prob));
  need(a.short_seq_prob >= 0 && a.short_seq_prob <= 1, str("--short-seq-prob must be in [0, 1], got ", a.short_seq_prob));
  need(a.seed > 0 && a.seed < (uint64_t{1} << 31), str("pretrain_t5: --seed ", a.seed, " must be in [1, 2^31)"),
       "Megatron's T5 sample mapping takes a positive 32-bit seed");
}

// Megatron's T5 stacks: --encoder-num-layers and --decoder-num-layers, each defaulting to --num-layers;
// mpitron's num_layers is then their sum (layers 0 … Le−1 the encoder's).
void resolve_t5_layers(const po::variables_map& vm, GPTConfig& m) {
  const bool enc = vm.count("encoder-num-layers") > 0, dec = vm.count("decoder-num-layers") > 0;
  if (!enc && !dec && !vm.count("num-layers")) return;  // --use-checkpoint-args filled them
  need((enc && dec) || vm.count("num-layers") > 0,
       "pretrain_t5 needs --num-layers, or both --encoder-num-layers and --decoder-num-layers",
       "--num-layers N gives each stack N layers");
  const int64_t n = vm.count("num-layers") ? vm["num-layers"].as<int64_t>() : 0;
  // Both stacks given: --num-layers would size neither, and is refused rather than dropped (as Megatron).
  need(!(enc && dec && vm.count("num-layers")),
       str("pretrain_t5: --num-layers ", n, " is given with both --encoder-num-layers and --decoder-num-layers, "
           "which replace it"),
       "drop --num-layers (it gives each stack that many layers when a stack's own flag is left out)");
  const int64_t le = enc ? vm["encoder-num-layers"].as<int64_t>() : n, ld = dec ? vm["decoder-num-layers"].as<int64_t>() : n;
  need(le >= 1 && ld >= 1, str("pretrain_t5: the encoder (", le, ") and decoder (", ld, ") need >= 1 layer each"));
  {  // each stack's size within the architecture table's bound for it
    GPTConfig scratch;
    const ArchField& row = arch_field("encoder_num_layers");
    row.set(scratch, le, "--encoder-num-layers");
    row.set(scratch, ld, "--decoder-num-layers");
  }
  m.encoder_num_layers = le;
  m.num_layers = le + ld;
}

// Megatron's recompute flags onto mpitron's block recompute. Fused attention keeps
// no T×T scores (only its output and log-sum-exp) and recomputes them in its own
// backward: that is what Megatron's selective recompute buys, so "selective" is
// every run's behaviour and "full" recomputes whole blocks.
void apply_recompute_flags(const po::variables_map& vm, TrainArgs& a) {
  if (vm["checkpoint-activations"].as<bool>()) a.recompute_activations = true;
  std::string granularity = vm.count("recompute-granularity") ? vm["recompute-granularity"].as<std::string>() : "";
  need(granularity.empty() || granularity == "full" || granularity == "selective",
       str("--recompute-granularity ", granularity, " is not supported"), "use full or selective");
  if (granularity == "selective") {
    need(!a.recompute_activations,
         "--recompute-granularity selective was given with --recompute-activations/--checkpoint-activations (full)",
         "pick one granularity");
    a.startup_notes.push_back(
        "--recompute-granularity selective: fused attention stores no attention scores and recomputes them in its "
        "backward, which is what selective recompute does; every run works this way");
  }
  if (granularity == "full") a.recompute_activations = true;
  const std::string method = vm.count("recompute-method") ? vm["recompute-method"].as<std::string>() : "";
  const bool has_n = vm.count("recompute-num-layers") > 0;
  const int64_t n = has_n ? vm["recompute-num-layers"].as<int64_t>() : 1;
  if (!method.empty() || has_n) {
    need(a.recompute_activations, "--recompute-method and --recompute-num-layers apply to full recompute",
         "add --recompute-granularity full (or --recompute-activations)");
    need(method == "uniform" || method == "block",
         method.empty() ? "--recompute-num-layers needs --recompute-method uniform|block"
                        : str("--recompute-method ", method, " is not supported"),
         "use --recompute-method uniform or block");
    need(n >= 1, str("--recompute-num-layers must be >= 1, got ", n));
  }
  if (method == "uniform")
    need(n == 1,
         str("--recompute-method uniform --recompute-num-layers ", n,
             ": mpitron recomputes one block at a time, and groups of several blocks are not implemented"),
         "use --recompute-num-layers 1 (same as --recompute-activations), or --recompute-method block");
  if (method == "block") a.recompute_num_layers = n;
}

// One numeric flag's allowed range. Every float must also be finite (boost
// parses "nan" and "inf"). A flag with `only_if_given` is checked only when it
// was given (its default stands for "derived from other flags"), so an explicit
// 0 is rejected instead of silently meaning "not set".
struct FloatRange {
  const char* flag;
  double value, lo, hi;
  bool lo_open, hi_open;
  const char* hint;
};
struct IntRange {
  const char* flag;
  int64_t value, lo, hi;
  const char* hint;
};

std::string interval(double lo, double hi, bool lo_open, bool hi_open) {
  auto num = [](double v) { return std::isinf(v) ? std::string(v > 0 ? "inf" : "-inf") : str(v); };
  return str(lo_open ? "(" : "[", num(lo), ", ", num(hi), hi_open || std::isinf(hi) ? ")" : "]");
}

void check_ranges(const po::variables_map& vm, const std::vector<FloatRange>& floats, const std::vector<IntRange>& ints) {
  for (const FloatRange& r : floats) {
    if (!vm.count(r.flag)) continue;
    const bool in = std::isfinite(r.value) && (r.lo_open ? r.value > r.lo : r.value >= r.lo) &&
                    (r.hi_open ? r.value < r.hi : r.value <= r.hi);
    need(in, str("--", r.flag, " must be a finite number in ", interval(r.lo, r.hi, r.lo_open, r.hi_open), ", got ",
                 r.value), r.hint);
  }
  for (const IntRange& r : ints) {
    if (!vm.count(r.flag)) continue;
    need(r.value >= r.lo && r.value <= r.hi,
         str("--", r.flag, " must be in [", r.lo, ", ", r.hi, "], got ", r.value), r.hint);
  }
}

// A double flag's value (0 when absent: check_ranges skips absent flags).
double given_double(const po::variables_map& vm, const char* flag) { return vm.count(flag) ? vm[flag].as<double>() : 0.0; }

// a × b, or an error naming what overflowed.
int64_t checked_mul(int64_t a, int64_t b, const std::string& what) {
  int64_t out = 0;
  need(!__builtin_mul_overflow(a, b, &out), str(what, " (", a, " x ", b, ") overflows a 64-bit integer"),
       "use realistic sizes");
  return out;
}

// Parses argv against desc into vm (a repeated flag's last value wins; --config adds a
// file's `flag = value` lines). False: --help was printed.
bool read_command_line(int argc, char** argv, const po::options_description& desc, const char* tool,
                       po::variables_map& vm) {
  try {
    // argparse semantics: a repeated flag's last value wins.
    po::parsed_options parsed = po::command_line_parser(argc, argv).options(desc).run();
    strip_digit_underscores(parsed.options);
    keep_last_occurrence(parsed.options, desc);
    check_parsed_values(parsed, desc, tool);
    po::store(parsed, vm);
    if (vm.count("help")) {
      std::cout << desc << "\n";
      return false;
    }
    if (vm.count("config")) {
      const std::string file = vm["config"].as<std::string>();
      std::ifstream f(file);
      need(f.good(), str("--config: cannot open ", file), "check the path");
      const po::parsed_options from_file = po::parse_config_file(f, desc);
      check_parsed_values(from_file, desc, tool);
      po::store(from_file, vm);
    }
    po::notify(vm);
  } catch (const po::error& e) {
    const char* prog = tool;
    MPT_THROW(str(prog, ": ", e.what()), str("run ", prog, " --help for the flags mpitron supports"));
  }
  return true;
}

// Every flag's value (given or defaulted) as JSON: what a checkpoint records of the run.
std::string flags_to_json(const po::variables_map& vm) {
  nlohmann::json flags;
  for (const auto& [k, v] : vm) {
    const auto& val = v.value();
    if (auto p = boost::any_cast<int64_t>(&val)) flags[k] = *p;
    else if (auto p = boost::any_cast<float>(&val)) flags[k] = *p;
    else if (auto p = boost::any_cast<double>(&val)) flags[k] = *p;
    else if (auto p = boost::any_cast<uint64_t>(&val)) flags[k] = *p;
    else if (auto p = boost::any_cast<bool>(&val)) flags[k] = *p;
    else if (auto p = boost::any_cast<std::string>(&val)) flags[k] = *p;
    else if (auto p = boost::any_cast<std::vector<std::string>>(&val)) flags[k] = *p;
  }
  return flags.dump();
}

// --deepspeed --deepspeed_config FILE: the JSON's batch sizes, clipping, ZeRO stage and precision.
std::optional<DeepSpeedConfig> apply_deepspeed_flags(const po::variables_map& vm, TrainArgs& a) {
  std::optional<DeepSpeedConfig> ds;
  const bool deepspeed = a.deepspeed = vm["deepspeed"].as<bool>();
  if (deepspeed) {
    need(vm.count("deepspeed_config") > 0, "--deepspeed needs --deepspeed_config FILE",
         "give the DeepSpeed JSON your script uses (docs/megatron-compat.md lists the keys mpitron reads)");
    ds = read_deepspeed_config(vm["deepspeed_config"].as<std::string>());
    apply_deepspeed_config(*ds, vm, a);
  } else {
    need(!vm.count("deepspeed_config"), "--deepspeed_config given without --deepspeed",
         "add --deepspeed (as DeepSpeed itself requires) or drop --deepspeed_config");
  }
  return ds;
}

// Every numeric flag: finite, in range, and 0 only where 0 means 0.
void check_numeric_flags(const po::variables_map& vm, const TrainArgs& a) {
  const double inf = std::numeric_limits<double>::infinity();
  const int64_t big = int64_t{1} << 40, huge = std::numeric_limits<int64_t>::max();
  const GPTConfig& m = a.model;
  check_ranges(
      vm,
      {{"init-method-std", m.init_method_std, 0, inf, true, false, ""},
       {"hidden-dropout", m.hidden_dropout, 0, 1, false, true, ""},
       {"attention-dropout", m.attention_dropout, 0, 1, false, true, ""},
       {"clip-grad", a.optim.clip_grad, 0, inf, false, false, "0 turns clipping off"},
       {"weight-decay", a.optim.weight_decay, 0, inf, false, false, "0 turns weight decay off"},
       {"adam-beta1", a.optim.beta1, 0, 1, false, true, "the default is 0.9"},
       {"sgd-momentum", a.optim.sgd_momentum, 0, 1, false, true, "the default is 0.9 (Megatron's); 0 turns momentum off"},
       {"adam-beta2", a.optim.beta2, 0, 1, false, true, "the default is 0.999"},
       {"adam-eps", a.optim.eps, 0, inf, true, false, "the default is 1e-8"},
       {"lr", a.lr, 0, inf, false, false, ""},
       {"min-lr", a.min_lr, 0, a.lr, false, false, "--min-lr is a floor below --lr"},
       {"lr-warmup-fraction", a.lr_warmup_fraction, 0, 1, false, false, ""},
       {"lr-warmup-init", a.lr_warmup_init, 0, a.lr, false, false, "the warmup starts here and rises to --lr"},
       {"start-weight-decay", a.start_weight_decay, 0, inf, false, false, ""},
       {"end-weight-decay", a.end_weight_decay, 0, inf, false, false, ""},
       {"loss-scale", a.scaler.constant, 0, inf, true, false, "a static fp16 loss scale, e.g. 128"},
       {"initial-loss-scale", a.scaler.initial_scale, 0, inf, true, false, "a power of two, e.g. 65536"},
       {"min-loss-scale", a.scaler.min_scale, 0, a.scaler.initial_scale, true, false,
        "a power of two no larger than --initial-loss-scale"},
       {"exit-duration-in-mins", a.exit_duration_in_mins, 0, inf, true, false, ""},
       {"skip-spike-zscore", a.spike_zscore, 0, inf, true, false, "e.g. 6 (leave it out to turn spike skipping off)"},
       {"moe-aux-loss-coeff", a.moe.aux_loss_coeff, 0, inf, false, false, "Mixtral's is 0.02; 0 turns it off"},
       {"moe-z-loss-coeff", a.moe.z_loss_coeff, 0, inf, false, false, "ST-MoE's is 1e-3; 0 turns it off"},
       // A factor of experts / topk already lets an expert take every token (at most 65536 experts:
       // model/arch_fields.cpp's size limits); more only overflows the capacity.
       {"moe-expert-capacity-factor", given_double(vm, "moe-expert-capacity-factor"), 0, 65536, true,
        false, "e.g. 1.0 or 1.25; leave it out for dropless routing (Megatron's default)"},
       {"moe-router-bias-update-rate", given_double(vm, "moe-router-bias-update-rate"), 0, 1, true, false,
        "the expert bias moves by this per step against sigmoid scores in [0, 1]; Megatron's default is 1e-3"}},
      {{"make-vocab-size-divisible-by", a.make_vocab_size_divisible_by, 1, 1 << 20, "the default is 128"},
       {"micro-batch-size", a.micro_batch_size, 1, big, ""},
       {"global-batch-size", a.global_batch_size, 1, big, "leave it out for micro batch x data-parallel size"},
       {"train-iters", a.train_iters, 1, big, ""},
       {"train-samples", a.train_samples, 1, big, ""},
       {"lr-decay-iters", a.lr_decay_iters, 1, big, "leave it out to decay over --train-iters"},
       {"lr-decay-samples", a.lr_decay_samples, 1, big, "leave it out to decay over --train-samples"},
       {"lr-warmup-iters", a.lr_warmup_iters, 0, big, ""},
       {"lr-warmup-samples", a.lr_warmup_samples, 0, big, ""},
       {"lr-wsd-decay-iters", a.lr_wsd_decay_iters, 1, big, "WSD's annealing, at most --lr-decay-iters"},
       {"lr-wsd-decay-samples", a.lr_wsd_decay_samples, 1, big, "WSD's annealing, at most --lr-decay-samples"},
       {"loss-scale-window", a.scaler.window, 1, big, ""},
       {"hysteresis", a.scaler.hysteresis, 1, big, "overflows tolerated before the scale halves; the default is 2"},
       {"log-interval", a.log_interval, 1, huge, ""},
       {"eval-interval", a.eval_interval, 1, huge, ""},
       {"eval-iters", a.eval_iters, 0, big, "0 turns evaluation off"},
       {"exit-interval", a.exit_interval, 1, huge, ""},
       {"memory-cap", a.memory_cap_mb, 1, huge, "MB per rank; leave it out to use the device's memory"},
       {"save-interval", a.save_interval, 1, huge, "leave it out to save only at the end"},
       {"keep-last", a.keep_last, 0, huge, "0 keeps every checkpoint"},
       {"tensor-model-parallel-size", a.tensor_model_parallel_size, 1, 1 << 20, ""},
       {"pipeline-model-parallel-size", a.pipeline_model_parallel_size, 1, 1 << 20, ""},
       {"context-parallel-size", a.context_parallel_size, 1, 1 << 20, ""},
       {"num-layers-per-virtual-pipeline-stage", a.num_layers_per_virtual_pipeline_stage, 1, big, ""},
       {"zero-stage", a.zero_stage, 0, 3, ""},
       {"ddp-bucket-size", a.ddp_bucket_size, 0, huge, "0 means one bucket"},
       {"spike-window", a.spike_window, 2, big, ""},
       {"spike-max-consecutive-skips", a.spike_max_skips, 1, big, ""},
       {"straggler-minmax-count", a.straggler_minmax_count, 1, big, ""}});
}

// The step's checks: NaN/Inf in the loss and grad norm, and --spike-rerun's needs.
void apply_step_check_flags(const po::variables_map& vm, TrainArgs& a) {
  const bool on = vm["check-for-nan-in-loss-and-grad"].as<bool>();
  const bool off = vm["no-check-for-nan-in-loss-and-grad"].as<bool>();
  need(!(on && off), "--check-for-nan-in-loss-and-grad and --no-check-for-nan-in-loss-and-grad were both given",
       "pick one");
  a.check_for_nan = !off;
  need(!a.spike_rerun || vm.count("skip-spike-zscore"), "--spike-rerun needs --skip-spike-zscore",
       "give the z-score threshold that defines a spike");
  (void)parse_rerun_mode(a.rerun_mode);  // an unknown mode names the flag
  (void)parse_ft_timeouts(a.ft_timeouts);
  need(!a.spike_rerun || !a.save.empty(), "--spike-rerun reloads the newest checkpoint of --save, but --save is not given",
       "add --save DIR (and --save-interval)");
}

// How the model states are sharded and reduced: ZeRO stage (and Megatron-FSDP's names for
// it), optimizer offload, gradient-reduce and parameter-gather overlap, buckets.
void apply_sharding_flags(const po::variables_map& vm, TrainArgs& a) {
  if (vm.count("use-distributed-optimizer") && vm["use-distributed-optimizer"].as<bool>()) {
    // An explicit --zero-stage 0 is not replaced by the distributed optimizer's stage 1: refused.
    need(!(flag_given(vm, "zero-stage") && a.zero_stage == 0),
         "--zero-stage 0 and --use-distributed-optimizer disagree: the distributed optimizer shards the optimizer "
         "state (ZeRO stage 1), stage 0 shards nothing",
         "drop one of them (--use-distributed-optimizer alone is stage 1; --zero-stage 1, 2 or 3 also shard)");
    if (a.zero_stage == 0) a.zero_stage = 1;
  }
  need(!vm["use-torch-fsdp2"].as<bool>(), "--use-torch-fsdp2: mpitron has no PyTorch FSDP2",
       "use --use-megatron-fsdp --data-parallel-sharding-strategy optim_grads_params, or --zero-stage 3 (the same "
       "sharding of parameters, gradients and optimizer state)");
  if (vm["optimizer-cpu-offload"].as<bool>()) a.optim.cpu_offload = true;
  if (vm.count("optimizer-offload-fraction")) {
    const double f = vm["optimizer-offload-fraction"].as<double>();
    need(a.optim.cpu_offload, "--optimizer-offload-fraction needs --optimizer-cpu-offload", "add --optimizer-cpu-offload");
    need(f == 1.0, str("--optimizer-offload-fraction ", f, ": only 1.0 is built (every rank's whole optimizer state in "
                       "host memory)"),
         "use 1.0, or drop --optimizer-cpu-offload");
  }
  if (vm.count("data-parallel-sharding-strategy")) {
    const std::string st = vm["data-parallel-sharding-strategy"].as<std::string>();
    const std::vector<std::string> names = {"no_shard", "optim", "optim_grads", "optim_grads_params"};
    const auto it = std::find(names.begin(), names.end(), st);
    need(it != names.end(), str("--data-parallel-sharding-strategy ", st, " is not one of no_shard, optim, optim_grads, "
                                "optim_grads_params"), "");
    need(vm["use-megatron-fsdp"].as<bool>(), str("--data-parallel-sharding-strategy ", st, " needs --use-megatron-fsdp"),
         "add --use-megatron-fsdp (or use --zero-stage 0..3)");
    const int64_t stage = it - names.begin();
    need(!flag_given(vm, "zero-stage") || a.zero_stage == stage,
         str("--data-parallel-sharding-strategy ", st, " is ZeRO stage ", stage, " but --zero-stage ", a.zero_stage,
             " was given"), "drop one of them");
    need(!vm["use-distributed-optimizer"].as<bool>() || stage >= 1,
         "--use-distributed-optimizer shards the optimizer state but --data-parallel-sharding-strategy no_shard does not",
         "drop one of them");
    a.zero_stage = stage;
  }  // --use-megatron-fsdp alone: Megatron's default strategy, no_shard (the stage given, or 0)
  need(a.zero_stage >= 0 && a.zero_stage <= 3, str("--zero-stage must be 0, 1, 2 or 3, got ", a.zero_stage));
  const bool overlap_on = vm.count("overlap-grad-reduce") && vm["overlap-grad-reduce"].as<bool>();
  const bool overlap_off = vm.count("no-overlap-grad-reduce") && vm["no-overlap-grad-reduce"].as<bool>();
  need(!(overlap_on && overlap_off), "--overlap-grad-reduce and --no-overlap-grad-reduce were both given", "pick one");
  if (overlap_off) a.overlap_grad_reduce = false;
  need(!a.overlap_param_gather || a.zero_stage > 0,
       "--overlap-param-gather overlaps the distributed optimizer's parameter all-gather, but there is none",
       "add --use-distributed-optimizer (or --zero-stage 1|2|3), or drop --overlap-param-gather");
  need(a.ddp_bucket_size >= 0, str("--ddp-bucket-size must be >= 0, got ", a.ddp_bucket_size));
}

// The model's shape from the model flags (T5's stacks, BERT's token types), or from the
// --load checkpoint with --use-checkpoint-args; the shape flags a run must give.
void apply_model_shape_flags(const po::variables_map& vm, TrainArgs& a) {
  GPTConfig& m = a.model;
  const GivenFlags given = given_model_flags(vm);
  if (m.t5 && vm.count("encoder-seq-length")) {  // Megatron's name of the encoder's --seq-length
    need(!vm.count("seq-length") || vm["seq-length"].as<int64_t>() == vm["encoder-seq-length"].as<int64_t>(),
         "--seq-length and --encoder-seq-length disagree", "give one of them: it is the encoder's length");
    m.seq_length = vm["encoder-seq-length"].as<int64_t>();
  }
  apply_model_flags(given, m, model_scopes(m));
  if (m.bert) m.causal = false;  // pretrain_bert (model/bert.h)
  if (m.t5) resolve_t5_layers(vm, m);
  if (vm["use-checkpoint-args"].as<bool>()) {
    need(!a.load.empty(), "--use-checkpoint-args needs --load DIR", "name the checkpoint directory to take them from");
    reconcile_with_checkpoint(given, read_checkpoint_config(a.load), m, /*fill=*/true, a.load);
  } else {
    for (const char* flag : {"num-layers", "hidden-size", "num-attention-heads", "seq-length"}) {
      if (m.t5 && std::string(flag) == "num-layers" && vm.count("encoder-num-layers") && vm.count("decoder-num-layers"))
        continue;
      if (m.t5 && std::string(flag) == "seq-length" && vm.count("encoder-seq-length")) continue;
      need(vm.count(flag) > 0, str(m.tool(), ": the option '--", flag, "' is required but missing"),
           "give it, or --use-checkpoint-args with --load to take the model flags from a checkpoint");
    }
    need(!m.t5 || vm.count("decoder-seq-length") > 0,
         "pretrain_t5: the option '--decoder-seq-length' is required but missing", "Megatron's pretrain_t5 uses 128");
    if (!vm.count("max-position-embeddings")) m.max_position_embeddings = std::max(m.seq_length, m.decoder_seq_length);
  }
  if (m.bert) m.num_tokentypes = m.binary_head ? 2 : 0;  // Megatron's 2 token types with the binary head
}

// --rampup-batch-size's three numbers, --split's weights, and the compute dtype.
void apply_batch_and_precision_flags(const po::variables_map& vm, TrainArgs& a,
                                     const std::vector<std::string>& rampup_tokens) {
  GPTConfig& m = a.model;
  for (const std::string& t : rampup_tokens) {
    size_t used = 0;
    int64_t v = -1;
    try {
      v = std::stoll(t, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    need(used == t.size() && v >= 1, str("--rampup-batch-size: '", t, "' is not an integer >= 1"),
         "e.g. --rampup-batch-size 16 16 1000");
    a.rampup_batch_size.push_back(v);
  }
  data::parse_split_weights(a.split);  // each weight finite and >= 0
  need(a.rampup_batch_size.empty() || a.rampup_batch_size.size() == 3,
       "--rampup-batch-size takes three numbers: START INCREMENT SAMPLES", "e.g. --rampup-batch-size 16 16 1000");

  need(!(a.fp16 && a.bf16), "--fp16 and --bf16 were both given", "pick one");
  need(!vm.count("loss-scale") || a.fp16, "--loss-scale only applies with --fp16", "add --fp16 or drop --loss-scale");
  m.compute_dtype = a.bf16 ? DType::BF16 : a.fp16 ? DType::F16 : DType::F32;
}

// The tokenizer each tool trains with (and BERT's and T5's own flags).
void check_tool_flags(const TrainArgs& a) {
  const GPTConfig& m = a.model;
  if (m.bert) check_bert_flags(a);
  else if (m.t5) check_t5_flags(a);
  else need(a.tokenizer_type == "GPT2BPETokenizer" || a.tokenizer_type == "HuggingFaceTokenizer" ||
           a.tokenizer_type == "SentencePieceTokenizer" || a.tokenizer_type == "Llama2Tokenizer" ||
           a.tokenizer_type == "GPTSentencePieceTokenizer",
       str("--tokenizer-type ", a.tokenizer_type, " is not supported"),
       "use GPT2BPETokenizer, HuggingFaceTokenizer, SentencePieceTokenizer, Llama2Tokenizer or GPTSentencePieceTokenizer");
}

// The layout: tp x cp x pp dividing the world (the data-parallel size follows), each
// parallelism's divisibility, virtual pipeline stages and schedules.
void check_parallel_flags(const po::variables_map& vm, TrainArgs& a) {
  const GPTConfig& m = a.model;
  const int64_t tp = a.tensor_model_parallel_size, pp = a.pipeline_model_parallel_size;
  need(tp >= 1 && pp >= 1, str("--tensor-model-parallel-size (", tp, ") and --pipeline-model-parallel-size (", pp,
                               ") must be >= 1"));
  checked_mul(a.micro_batch_size, a.model.seq_length, "--micro-batch-size x --seq-length");
  const int64_t cp = a.context_parallel_size;
  if (a.world_size > 0) {
    need(a.world_size % (tp * cp * pp) == 0,
         str("world size ", a.world_size, " is not divisible by --tensor-model-parallel-size ", tp,
             cp > 1 ? str(" x --context-parallel-size ", cp) : std::string(), " x --pipeline-model-parallel-size ", pp,
             " = ", tp * cp * pp),
         cp > 1 ? "launch a multiple of tp x cp x pp ranks (data-parallel size = world / (tp x cp x pp))"
                : "launch a multiple of tp x pp ranks (data-parallel size = world / (tp x pp))");
    a.data_parallel_size = a.world_size / (tp * cp * pp);
  }
  check_context_parallel_flags(vm, a);
  if (!a.model.bert && !a.model.t5) check_moe_flags(vm, a);
  need(m.num_attention_heads % tp == 0,
       str("--num-attention-heads ", m.num_attention_heads, " is not divisible by --tensor-model-parallel-size ", tp));
  need(m.query_groups() % tp == 0,
       str("--num-query-groups ", m.query_groups(), " is not divisible by --tensor-model-parallel-size ", tp),
       "each tensor-parallel rank holds whole key/value groups: use at most as many ranks as groups, dividing them");
  need(m.ffn() % tp == 0, str("the FFN size ", m.ffn(), " is not divisible by --tensor-model-parallel-size ", tp));
  if (a.sequence_parallel && tp == 1) {  // as Megatron: a warning, and sequence parallelism off
    a.sequence_parallel = false;
    a.startup_notes.push_back("--sequence-parallel: turned off, it needs --tensor-model-parallel-size > 1");
  }
  need(!a.sequence_parallel || !m.t5 || (a.micro_batch_size * m.decoder_seq_length) % tp == 0,
       str("--sequence-parallel splits --micro-batch-size x --decoder-seq-length = ", a.micro_batch_size * m.decoder_seq_length,
           " tokens over ", tp, " ranks: not divisible"));
  need(!a.sequence_parallel || (a.micro_batch_size * m.seq_length / cp) % tp == 0,
       str("--sequence-parallel splits --micro-batch-size x --seq-length", cp > 1 ? " / --context-parallel-size" : "",
           " = ", a.micro_batch_size * m.seq_length / cp, " tokens over ", tp, " ranks: not divisible"));
  if (a.num_layers_per_virtual_pipeline_stage > 0) {
    need(pp > 1, "--num-layers-per-virtual-pipeline-stage needs --pipeline-model-parallel-size > 1");
    need(m.num_layers % (pp * a.num_layers_per_virtual_pipeline_stage) == 0,
         str("--num-layers ", m.num_layers, " is not divisible by --pipeline-model-parallel-size ", pp,
             " x --num-layers-per-virtual-pipeline-stage ", a.num_layers_per_virtual_pipeline_stage));
  } else {
    need(a.num_layers_per_virtual_pipeline_stage == 0, "--num-layers-per-virtual-pipeline-stage must be >= 1");
    need(m.num_layers % pp == 0, str("--num-layers ", m.num_layers,
                                     " is not divisible by --pipeline-model-parallel-size ", pp));
  }
  need(a.pipeline_schedule.empty() || pp > 1, "--pipeline-schedule needs --pipeline-model-parallel-size > 1");
  const bool schedule_file = !a.pipeline_schedule.empty() && !parallel::is_builtin_schedule(a.pipeline_schedule);
  need(!schedule_file || a.rampup_batch_size.empty(),
       str("--pipeline-schedule ", a.pipeline_schedule,
           " is written for one micro-batch count, but --rampup-batch-size changes it during the run"),
       "use a built-in schedule (gpipe, 1f1b, interleaved, zb-h1, zbv) with batch-size ramp-up");
  need((a.pipeline_schedule != "1f1b" && a.pipeline_schedule != "gpipe" && a.pipeline_schedule != "zb-h1") ||
           a.num_layers_per_virtual_pipeline_stage == 0,
       str("--pipeline-schedule ", a.pipeline_schedule,
           " has one model chunk per rank, but --num-layers-per-virtual-pipeline-stage asks for several"),
       "use --pipeline-schedule interleaved or zbv (model chunks per rank), or drop the virtual stages");
  need(a.pipeline_schedule != "zbv" || a.virtual_pipeline_stages() == 2,
       str("--pipeline-schedule zbv holds 2 model chunks per rank (stages r and 2pp-1-r), but the run has ",
           a.virtual_pipeline_stages()),
       str("add --num-layers-per-virtual-pipeline-stage ", std::max<int64_t>(1, m.num_layers / (2 * pp))));
  need(a.profile_pipeline.empty() || pp > 1, "--profile-pipeline needs --pipeline-model-parallel-size > 1",
       "it measures the pipeline schedule's actions");
  need(a.zero_stage != 2 || pp == 1, "--zero-stage 2 reduce-scatters gradients per micro-batch, which pipeline "
                                    "schedules interleave: it is not available with --pipeline-model-parallel-size > 1",
       "use --zero-stage 1 (--use-distributed-optimizer) or --zero-stage 3 with pipeline parallelism (DeepSpeed's "
       "pipeline engine refuses stage 2 too)");
}

// --optimizer: a built rule (parallel/update_rule.h), or refused naming what Megatron has that is not built.
void check_optimizer_flags(const po::variables_map& vm, const TrainArgs& a) {
  const std::string& o = a.optim.optimizer;
  const std::vector<std::string> built = built_optimizers();
  if (std::find(built.begin(), built.end(), o) != built.end()) {
    need(o == "sgd" || !flag_given(vm, "sgd-momentum"), "--sgd-momentum needs --optimizer sgd", "");
    return;
  }
  const bool megatron = o == "lion" || o == "soap" || o == "adaptive_muon";
  need(false,
       megatron ? str("--optimizer ", o, " (Megatron-Core's) is not built in mpitron")
                : str("--optimizer ", o, " is unknown"),
       "use --optimizer adam, sgd, muon or dist_muon");
}

// The learning-rate and weight-decay schedule flags (Megatron's arguments.py rules).
void check_schedule_flags(const po::variables_map& vm, TrainArgs& a) {
  const std::string& st = a.lr_decay_style;
  need(st == "constant" || st == "linear" || st == "cosine" || st == "inverse-square-root" || st == "WSD",
       str("--lr-decay-style ", st, " is not supported"), "use constant, linear, cosine, inverse-square-root or WSD");
  const std::string& w = a.lr_wsd_decay_style;
  need(w == "exponential" || w == "linear" || w == "cosine" || w == "minus_sqrt",
       str("--lr-wsd-decay-style ", w, " is not supported"), "use exponential, linear, cosine or minus_sqrt");
  const char* wsd_flag = a.uses_samples() ? "lr-wsd-decay-samples" : "lr-wsd-decay-iters";
  const char* other = a.uses_samples() ? "lr-wsd-decay-iters" : "lr-wsd-decay-samples";
  need(!vm.count(other), str("--", other, " does not fit a ", a.uses_samples() ? "--train-samples" : "--train-iters",
                             " run"),
       str("give WSD's annealing with --", wsd_flag));
  if (st == "WSD")
    need(vm.count(wsd_flag) > 0, str("--lr-decay-style WSD needs --", wsd_flag, " (the annealing's length)"),
         "e.g. a tenth to a fifth of the decay");
  else if (vm.count(wsd_flag) || flag_given(vm, "lr-wsd-decay-style"))
    a.startup_notes.push_back(str("--", vm.count(wsd_flag) ? wsd_flag : "lr-wsd-decay-style",
                                  " has no effect with --lr-decay-style ", st, " (only WSD anneals)"));
  const std::string& inc = a.weight_decay_incr_style;
  need(inc == "constant" || inc == "linear" || inc == "cosine",
       str("--weight-decay-incr-style ", inc, " is not supported"), "use constant, linear or cosine");
  const bool start = vm.count("start-weight-decay") > 0, end = vm.count("end-weight-decay") > 0;
  if (inc == "constant") {
    need(!start && !end, "--start-weight-decay / --end-weight-decay need --weight-decay-incr-style linear or cosine",
         "give --weight-decay alone for a constant weight decay");
  } else {
    need(start && end, str("--weight-decay-incr-style ", inc, " needs --start-weight-decay and --end-weight-decay"), "");
    need(a.start_weight_decay >= 0 && a.end_weight_decay >= a.start_weight_decay,
         str("--start-weight-decay ", a.start_weight_decay, " and --end-weight-decay ", a.end_weight_decay,
             " must satisfy 0 <= start <= end (Megatron increments weight decay)"),
         "");
  }
  need(!(a.override_opt_param_scheduler && a.use_checkpoint_opt_param_scheduler),
       "--override-opt_param-scheduler and --use-checkpoint-opt_param-scheduler contradict each other",
       "give one: the flags' schedule, or the checkpoint's");
}

// The run: LR schedule, device, length, batch sizes, data sources, intervals, checkpoints.
void check_run_flags(const po::variables_map& vm, TrainArgs& a, const std::optional<DeepSpeedConfig>& ds) {
  const int64_t cp = a.context_parallel_size;
  check_schedule_flags(vm, a);
  check_optimizer_flags(vm, a);
  need(a.device == "auto" || a.device == "cpu" || a.device == "cuda", str("--device ", a.device, " unknown"),
       "use auto, cpu or cuda");
  need((a.train_iters > 0) != (a.train_samples > 0), "give exactly one of --train-iters and --train-samples", "");
  need(a.micro_batch_size >= 1, str("--micro-batch-size must be >= 1, got ", a.micro_batch_size));
  if (ds && ds->grad_accum && !ds->global_batch && !vm.count("global-batch-size"))
    a.global_batch_size = checked_mul(checked_mul(a.micro_batch_size, *ds->grad_accum, "DeepSpeed micro batch x accumulation"),
                                      a.data_parallel_size, "DeepSpeed micro batch x accumulation x data-parallel size");
  else if (!vm.count("global-batch-size") && !(ds && ds->global_batch))
    a.global_batch_size = checked_mul(a.micro_batch_size, a.data_parallel_size, "--micro-batch-size x data-parallel size");
  if (ds) check_deepspeed_batch(*ds, a);
  if (a.zero_stage > 0 && a.data_parallel_size * cp == 1)
    a.startup_notes.push_back(str("--zero-stage ", a.zero_stage, " / --use-distributed-optimizer with one data-parallel "
                                  "rank: nothing to shard, the optimizer keeps its whole state (same numbers)"));
  if (a.train_iters > 0) checked_mul(a.train_iters, a.global_batch_size, "--train-iters x --global-batch-size");
  {  // the evaluation samples the run asks for (samples_per_split) must fit too
    const int64_t iters = a.train_iters > 0 ? a.train_iters : a.train_samples / std::max<int64_t>(a.global_batch_size, 1) + 1;
    const int64_t evals = iters / std::max<int64_t>(a.eval_interval, 1) + 1;
    checked_mul(checked_mul(evals, a.eval_iters, "evaluations x --eval-iters"), a.global_batch_size,
                "evaluation batches x --global-batch-size");
  }
  need(a.global_batch_size % (a.micro_batch_size * a.data_parallel_size) == 0,
       str("--global-batch-size (", a.global_batch_size, ") is not divisible by --micro-batch-size (", a.micro_batch_size,
           ") × data-parallel size (", a.data_parallel_size, ")"),
       "make the global batch a multiple of micro batch × data-parallel size");
  const bool split_paths = !a.train_data_path.empty() || !a.valid_data_path.empty() || !a.test_data_path.empty();
  const int sources = !a.data_path.empty() + split_paths + a.mock_data;
  need(sources <= 1, "give one of --data-path, --train-data-path (with --valid-/--test-data-path) and --mock-data",
       "they name different sources of samples");
  need(sources == 1, "--data-path is required (or --train-data-path, or --mock-data)",
       "point it at a preprocessed prefix (see preprocess_data)");
  need(!split_paths || !a.train_data_path.empty(), "--valid-data-path/--test-data-path need --train-data-path", "");
  need(!split_paths || !flag_given(vm, "split"),
       "--split divides --data-path; with --train-data-path each split has its own files", "drop --split");
  need(a.log_interval >= 1 && a.eval_interval >= 1 && a.eval_iters >= 0, "--log-interval and --eval-interval must be >= 1");
  need(a.save_interval == 0 || !a.save.empty(), "--save-interval given without --save", "add --save DIR");
  if (a.uses_samples()) {
    need(!vm.count("lr-decay-iters") && !vm.count("lr-warmup-iters"),
         "--train-samples runs count the schedule in samples: use --lr-decay-samples / --lr-warmup-samples", "");
  } else {
    need(!vm.count("lr-decay-samples") && !vm.count("lr-warmup-samples"),
         "--train-iters runs count the schedule in iterations: use --lr-decay-iters / --lr-warmup-iters", "");
    need(a.rampup_batch_size.empty(), "--rampup-batch-size requires --train-samples (as in Megatron)",
         "give the run length with --train-samples");
  }
  const int warmups = (vm.count("lr-warmup-fraction") > 0) + (vm.count("lr-warmup-iters") > 0) +
                      (vm.count("lr-warmup-samples") > 0);
  need(warmups <= 1, "give at most one of --lr-warmup-fraction, --lr-warmup-iters, --lr-warmup-samples", "");
  need(!vm.count("lr-warmup-fraction") || (a.lr_warmup_fraction >= 0 && a.lr_warmup_fraction <= 1),
       str("--lr-warmup-fraction must be in [0, 1], got ", a.lr_warmup_fraction));
  need(!(a.finetune && a.load.empty()), "--finetune needs --load", "");
  need(a.keep_last >= 0, str("--keep-last must be >= 0, got ", a.keep_last));
  need(a.keep_last == 0 || !a.save.empty(), "--keep-last given without --save", "add --save DIR");
  need(!a.async_save || !a.save.empty(), "--async-save given without --save", "add --save DIR");
}

}  // namespace

LRScheduleConfig lr_schedule_config(const TrainArgs& a) {
  LRScheduleConfig c;
  c.lr = a.lr;
  c.min_lr = a.min_lr;
  c.init_lr = a.lr_warmup_init;
  c.style = a.lr_decay_style;
  c.wsd_style = a.lr_wsd_decay_style;
  const int64_t gbs = a.global_batch_size;
  if (a.uses_samples()) {
    c.decay_steps = a.lr_decay_samples ? a.lr_decay_samples : a.train_samples;
    c.wd_incr_steps = a.train_samples;
    c.wsd_decay_steps = a.lr_wsd_decay_samples;
    c.warmup_steps = static_cast<double>(a.lr_warmup_samples);
  } else {
    c.decay_steps = (a.lr_decay_iters ? a.lr_decay_iters : a.train_iters) * gbs;
    c.wd_incr_steps = a.train_iters * gbs;
    c.wsd_decay_steps = a.lr_wsd_decay_iters * gbs;
    c.warmup_steps = static_cast<double>(a.lr_warmup_iters * gbs);
  }
  // Megatron: lr_warmup_fraction * lr_decay_steps, not rounded.
  if (a.lr_warmup_fraction >= 0) c.warmup_steps = a.lr_warmup_fraction * static_cast<double>(c.decay_steps);
  if (a.weight_decay_incr_style == "constant") {
    c.start_wd = c.end_wd = a.optim.weight_decay;
  } else {
    c.start_wd = a.start_weight_decay;
    c.end_wd = a.end_weight_decay;
  }
  c.wd_incr_style = a.weight_decay_incr_style;
  return c;
}

const po::options_description& pretrain_flag_descriptions() {
  struct Sink {  // where the descriptions' values would go; never read
    TrainArgs gpt, bert, t5;
    std::string config_gpt, config_bert, config_t5;
    std::vector<std::string> rampup_gpt, rampup_bert, rampup_t5;
    po::options_description all;
  };
  static const Sink* const sink = [] {
    auto* s = new Sink;  // lives as long as the process: the descriptions point into it
    s->bert.model.bert = true;
    s->all.add(describe_flags(s->gpt, s->config_gpt, s->rampup_gpt));
    s->t5.model.t5 = true;
    for (const po::options_description& d : {describe_flags(s->bert, s->config_bert, s->rampup_bert),
                                              describe_flags(s->t5, s->config_t5, s->rampup_t5)})
      for (const auto& o : d.options())
        if (!s->all.find_nothrow(o->long_name(), false)) s->all.add(o);
    return s;
  }();
  return sink->all;
}

MegatronSaveOptions megatron_save_options(const TrainArgs& a) {
  MegatronSaveOptions o;
  o.tp = a.tensor_model_parallel_size;
  o.pp = a.pipeline_model_parallel_size;
  o.make_vocab_size_divisible_by = a.make_vocab_size_divisible_by;
  o.tokenizer_type = a.tokenizer_type;
  return o;
}

bool parse_train_args(int argc, char** argv, TrainArgs& a) {
  std::string config_file;
  std::vector<std::string> rampup_tokens;
  const po::options_description desc = describe_flags(a, config_file, rampup_tokens);
  po::variables_map vm;
  if (!read_command_line(argc, argv, desc, a.model.tool(), vm)) return false;
  a.flags_json = flags_to_json(vm);
  // Megatron / DeepSpeed flags that change nothing here: one start-up line each.
  check_noop_flags(vm, a.startup_notes);
  if (vm.count("ckpt-format")) a.ckpt_format = vm["ckpt-format"].as<std::string>();  // a Megatron --load's format
  const std::optional<DeepSpeedConfig> ds = apply_deepspeed_flags(vm, a);
  apply_recompute_flags(vm, a);
  check_numeric_flags(vm, a);
  apply_step_check_flags(vm, a);
  apply_sharding_flags(vm, a);
  check_muon_flags(vm, a);
  apply_model_shape_flags(vm, a);
  apply_batch_and_precision_flags(vm, a, rampup_tokens);
  check_tool_flags(a);
  check_parallel_flags(vm, a);
  check_run_flags(vm, a, ds);
  a.model.validate();
  if (a.ckpt_format == "torch" && !a.save.empty()) {  // Megatron's files written beside each save
    need(!a.async_save, "--ckpt-format torch with --async-save: Megatron's files are written only after a synchronous save",
         "drop --async-save, or convert a checkpoint later: convert_checkpoint --direction mpitron-to-megatron");
    check_megatron_save(a.model, megatron_save_options(a));
  }
  return true;
}

}  // namespace mpitron
