// Evaluation during and after training (model/training/trainer_impl.h): Megatron's mean
// validation loss over --eval-iters global batches, or, for a source with evaluation sets
// (finetune's --valid-data files), accuracy over every sample of each set; the reports'
// lines, TensorBoard scalars and metrics; and the interval's evaluations and saves.
#include <algorithm>
#include <cmath>

#include "core/log.h"
#include "model/training/sample_source.h"
#include "model/training/trainer_impl.h"
#include "parallel/failure_record.h"

namespace mpitron {

// One evaluation micro-batch through the model (the pipeline's stages, or the one chunk):
// its loss on the last stage, 0 elsewhere.
double Trainer::Impl::eval_forward(Tape& tape, const MicroBatch& mb) {
  if (pipelined()) return pipeline_eval(mb);
  ForwardOptions o;
  o.train = false;
  states->add_forward_hooks(o);  // (--overlap-param-gather, ZeRO-3) parameters as they are read
  return kind->chunk_forward(tape, 0, mb, Var(), o).value().item();
}

Trainer::Impl::Evaluation Trainer::Impl::evaluate(int split, int64_t iters, int64_t* consumed) {
  enter_phase("evaluation", st.iteration);  // parallel/failure_record.h
  Tape tape;
  NoGradGuard no_grad(tape);
  double sum = 0;
  int64_t count = 0;
  const int64_t gbs = args.global_batch_size, mbs = args.micro_batch_size;
  kind->begin_evaluation();
  for (int64_t it = 0; it < iters; ++it) {
    for (int64_t k = 0; k < gbs / (mbs * par.dp_size); ++k) {
      sum += eval_forward(tape, *micro_batch(split, micro_first(*consumed, k)));
      ++count;
    }
    *consumed += gbs;
  }
  const double n = groups->dp_sum(static_cast<double>(count));
  Evaluation ev;
  ev.loss = n > 0 ? groups->dp_sum(groups->cp_mean(groups->pp_sum(sum))) / n : 0.0;
  ev.losses = kind->evaluation_losses(ev.loss, n, *groups);
  return ev;
}

// Each reported loss's value and PPL, as Megatron's evaluate_and_print_results prints every loss key.
void Trainer::Impl::report_eval(const std::string& what, const Evaluation& ev) {
  const double ppl = std::exp(std::min(ev.loss, 20.0));
  std::string line = str(" ", what, " |");
  for (const NamedLoss& l : ev.losses)
    line += str(" ", l.name, " value: ", sci(l.value), " | ", l.name, " PPL: ", sci(std::exp(std::min(l.value, 20.0))), " |");
  log_info("-----------------------------------------------------------------------------------------------");
  log_info(line);
  log_info("-----------------------------------------------------------------------------------------------");
  for (const NamedLoss& l : ev.losses) {
    tb_scalar("lm-loss-validation", l.name + " validation", l.value);
    tb_scalar("lm-loss-validation", l.name + " validation ppl", std::exp(std::min(l.value, 20.0)));
  }
  if (metrics) metrics->log_json(st.iteration, {{"valid_loss", ev.loss}, {"valid_ppl", ppl}});
}

// Accuracy over every sample of each set, the sets' micro-batches dealt to the dp ranks in
// turn (every rank runs every round: ZeRO-3 gathers are collective; samples past a set's
// end are run but not counted), with Megatron's tasks/eval_utils.py lines. Returns
// correct / total over all sets.
double Trainer::Impl::evaluate_accuracy(int64_t epoch) {
  const Accuracy* counts = kind->accuracy();
  MPT_CHECK(counts, "the data source has evaluation sets (evaluation by accuracy), but the model does not classify",
            "this is a bug in the caller of Trainer");
  Tape tape;
  NoGradGuard no_grad(tape);
  const int64_t mbs = args.micro_batch_size, dp = par.dp_size;
  double all_correct = 0, all_total = 0;
  for (const SampleSource::EvalSet& set : data->eval_sets()) {
    Timer t;
    kind->begin_evaluation();
    for (int64_t round = 0; round * mbs * dp < set.count; ++round) {
      const int64_t at = (round * dp + par.dp_rank) * mbs;
      eval_forward(tape, *kind->micro_batch(*data, 1, set.first + at, mbs, std::clamp<int64_t>(set.count - at, 0, mbs)));
    }
    const double correct = groups->dp_sum(groups->pp_sum(static_cast<double>(counts->correct)));
    const double total = groups->dp_sum(groups->pp_sum(static_cast<double>(counts->total)));
    all_correct += correct, all_total += total;
    char line[512];
    std::snprintf(line, sizeof line,
                  " > |epoch: %lld| metrics for %s: correct / total = %.0f / %.0f = %.4f %%, elapsed time (sec): %.3f",
                  static_cast<long long>(epoch), set.name.c_str(), correct, total,
                  total > 0 ? 100.0 * correct / total : 0.0, t.seconds());
    log_info(line);
  }
  const double acc = all_total > 0 ? all_correct / all_total : 0.0;
  char line[256];
  std::snprintf(line, sizeof line, " >> |epoch: %lld| overall: correct / total = %.0f / %.0f = %.4f %%",
                static_cast<long long>(epoch), all_correct, all_total, 100.0 * acc);
  log_info(line);
  tb_scalar("lm-loss-validation", "accuracy validation", acc);
  if (metrics) metrics->log_json(st.iteration, {{"epoch", epoch}, {"valid_accuracy", acc}});
  return acc;
}

// After a step: the interval's evaluation, the interval's save, and an epoch's end
// (evaluated and saved), each restarting the log interval's timer.
void Trainer::Impl::evaluate_and_save_if_due(TrainSummary& sum) {
  const TrainArgs& a = args;
  const bool by_accuracy = !data->eval_sets().empty();  // finetune: evaluation is accuracy
  // The epoch this iteration belongs to (finetune; 0 without epochs).
  const int64_t epoch = a.epoch_iters > 0 ? (st.iteration - 1) / a.epoch_iters : 0;
  if (by_accuracy && a.eval_interval > 0 && st.iteration % a.eval_interval == 0) {
    evaluate_accuracy(epoch);
    interval.timer.reset();
  } else if (!by_accuracy && a.eval_iters > 0 && st.iteration % a.eval_interval == 0 && st.iteration != total_iters) {
    report_eval(str("validation loss at iteration ", st.iteration), evaluate(1, a.eval_iters, &st.consumed_valid_samples));
    interval.timer.reset();
  }
  if (a.save_interval > 0 && st.iteration % a.save_interval == 0) {
    sum.checkpoint_dir = save().dir;
    saved_at = st.iteration;
    interval.timer.reset();
  }
  if (a.epoch_iters > 0 && st.iteration % a.epoch_iters == 0) {
    if (by_accuracy) sum.accuracies.push_back(evaluate_accuracy(epoch));
    if (!a.save.empty() && saved_at != st.iteration) {
      sum.checkpoint_dir = save().dir;
      saved_at = st.iteration;
    }
    interval.timer.reset();
  }
}

}  // namespace mpitron
