#include "model/training/loss_parts.h"

#include <algorithm>
#include <cmath>

#include "model/training/host_groups.h"
#include "model/training/train_summary.h"

namespace mpitron {

void LossParts::add(const std::vector<double>& parts) {
  if (sums_.size() < parts.size()) sums_.resize(parts.size(), 0.0);
  for (size_t i = 0; i < parts.size(); ++i) sums_[i] += parts[i];
}

std::vector<double> LossParts::take(const HostGroups& groups, double count) {
  std::vector<double> v = sums_;
  v.resize(names_.size(), 0.0);
  sums_.clear();
  return groups.last_stage_mean(std::move(v), std::max(count, 1.0));
}

void LossParts::end_step(const HostGroups& groups, int64_t n_micro) {
  step_ = take(groups, static_cast<double>(groups.dp_size() * n_micro));
}

void LossParts::record_step(bool counted, TrainSummary& sum) {
  if (counted) {
    interval_.resize(step_.size(), 0.0);
    for (size_t i = 0; i < step_.size(); ++i) interval_[i] += step_[i];
    ++counted_;
  }
  sum.lm_losses.push_back(step_[0]);
  sum.sop_losses.push_back(step_.size() > 1 ? step_[1] : 0.0);
}

void LossParts::log_interval(double mean_loss, LogFields& losses) {
  std::vector<NamedLoss> named;
  for (size_t i = 0; i < names_.size(); ++i)
    named.push_back({names_[i], i < interval_.size() && counted_ ? interval_[i] / static_cast<double>(counted_) : NAN});
  add_losses(losses, named);
  losses.metrics["loss"] = mean_loss;  // the trained sum beside its parts
  interval_.clear();
  counted_ = 0;
}

std::vector<NamedLoss> LossParts::evaluation_losses(double count, const HostGroups& groups) {
  const std::vector<double> v = take(groups, count);
  std::vector<NamedLoss> named;
  for (size_t i = 0; i < names_.size(); ++i) named.push_back({names_[i], v[i]});
  return named;
}

}  // namespace mpitron
