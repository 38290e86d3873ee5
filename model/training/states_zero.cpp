// ZeRO-1 / ZeRO-2 model states: the distributed optimizer of parallel/zero.h over
// the ParamSet's flat buffers (values whole on every rank, optimizer state and,
// for stage 2, gradients sharded over the data-parallel group).
#include "model/training/model_states.h"
#include "model/training/optimizer.h"
#include "model/training/states_table.h"
#include "parallel/zero.h"

namespace mpitron {
namespace {

class ZeroStates final : public ModelStates {
 public:
  ZeroStates(const StatesConfig& cfg, GPT& model, Communicator& grad_comm, Communicator* norm_group) {
    ZeroConfig zc;
    zc.stage = cfg.stage;
    zc.optim = cfg.optim;
    zc.ddp = cfg.ddp;
    zc.overlap_param_gather = cfg.overlap_param_gather;
    zero_ = std::make_unique<ZeroOptimizer>(model.params().values(), model.params().grads(), flat_params(model.params()),
                                            grad_comm, zc, norm_group);
    if (cfg.experts.active()) zero_->set_expert_groups(cfg.experts);
  }
  std::string describe() const override {
    return str("ZeRO-", zero_->config().stage, " (optimizer state", zero_->config().stage == 2 ? " and gradients" : "",
               " sharded over ", zero_->layout().ranks, " ranks",
               zero_->layout().bounds.empty() ? "" : " by whole tensors: Muon's layer-wise distributed optimizer", ")");
  }
  void zero_grad() override { zero_->zero_grad(); }
  void begin_backward(bool last) override { zero_->begin_micro_batch(last); }
  void add_hooks(ForwardOptions& o, bool grads_final) override {
    o.params_needed = zero_->params_hook();  // --overlap-param-gather
    if (grads_final)
      o.grads_ready = [z = zero_.get()](size_t first, size_t end) {
        for (size_t i = first; i < end; ++i) z->mark_ready(i);
      };
  }
  void end_backward() override { zero_->on_backward_done(); }
  StepResult step(float lr, float loss_scale, const std::function<bool(double)>& veto) override {
    return zero_->step(lr, loss_scale, veto);
  }
  void set_weight_decay(float wd) override { zero_->set_weight_decay(wd); }
  void add_forward_hooks(ForwardOptions& o) override { o.params_needed = zero_->params_hook(); }
  void whole() override { zero_->finish_param_gather(); }
  OptimState local_state() const override {
    return {zero_->master_shard(), zero_->exp_avg_shard(), zero_->exp_avg_sq_shard(), zero_->shard_begin(),
            zero_->steps_taken(), zero_->optimizer()};
  }
  std::pair<int64_t, int64_t> state_range() const override { return {zero_->shard_begin(), zero_->shard_end()}; }
  void install(const OptimState& s, bool with_optim) override {
    const int64_t n = zero_->shard_end() - zero_->shard_begin();
    auto take = [&](const Tensor& from, const Tensor& shard) {
      if (n > 0 && shard.defined()) shard.copy_from(from.to(shard.device()));
    };
    take(s.master, zero_->master_shard());
    if (with_optim) {
      take(s.exp_avg, zero_->exp_avg_shard());
      take(s.exp_avg_sq, zero_->exp_avg_sq_shard());
      zero_->set_steps_taken(s.steps);
    }
    zero_->sync_values_from_master();
  }
  bool sharded() const override { return true; }
  int memory_stage() const override { return zero_->config().stage; }
  void account(RankShard& r) const override {  // whole-tensor shards (dist_muon) are uneven
    if (!zero_->layout().bounds.empty()) r.optimizer_shard = zero_->shard_end() - zero_->shard_begin();
  }
  Tensor grad_slice() const override { return zero_->grad_shard(); }

 private:
  std::unique_ptr<ZeroOptimizer> zero_;
};

}  // namespace

std::unique_ptr<ModelStates> make_zero_states(const StatesConfig& cfg, GPT& model, Communicator* grad_comm,
                                              Communicator* norm_group) {
  MPT_CHECK(grad_comm, "--use-distributed-optimizer / --zero-stage need the data-parallel runtime (pretrain_gpt sets it up)",
            "");
  return std::make_unique<ZeroStates>(cfg, model, *grad_comm, norm_group);
}

}  // namespace mpitron
