// Replicated model states (--zero-stage 0): every rank holds all values, gradients
// and the AdamW state; with dp > 1 the gradients are all-reduced (averaged) in
// buckets overlapped with the last micro-batch's backward (parallel/data_parallel.h).
#include "model/training/model_states.h"
#include "model/training/optimizer.h"
#include "model/training/states_table.h"

namespace mpitron {
namespace {

class ReplicatedStates final : public ModelStates {
 public:
  ReplicatedStates(const StatesConfig& cfg, GPT& model, Communicator* grad_comm, Communicator* norm_group)
      : params_(model.params()), opt_(model.params(), cfg.optim, norm_group) {
    if (grad_comm && grad_comm->size() > 1) {
      buckets_ = std::make_unique<GradBuckets>(params_.grads(), flat_params(params_), *grad_comm, cfg.ddp);
      buckets_->set_expert_groups(cfg.experts);  // the experts' buckets over edp
      experts_ = cfg.experts.active();
    }
  }
  std::string describe() const override {
    return buckets_ ? experts_ ? "replicated (gradients all-reduced over data parallelism, the experts' over "
                                 "expert data parallelism)"
                               : "replicated (gradients all-reduced over data parallelism)"
                    : "replicated";
  }
  void zero_grad() override { params_.zero_grad(); }
  // Earlier micro-batches only accumulate (Megatron's no_sync); the last one reduces.
  void begin_backward(bool last) override {
    if (buckets_) buckets_->begin_backward(last);
  }
  void add_hooks(ForwardOptions& o, bool grads_final) override {
    if (buckets_ && grads_final)
      o.grads_ready = [b = buckets_.get()](size_t first, size_t end) {
        for (size_t i = first; i < end; ++i) b->mark_ready(i);
      };
  }
  void end_backward() override {
    if (buckets_) buckets_->on_backward_done();
  }
  StepResult step(float lr, float loss_scale, const std::function<bool(double)>& veto) override {
    if (buckets_) buckets_->wait_all();
    return opt_.step(lr, loss_scale, veto);
  }
  void set_weight_decay(float wd) override { opt_.set_weight_decay(wd); }
  void add_forward_hooks(ForwardOptions&) override {}
  void whole() override {}
  OptimState local_state() const override {
    return {opt_.master(), opt_.exp_avg(), opt_.exp_avg_sq(), 0, opt_.steps_taken(), opt_.optimizer()};
  }
  std::pair<int64_t, int64_t> state_range() const override { return {0, params_.numel()}; }
  void install(const OptimState& s, bool with_optim) override {
    opt_.master().copy_from(s.master.to(opt_.master().device()));
    if (with_optim) {
      opt_.exp_avg().copy_from(s.exp_avg.to(opt_.exp_avg().device()));
      if (opt_.exp_avg_sq().defined()) opt_.exp_avg_sq().copy_from(s.exp_avg_sq.to(opt_.exp_avg_sq().device()));
      opt_.set_steps_taken(s.steps);
    }
    opt_.sync_values_from_master();
  }
  bool sharded() const override { return false; }
  int memory_stage() const override { return 0; }
  Tensor grad_slice() const override { return params_.grads(); }

 private:
  ParamSet& params_;
  ReplicatedOptimizer opt_;
  std::unique_ptr<GradBuckets> buckets_;
  bool experts_ = false;
};

}  // namespace

std::unique_ptr<ModelStates> make_replicated_states(const StatesConfig& cfg, GPT& model, Communicator* grad_comm,
                                                    Communicator* norm_group) {
  return std::make_unique<ReplicatedStates>(cfg, model, grad_comm, norm_group);
}

}  // namespace mpitron
