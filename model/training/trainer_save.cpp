// The trainer's checkpoints (model/training/trainer_impl.h): a save (in the background with
// --async-save), the check that nothing non-finite is saved, and --spike-rerun's return to
// the newest checkpoint.
#include <cmath>

#include <nlohmann/json.hpp>

#include "core/log.h"
#include "model/training/trainer_impl.h"

namespace mpitron {

std::string Trainer::Impl::lr_json() const {
  const LRScheduleConfig& c = lr->config();
  return nlohmann::json{{"lr", c.lr}, {"min_lr", c.min_lr}, {"style", c.style}, {"warmup_steps", c.warmup_steps},
                        {"decay_steps", c.decay_steps}, {"unit", args.uses_samples() ? "samples" : "iterations"},
                        {"step", schedule_step()}}
      .dump();
}

// Before a save: the weights and moments this rank holds are finite on every rank, or the
// run stops here (a checkpoint never holds NaN/Inf).
void Trainer::Impl::check_state_finite() {
  const OptimState s = states->local_state();
  int bad = 0;
  const char* names[3] = {"master weights", "Adam first moments", "Adam second moments"};
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
  return s;
}

}  // namespace mpitron
