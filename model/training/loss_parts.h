// model/training/loss_parts.h — a loss reported as named parts (BERT: "lm loss" and "sop
// loss", summed into the trained loss; a classifier: its cross-entropy under "lm loss"),
// followed from the last stage's micro-batches to the log line and the evaluation.
//
// A step's parts are averaged like its loss (over the micro-batches and the data-parallel
// ranks); the log line shows each part's mean over the interval's counted steps, and the
// metrics add the trained loss as "loss".
#pragma once
#include <string>
#include <vector>

#include "model/training/model_kind.h"

namespace mpitron {

class LossParts {
 public:
  explicit LossParts(std::vector<std::string> names) : names_(std::move(names)) {}

  // A last-stage micro-batch's parts (names' order).
  void add(const std::vector<double>& parts);
  // Drops what add() summed (a step's or an evaluation's start).
  void clear() { sums_.clear(); }

  // ModelKind's step hooks, log fields and evaluation losses, for a kind whose loss has parts.
  void end_step(const HostGroups& groups, int64_t n_micro);
  void record_step(bool counted, TrainSummary& sum);
  void log_interval(double mean_loss, LogFields& losses);
  std::vector<NamedLoss> evaluation_losses(double count, const HostGroups& groups);

 private:
  // The sums since clear(), over the whole layout, divided by `count` micro-batches; clears.
  std::vector<double> take(const HostGroups& groups, double count);

  std::vector<std::string> names_;
  std::vector<double> sums_;      // since clear(), this rank (last stage: its micro-batches; else 0)
  std::vector<double> step_;      // the last end_step's averages
  std::vector<double> interval_;  // the counted steps' averages summed since the last log line
  int64_t counted_ = 0;           // those steps
};

}  // namespace mpitron
