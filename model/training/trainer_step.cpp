// One optimizer step of Trainer::run (model/training/trainer_impl.h): the micro-batches'
// forward and backward (or the pipeline schedule), the optimizer with the step guard's
// veto, the rules for non-finite and spiking steps, and what the step adds to the run.
#include <cmath>

#include "core/device_memory.h"
#include "core/log.h"
#include "model/training/trainer_impl.h"
#include "parallel/comm_stats.h"
#include "parallel/failure_record.h"
#include "parallel/fault_injection.h"

namespace mpitron {

namespace {
// fp16 overflows in a row at the minimum (or a static) loss scale before the run stops.
constexpr int64_t kMaxOverflowsAtMinimum = 10;
}  // namespace

ForwardOptions Trainer::Impl::training_options(int64_t micro_batch) const {
  ForwardOptions o;
  o.recompute = args.recompute_activations;
  o.recompute_num_layers = args.recompute_num_layers;
  // Each dp rank's masks differ (different samples), as Megatron's per-rank seeds.
  o.dropout_seed = dropout_seed(st.iteration, micro_batch * par.dp_size + par.dp_rank);
  kind->add_training_options(o);
  return o;
}

// The step's micro-batches, forward and backward; the sum of their losses on every
// stage (pipelined: summed over the pipeline group).
double Trainer::Impl::forward_backward(int64_t n_micro, float loss_seed) {
  if (pipelined()) return groups->pp_sum(pipeline_step(n_micro, loss_seed));
  double loss_sum = 0;
  for (int64_t k = 0; k < n_micro; ++k) {
    const bool last = k == n_micro - 1;
    const std::unique_ptr<MicroBatch> mb = micro_batch(0, micro_first(st.consumed_train_samples, k));
    Tape tape;
    ForwardOptions o = training_options(k);
    states->begin_backward(last);
    states->add_hooks(o, true);
    Var loss = kind->chunk_forward(tape, 0, *mb, Var(), o);
    loss_sum += loss.value().item();
    tape.backward(loss, loss_seed);
    states->end_backward();
  }
  return loss_sum;
}

// A step: one run of its computation, and with --rerun-mode a second one on the same data
// from the same state when the first was suspicious (model/training/rerun.h); then its rules.
Trainer::Impl::Step Trainer::Impl::step(TrainSummary& sum) {
  if (async) async->poll();  // a background save that failed stops the run here, on every rank
  const int64_t this_iter = st.iteration + 1;
  enter_phase("step", this_iter);  // the failure records' phase; MPITRON_FAULT's kill and freeze
  StepRun run;
  Step s = run_step(run, rerun->enabled());
  if (rerun->holds(run.verdict)) {
    StepRun again;
    s = run_step(again, false);
    rerun->settle(this_iter, run, again);  // not reproduced: a HostFault (validate_results)
    run = again;
  }
  s.rerun = judge(run.verdict, s, sum);
  return s;
}

// The micro-batches' forward and backward and the optimizer with the step guard's veto;
// `hold`: a suspicious step's update is held back (for its re-run).
Trainer::Impl::Step Trainer::Impl::run_step(StepRun& run, bool hold) {
  Step s;
  const int64_t this_iter = st.iteration + 1;
  s.gbs = rampup->global_batch(st.consumed_train_samples);
  const int64_t n_micro = s.gbs / (args.micro_batch_size * args.data_parallel_size);
  s.lr = lr->lr_at(static_cast<double>(schedule_step()));
  s.wd = lr->wd_at(static_cast<double>(schedule_step()));
  s.scale = scaler.scale();
  const StepCorruption fault = take_step_corruption(this_iter);  // MPITRON_FAULT nan / flip (tests)
  const float loss_seed = fault.seed(s.scale / static_cast<float>(n_micro));
  // Phase timers for --log-timers-to-tensorboard (the device is synchronised only then).
  auto phase_mark = [&] {
    if (args.log_timers_to_tensorboard || args.log_straggler) device_synchronize();
  };
  const double waited = comm_wait_seconds();  // --log-straggler: the compute is the time not spent waiting
  Timer phase;
  states->zero_grad();
  kind->begin_step(loss_seed);
  const double loss_sum = fault.loss(forward_backward(n_micro, loss_seed));
  kind->end_step(*groups, n_micro);
  fault_slow_down(this_iter, phase.seconds());  // MPITRON_FAULT slow (tests)
  // The loss and grad norm are judged between the norm and the update (the optimizer's
  // veto), and the verdict is OR-ed over every rank.
  StepVerdict verdict;
  s.loss = NAN;
  bool judged = false;
  auto veto = [&](double grad_norm) {
    s.loss = groups->dp_sum(groups->cp_mean(loss_sum)) / static_cast<double>(par.dp_size) / static_cast<double>(n_micro);
    verdict.bits = groups->world_or(guard->judge(s.loss, grad_norm).bits);
    judged = true;
    if (hold && rerun->holds(verdict)) return true;
    if (verdict.nonfinite()) return args.check_for_nan || args.fp16;
    return verdict.spike();
  };
  phase_mark();
  interval.fwd_bwd_s += phase.seconds();
  straggler->add_step(phase.seconds(), comm_wait_seconds() - waited);
  phase.reset();
  states->set_weight_decay(static_cast<float>(s.wd));
  s.result = states->step(static_cast<float>(s.lr), s.scale, veto);
  MPT_CHECK(judged, "the optimizer step did not judge the loss and grad norm", "this is a bug in the optimizer");
  phase_mark();
  interval.optim_s += phase.seconds();
  run.verdict = verdict;
  run.loss = s.loss;
  run.grad_norm = s.result.grad_norm;
  run.local_loss = loss_sum;
  run.local_seed = loss_seed;
  return s;
}

bool Trainer::Impl::judge(const StepVerdict& verdict, Step& s, TrainSummary& sum) {
  const TrainArgs& a = args;
  const StepResult& r = s.result;
  const int64_t this_iter = st.iteration + 1;
  if (verdict.nonfinite()) {
    const std::string what = verdict.describe(s.loss, r.grad_norm);
    if (a.fp16) {
      // An overflow: skipped, and the dynamic scale backs off. At the minimum
      // (or a static) scale scaling cannot cure it: after a few the run stops.
      consecutive_overflows_at_min = scaler.at_minimum() ? consecutive_overflows_at_min + 1 : 0;
      MPT_CHECK(consecutive_overflows_at_min < kMaxOverflowsAtMinimum,
                str("iteration ", this_iter, ": ", what, what.find(" and ") == std::string::npos ? " was" : " were",
                    " not finite in ", consecutive_overflows_at_min,
                    " steps in a row at the ", a.scaler.constant > 0 ? "static" : "minimum", " loss scale ",
                    scaler.scale(), "; the run diverged (nothing was applied or saved from these steps)"),
                "lower --lr or --init-method-std, or raise --min-loss-scale / --loss-scale");
    } else if (a.check_for_nan) {
      MPT_THROW(str("iteration ", this_iter, ": ", what, what.find(" and ") == std::string::npos ? " is" : " are",
                    " not finite; the update was not applied and the run "
                    "stops without saving"),
                "lower --lr or --init-method-std, check the data, or resume from the last checkpoint; "
                "--no-check-for-nan-in-loss-and-grad skips such steps instead");
    }
  } else {
    consecutive_overflows_at_min = 0;
  }
  if (verdict.spike()) {
    ++consecutive_spikes;
    ++sum.spike_skips;
    log_warn("iteration ", this_iter, ": skipped the update: ", verdict.describe(s.loss, r.grad_norm),
             " is a spike (z-score loss ", guard->loss.z(s.loss), ", grad norm ", guard->grad.z(r.grad_norm),
             " > ", a.spike_zscore, " over the last ", a.spike_window, " steps)");
    MPT_CHECK(consecutive_spikes < a.spike_max_skips,
              str("iteration ", this_iter, ": ", consecutive_spikes, " spikes in a row (--spike-max-consecutive-skips ",
                  a.spike_max_skips, "): the loss has left its window for good"),
              "raise --skip-spike-zscore or --spike-window, or lower --lr");
    if (a.spike_rerun) {
      st.consumed_train_samples += s.gbs;  // the replay goes on with the batch after the spike's
      rerun_from_checkpoint();
      ++sum.spike_reruns;
      return true;
    }
  } else if (!r.skipped) {
    consecutive_spikes = 0;
    guard->accept(s.loss, r.grad_norm);
  }
  if (!verdict.spike()) scaler.update(r.skipped);
  return false;
}

void Trainer::Impl::record(const Step& s, TrainSummary& sum) {
  const StepResult& r = s.result;
  const bool nan_loss = !std::isfinite(s.loss);
  st.iteration += 1;
  ++sum.steps_run;
  st.consumed_train_samples += s.gbs;
  if (r.skipped) {
    st.skipped_iterations += 1;
    st.skipped_samples += s.gbs;
  }
  interval.skipped += r.skipped;
  interval.nan += nan_loss;
  const bool counted = !r.skipped && !nan_loss;
  if (counted) {
    interval.loss += s.loss;
    ++interval.loss_n;
  }
  ++interval.iters;
  interval.tokens += s.gbs * args.model.seq_length;
  sum.losses.push_back(s.loss);
  sum.grad_norms.push_back(r.grad_norm);
  sum.lrs.push_back(s.lr);
  sum.weight_decays.push_back(s.wd);
  kind->record_step(counted, sum);
}

}  // namespace mpitron
