#include "model/training/model_states.h"

#include "model/training/states_table.h"
#include "parallel/communicator.h"

namespace mpitron {

std::unique_ptr<ModelStates> make_model_states(const StatesConfig& cfg, GPT& model, Communicator* grad_comm,
                                               Communicator* norm_group) {
  // --zero-stage → implementation. One data-parallel rank has nothing to shard: every
  // stage is then the replicated one (Megatron accepts --use-distributed-optimizer at dp = 1).
  static const MakeStates table[] = {make_replicated_states, make_zero_states, make_zero_states, make_zero3_states};
  MPT_CHECK(cfg.stage >= 0 && cfg.stage <= 3, str("--zero-stage ", cfg.stage, " is not 0, 1, 2 or 3"), "");
  const bool one_rank = !grad_comm || grad_comm->size() == 1;
  if (cfg.experts.active() && cfg.stage > 0) {
    // ZeRO shards over the expert-data-parallel group (the ep ranks hold different experts);
    // with one edp rank there is nothing to shard: replicated, the experts' gradients unreduced.
    return table[cfg.experts.edp->size() > 1 ? cfg.stage : 0](cfg, model,
                                                              cfg.experts.edp->size() > 1 ? cfg.experts.edp : grad_comm,
                                                              norm_group);
  }
  return table[one_rank ? 0 : cfg.stage](cfg, model, grad_comm, norm_group);
}

void ModelStates::sum_grad_over(const Var& p, size_t, Communicator& group) {
  group.all_reduce(p.grad().view({p.grad().numel()}), ReduceOp::Sum);
}

}  // namespace mpitron
