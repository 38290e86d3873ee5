// The trainer's checkpoints (model/training/trainer_impl.h): a save (in the background with
// --async-save), the check that nothing non-finite is saved, and --spike-rerun's return to
// the newest checkpoint.
#include <cmath>
#include <type_traits>

#include <nlohmann/json.hpp>

#include "core/log.h"
#include "model/checkpoint/megatron_save.h"
#include "model/training/trainer_impl.h"
#include "parallel/failure_record.h"
#include "parallel/update_rule.h"

namespace mpitron {

// Megatron's OptimizerParamScheduler.state_dict() names, plus what mpitron records besides
// (init_lr, WSD's annealing: Megatron takes those from the flags on a resume, as here).
std::string Trainer::Impl::lr_json() const {
  const LRScheduleConfig& c = lr->config();
  return nlohmann::json{{"max_lr", c.lr},
                        {"min_lr", c.min_lr},
                        {"lr_warmup_steps", c.warmup_steps},
                        {"lr_decay_steps", c.decay_steps},
                        {"lr_decay_style", c.style},
                        {"num_steps", schedule_step()},
                        {"start_wd", c.start_wd},
                        {"end_wd", c.end_wd},
                        {"wd_incr_style", c.wd_incr_style},
                        {"wd_incr_steps", c.wd_incr_steps},
                        {"init_lr", c.init_lr},
                        {"wsd_decay_steps", c.wsd_decay_steps},
                        {"lr_wsd_decay_style", c.wsd_style},
                        {"unit", "samples"}}
      .dump();
}

// OptimizerParamScheduler.load_state_dict's _check_and_set for every value the checkpoint
// records: --override-opt_param-scheduler keeps the flags', --use-checkpoint-opt_param-scheduler
// takes the checkpoint's, and otherwise they must agree. Where the schedule stands (num_steps)
// follows from the iteration and samples the checkpoint resumed (schedule_step()).
void Trainer::Impl::resume_schedule(const std::string& saved_json, const std::string& where) {
  if (saved_json.empty() || args.override_opt_param_scheduler) return;
  const nlohmann::json j = nlohmann::json::parse(saved_json, nullptr, false);
  if (!j.is_object()) return;
  // Checkpoints before the schedule counted samples: iteration runs recorded iterations.
  const double unit = j.value("unit", "samples") == "iterations" ? static_cast<double>(args.global_batch_size) : 1.0;
  LRScheduleConfig c = lr->config();
  std::string differ, follows;
  // Lengths no flag gave (the decay and weight-decay increments over the whole run, a warmup fraction of
  // it): a resume with a longer --train-iters / --train-samples extends them, as mpitron always did
  // (Megatron refuses that without --override-opt_param-scheduler), with a note.
  const bool whole_run = args.lr_decay_iters == 0 && args.lr_decay_samples == 0;
  auto num = [&](const char* key, const char* legacy, const char* what, double scale, auto& field,
                 bool from_run = false) {
    const char* k = j.contains(key) ? key : legacy;
    if (!k || !j.contains(k) || !j.at(k).is_number()) return;
    using T = std::decay_t<decltype(field)>;
    const T saved = static_cast<T>(j.at(k).get<double>() * scale);
    if (saved == field) return;
    if (from_run && whole_run && !args.use_checkpoint_opt_param_scheduler) {
      follows += str(follows.empty() ? "" : "; ", what, " ", field, " (the checkpoint's ", saved, ")");
      return;
    }
    differ += str(differ.empty() ? "" : "; ", what, " ", saved, " (checkpoint) vs ", field, " (flags)");
    if (args.use_checkpoint_opt_param_scheduler) field = saved;
  };
  auto text = [&](const char* key, const char* legacy, const char* what, std::string& field) {
    const char* k = j.contains(key) ? key : legacy;
    if (!k || !j.contains(k) || !j.at(k).is_string()) return;
    const std::string saved = j.at(k).get<std::string>();
    if (saved == field) return;
    differ += str(differ.empty() ? "" : "; ", what, " ", saved, " (checkpoint) vs ", field, " (flags)");
    if (args.use_checkpoint_opt_param_scheduler) field = saved;
  };
  num("max_lr", "lr", "learning rate", 1.0, c.lr);
  num("min_lr", nullptr, "minimum learning rate", 1.0, c.min_lr);
  num("lr_warmup_steps", "warmup_steps", "warmup samples", unit, c.warmup_steps, args.lr_warmup_fraction >= 0);
  num("lr_decay_steps", "decay_steps", "decay samples", unit, c.decay_steps, true);
  text("lr_decay_style", "style", "decay style", c.style);
  if (j.contains("start_wd")) {
    num("start_wd", nullptr, "start weight decay", 1.0, c.start_wd);
    num("end_wd", nullptr, "end weight decay", 1.0, c.end_wd);
    num("wd_incr_steps", nullptr, "weight-decay samples", 1.0, c.wd_incr_steps, true);
    text("wd_incr_style", nullptr, "weight-decay incr style", c.wd_incr_style);
  }
  if (!follows.empty())
    log_info("--load ", where, ": the schedule's lengths follow this run's --train-iters / --train-samples: ", follows);
  if (differ.empty()) return;
  MPT_CHECK(args.use_checkpoint_opt_param_scheduler,
            str("--load ", where, ": the checkpoint's learning-rate / weight-decay schedule differs from the flags': ",
                differ),
            "give the flags it was trained with, --use-checkpoint-opt_param-scheduler to continue the checkpoint's "
            "schedule, or --override-opt_param-scheduler to go on with the flags' (as Megatron)");
  log_info("--use-checkpoint-opt_param-scheduler: the schedule of ", where, " (", differ, ")");
  lr = std::make_unique<LRSchedule>(c);
}

// Before a save: the weights and moments this rank holds are finite on every rank, or the
// run stops here (a checkpoint never holds NaN/Inf).
void Trainer::Impl::check_state_finite() {
  const OptimState s = states->local_state();
  int bad = 0;
  const std::vector<std::string> states = optimizer_state_names(s.optimizer);
  const std::string names[3] = {"master weights", states.size() > 0 ? "optimizer state " + states[0] : "",
                                states.size() > 1 ? "optimizer state " + states[1] : ""};
  const Tensor* ts[3] = {&s.master, &s.exp_avg, &s.exp_avg_sq};
  for (int k = 0; k < 3; ++k) {
    if (!ts[k]->defined() || ts[k]->numel() == 0) continue;
    const Tensor h = ts[k]->to(Device::cpu());
    const float* p = h.data<float>();
    for (int64_t i = 0, n = h.numel(); i < n; ++i)
      if (!std::isfinite(p[i])) {
        bad |= 1 << k;
        break;
      }
  }
  bad = groups->world_or(bad);
  if (!bad) return;
  std::string what;
  for (int k = 0; k < 3; ++k)
    if (bad & (1 << k)) what += (what.empty() ? "" : ", ") + std::string(names[k]);
  MPT_THROW(str("iteration ", st.iteration, ": the ", what, " hold NaN or Inf; not saving a checkpoint"),
            "the run diverged: lower --lr or --init-method-std, or resume from the last good checkpoint");
}

// --spike-rerun: back to the newest checkpoint of --save; the data goes on after the
// spike's batch (the consumed-sample counters are kept).
void Trainer::Impl::rerun_from_checkpoint() {
  if (async) async->wait();  // the newest checkpoint may still be being written
  const TrainState keep = st;
  LoadOptions lo;
  OptimState loaded;
  SaveInfo li;
  const auto [sb, se] = states->state_range();
  states->whole();  // the load writes every value
  const bool found = load_checkpoint(args.save, *model, loaded, sb, se, scaler, st, lo, &li, world_comm());
  MPT_CHECK(found, str("--spike-rerun: a spike at iteration ", keep.iteration, " but no checkpoint in --save ",
                       args.save, " to go back to"),
            "give --save-interval so a checkpoint exists before spikes can happen");
  states->install(loaded, true);
  log_warn("--spike-rerun: back to checkpoint ", li.dir, " (iteration ", st.iteration, "); the data goes on at sample ",
           keep.consumed_train_samples);
  st.consumed_train_samples = keep.consumed_train_samples;
  st.consumed_valid_samples = keep.consumed_valid_samples;
  st.skipped_iterations = keep.skipped_iterations;
  st.skipped_samples = keep.skipped_samples;
}

// final: the save at exit, waited for also with --async-save.
SaveInfo Trainer::Impl::save(bool final) {
  enter_phase("checkpoint-save", st.iteration);  // parallel/failure_record.h
  check_state_finite();  // a save reads only this rank's optimizer state
  const bool writer = states->sharded() || writes_replicas();  // dp replicas (no ZeRO) write nothing twice
  if (async) {
    SaveInfo s;
    s.dir = async->start(args.save, *model, states->local_state(), scaler, st, args.flags_json, lr_json(),
                         static_cast<int>(args.keep_last), writer);
    if (final) async->wait();
    return s;
  }
  // Every rank writes its own hyperslabs.
  const SaveInfo s = save_checkpoint(args.save, *model, states->local_state(), scaler, st, args.flags_json, lr_json(),
                                     static_cast<int>(args.keep_last), world_comm(), writer);
  log_info("saved checkpoint at iteration ", st.iteration, " to ", s.dir, " (", sci(s.bytes / 1e9, 3), " GB in ",
           sci(s.seconds, 3), " s, ", sci(s.bytes / 1e9 / std::max(s.seconds, 1e-9), 3), " GB/s)");
  if (args.ckpt_format == "torch") save_megatron_beside(args.save, megatron_save_options(args), world_comm());
  return s;
}

}  // namespace mpitron
