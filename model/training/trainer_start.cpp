// The start of Trainer::run: what runs (the model, the layout, FLOPs, the memory
// estimate), the --load checkpoint, and --save's owner (model/training/trainer_impl.h).
#include <cmath>
#include <filesystem>

#include "core/device_memory.h"
#include "core/log.h"
#include "io/checkpoint.h"
#include "model/memory.h"
#include "model/training/trainer_impl.h"
#include "parallel/failure_record.h"
#include "parallel/update_rule.h"

namespace mpitron {

namespace {
bool same_path(const std::string& a, const std::string& b) {
  std::error_code ec1, ec2;
  const auto x = std::filesystem::weakly_canonical(a, ec1), y = std::filesystem::weakly_canonical(b, ec2);
  return !ec1 && !ec2 && x == y;
}
}  // namespace

void Trainer::Impl::start() {
  log_model();
  check_memory();
  if (!args.load.empty()) load_at_start();
  check_save_owner();
}

void Trainer::Impl::log_model() {
  const TrainArgs& a = args;
  const GPTConfig& c = a.model;
  log_info(kind->describe(), ", vocab ", c.padded_vocab_size, " (padded from ", c.vocab_size, "), ",
           c.num_parameters(), " parameters, ", dtype_name(c.compute_dtype), " on ", device.name(),
           a.recompute_activations
               ? (a.recompute_num_layers > 0 ? str(", recompute of the first ", a.recompute_num_layers, " blocks per chunk")
                                             : std::string(", recompute"))
               : std::string());
  for (const std::string& note : a.startup_notes) log_info(note);
  for (const std::string& line : kind->startup_lines()) log_info(line);
  if (par.cp_size > 1)  // never silently off (Megatron-Bridge #2667): the layout and the comm type
    log_info("context parallelism: each ", c.seq_length, "-token sequence over ", par.cp_size, " ranks, ",
             model->parallel().cp.local_seq(c.seq_length), " tokens each; ", model->parallel().cp.describe(c.seq_length),
             "; gradients reduced over dp x cp = ", grad_ranks(), " ranks");
  log_info("FLOPs per token ", sci(c.flops_per_token(), 3),
           " (6·matmul params + 12·L·NH·HD·K, K the keys a query attends; docs/flops.md); MFU vs ", peak_what);
}

// This rank's share of the model, its states and activations (model/memory.h), refused
// when over the device's memory or --memory-cap.
void Trainer::Impl::check_memory() {
  const TrainArgs& a = args;
  RankShard shard;
  shard.params = model->params().numel();
  shard.tp = par.tp_size;
  shard.cp = par.cp_size;
  shard.cp_comm = model->parallel().cp.type;
  shard.sequence_parallel = a.sequence_parallel;
  shard.layers_per_chunk = model->chunk(0).end_layer - model->chunk(0).first_layer;
  shard.num_chunks = model->num_chunks();
  // MPI's staging buffers are host memory: on the device's only when the device is the CPU.
  shard.mpi_zero_staging = states->sharded() && grad_comm() && std::string(grad_comm()->backend()) == "mpi" &&
                           device.is_cpu();
  shard.recompute_layers = a.recompute_num_layers;
  shard.first_stage = model->chunk(0).first_stage;
  shard.last_stage = model->chunk(model->num_chunks() - 1).last_stage;
  if (pipelined()) {
    const int64_t n_micro = rampup->global_batch(st.consumed_train_samples) / (a.micro_batch_size * a.data_parallel_size);
    const parallel::Schedule& sched = schedule_for(n_micro);
    for (const parallel::Action& act : sched.ranks[static_cast<size_t>(par.pp_rank)])
      if (parallel::is_compute(act.op))
        shard.compute_order.push_back(
            {act.chunk, act.op == parallel::Op::Forward ? 'F' : act.op == parallel::Op::Backward ? 'B' : 'W'});
  }
  shard.optimizer_offload = a.optim.cpu_offload && !device.is_cpu();
  if (a.optim.cpu_offload && device.is_cpu())
    log_info("--optimizer-cpu-offload on the CPU: the optimizer state is in host memory already (nothing moves)");
  shard.optimizer_states = static_cast<int>(optimizer_state_names(a.optim.optimizer).size());
  states->account(shard);  // the strategy's own terms (ZeRO-3: its unit buffers)
  MemoryEstimate est = estimate_memory(a.model, a.micro_batch_size, shard_ranks(), states->memory_stage(),
                                       a.recompute_activations, shard);
  log_info("model states: ", states->describe());
  if (device.is_cuda()) est.device_workspace = int64_t{32} << 20;  // cuBLASLt's, tensor/cuda/common.cu
  log_info("memory per rank (estimate): ", est.to_string());
  check_estimate_fits(est, capacity(), capacity_name());
  estimated_memory_bytes = est.total();
}

void Trainer::Impl::load_at_start() {
  enter_phase("checkpoint-load", st.iteration);  // parallel/failure_record.h
  const TrainArgs& a = args;
  LoadOptions lo;
  lo.load_optim = !a.no_load_optim;
  lo.load_rng = !a.no_load_rng;
  lo.finetune = a.finetune;
  lo.optimizer = make_update_rule(a.optim)->name();  // the state's kind: dist_muon's is muon's
  lo.tokenizer = a.tokenizer_identity;
  lo.allow_tokenizer_change = a.allow_tokenizer_change;
  lo.ckpt_format = a.ckpt_format;
  lo.lr_schedule = lr_json();
  lo.global_batch_size = a.global_batch_size;
  SaveInfo li;
  OptimState loaded;
  const auto [sb, se] = states->state_range();
  states->whole();  // the load writes every value
  const bool found = load_checkpoint(a.load, *model, loaded, sb, se, scaler, st, lo, &li, world_comm());
  if (found) states->install(loaded, lo.load_optim && !lo.finetune);
  // Megatron loads the scheduler with the optimizer (not with --finetune or --no-load-optim);
  // a run already at its end uses no schedule (below: it says so and trains nothing).
  if (found && lo.load_optim && !lo.finetune && st.iteration < total_iters) resume_schedule(li.lr_schedule, li.dir);
  if (found && !a.finetune) {  // a resume continues the lineage it loaded (the one keep_last may prune)
    const std::string loaded_run = io::CheckpointReader::run_of(a.load, st.iteration);
    if (!loaded_run.empty()) st.run_id = loaded_run;
    st.owned_runs = {st.run_id};
    // Checkpoints from before runs were recorded belong to the run that resumes them in place.
    if (loaded_run.empty() && same_path(a.load, a.save)) st.owned_runs.push_back("");
  }
  if (found && metrics) metrics->drop_after(st.iteration);  // a restart's rows follow on without duplicates
  if (found)
    log_info("loaded checkpoint ", li.dir, " at iteration ", st.iteration, " (", sci(li.bytes / 1e9, 3), " GB in ",
             sci(li.seconds, 3), " s, ", sci(li.bytes / 1e9 / std::max(li.seconds, 1e-9), 3), " GB/s)");
  else
    log_warn("--load ", a.load, ": no checkpoint there, starting from scratch");
  MPT_CHECK(std::isfinite(scaler.scale()) && scaler.scale() > 0,
            str("--load ", a.load, ": the checkpoint's loss scale is ", scaler.scale()),
            "the checkpoint is damaged; load an earlier one");
  if (st.iteration >= total_iters)
    log_warn("--load ", a.load, ": the checkpoint is at iteration ", st.iteration, ", already at or past the end of ",
             "this run (", total_iters, a.uses_samples() ? " iterations from --train-samples" : " = --train-iters",
             "): nothing to train; raise --train-iters / --train-samples to go on");
}

// Nothing this run did not write is replaced: a --save directory holding another run's
// checkpoints (not the lineage it resumed) is refused.
void Trainer::Impl::check_save_owner() const {
  const TrainArgs& a = args;
  if (a.save.empty()) return;
  const std::vector<int64_t> foreign = io::CheckpointReader::foreign_iterations(a.save, st.owned_runs);
  if (foreign.empty()) return;
  std::string list;
  for (size_t k = 0; k < foreign.size() && k < 4; ++k) list += str(k ? ", " : "", io::iteration_dir_name(foreign[k]));
  if (foreign.size() > 4) list += str(", ... (", foreign.size(), " in all)");
  MPT_CHECK(a.overwrite_save,
            str("--save ", a.save, " holds checkpoints of another run (", list,
                "): saving here would repoint its latest_checkpointed_iteration.txt and could replace them"),
            "save to another directory, resume that run with --load " + a.save +
                ", or pass --overwrite-save (--keep-last still deletes only this run's checkpoints)");
  log_warn("--overwrite-save: --save ", a.save, " holds checkpoints of another run (", list, ")");
}

}  // namespace mpitron
