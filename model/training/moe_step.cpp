#include "model/training/moe_step.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>

#include "model/training/arguments.h"
#include "model/training/host_groups.h"
#include "model/training/train_summary.h"

namespace mpitron {

MoeStep::MoeStep(const TrainArgs& args, GPT& core)
    : core_(core), cfg_(args.model), run_(args.moe), ep_size_(args.expert_model_parallel_size),
      dispatcher_(args.moe_token_dispatcher_type) {
  run_.stats = &stats_;
}

std::string MoeStep::describe() const {
  const GPTConfig& c = cfg_;
  const MoeRun& m = run_;
  int64_t moe_layers = 0;
  for (int64_t l = 0; l < c.num_layers; ++l) moe_layers += c.is_moe_layer(l);
  return str("Mixture of Experts: ", moe_layers, " of ", c.num_layers, " layers, ", c.num_experts, " experts of width ",
             c.moe_ffn(), ", top-", c.moe_router_topk, " ", to_string(c.moe_router_score_function),
             c.moe_router_pre_softmax ? " (pre-softmax)" : "",
             c.moe_shared_expert_intermediate_size > 0 ? str(", shared experts of width ", c.moe_shared_expert_intermediate_size) : "",
             "; ", c.num_active_parameters(), " active of ", c.num_parameters(), " parameters per token; ",
             m.capacity_factor > 0 ? str("capacity factor ", m.capacity_factor, " (drop by ",
                                         m.drop_by_probs ? "probs" : "position", ")")
                                   : std::string("dropless"),
             m.aux_loss_coeff > 0 ? str(", aux loss ", m.aux_loss_coeff) : "",
             m.z_loss_coeff > 0 ? str(", z-loss ", m.z_loss_coeff) : "",
             m.expert_bias_update_rate > 0 ? str(", expert bias (update rate ", m.expert_bias_update_rate, ")") : "",
             ep_size_ > 1 ? str("; expert parallelism ", ep_size_, ": ", c.num_experts / ep_size_,
                                " experts per rank, ", dispatcher_, " dispatcher")
                          : std::string());
}

void MoeStep::begin_step(float loss_seed) {
  run_.loss_scale = loss_seed;  // the auxiliary losses' gradients, as the loss's
  stats_.clear();
}

void MoeStep::end_step(const HostGroups& groups, int64_t n_micro) {
  // [aux, z, dropped, tokens per expert …]: one collective over the pipeline, one over dp.
  std::vector<double> v = {stats_.aux_loss, stats_.z_loss, static_cast<double>(stats_.dropped)};
  stats_.tokens_per_expert.resize(static_cast<size_t>(cfg_.num_experts), 0);
  for (const int64_t t : stats_.tokens_per_expert) v.push_back(static_cast<double>(t));
  v = groups.pp_sum(std::move(v));
  // Aux-loss-free balancing: this rank's MoE layers' counts (the same layers on every dp rank)
  // join the sum over dp; the biases move before the next forward.
  const std::vector<int64_t> bias_layers = core_.expert_bias_layers();
  const size_t head = v.size(), E = static_cast<size_t>(cfg_.num_experts);
  for (const int64_t l : bias_layers) {
    std::vector<int64_t>& t = stats_.layer_tokens[l];
    t.resize(E, 0);
    for (const int64_t x : t) v.push_back(static_cast<double>(x));
  }
  v = groups.dp_sum(std::move(v));
  if (!bias_layers.empty()) {
    std::map<int64_t, std::vector<double>> counts;
    for (size_t i = 0; i < bias_layers.size(); ++i)
      counts[bias_layers[i]].assign(v.begin() + static_cast<std::ptrdiff_t>(head + i * E),
                                    v.begin() + static_cast<std::ptrdiff_t>(head + (i + 1) * E));
    core_.update_expert_bias(counts, run_.expert_bias_update_rate);
  }
  v.resize(head);
  stats_.clear();
  const double n = static_cast<double>(groups.dp_size() * n_micro);
  step_.aux = v[0] / n;
  step_.z = v[1] / n;
  step_.dropped = v[2];
  step_.tokens.assign(v.begin() + 3, v.end());
}

void MoeStep::record_step(bool counted, TrainSummary& sum) {
  if (counted) {
    interval_.aux += step_.aux;
    interval_.z += step_.z;
    ++counted_;
  }
  interval_.dropped += step_.dropped;
  interval_.tokens.resize(step_.tokens.size(), 0.0);
  for (size_t e = 0; e < step_.tokens.size(); ++e) interval_.tokens[e] += step_.tokens[e];
  sum.moe_aux_losses.push_back(step_.aux);
}

void MoeStep::log_interval(LogFields& extra) {
  // The auxiliary losses averaged like the loss, and how evenly the experts were loaded (the
  // busiest expert's choices over the mean) with the choices dropped.
  const double n = static_cast<double>(counted_);
  const double aux = counted_ ? interval_.aux / n : NAN, z = counted_ ? interval_.z / n : NAN;
  double most = 0, all = 0;
  for (const double t : interval_.tokens) most = std::max(most, t), all += t;
  const double load = all > 0 ? most / (all / static_cast<double>(interval_.tokens.size())) : NAN;
  char buf[160];
  if (run_.aux_loss_coeff > 0) {
    std::snprintf(buf, sizeof buf, " load_balancing_loss: %.6E |", aux);
    extra.text += buf;
    extra.scalars.push_back({"load_balancing_loss", "load_balancing_loss", aux});
    extra.metrics["load_balancing_loss"] = aux;
  }
  if (run_.z_loss_coeff > 0) {
    std::snprintf(buf, sizeof buf, " z_loss: %.6E |", z);
    extra.text += buf;
    extra.scalars.push_back({"z_loss", "z_loss", z});
    extra.metrics["z_loss"] = z;
  }
  std::snprintf(buf, sizeof buf, " expert load max/mean: %.3f | dropped tokens: %.0f |", load, interval_.dropped);
  extra.text += buf;
  extra.metrics["moe_tokens_per_expert"] = interval_.tokens;
  extra.metrics["moe_dropped_tokens"] = interval_.dropped;
  extra.metrics["moe_load_max_over_mean"] = load;
  interval_ = Totals();
  counted_ = 0;
}

}  // namespace mpitron
