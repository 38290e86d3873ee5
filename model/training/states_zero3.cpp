// ZeRO-3 model states (--zero-stage 3, DeepSpeed's stage 3, Megatron-FSDP's
// optim_grads_params): parameters, gradients and optimizer state sharded over the
// data-parallel group.
//
// The flat buffer [0, N) is sharded as ZeRO-1/2 shard it (ShardLayout: rank r owns
// [r·S, (r+1)·S), S = ceil(N / dp)), so checkpoints are the same hyperslabs and load
// under every other layout. A rank holds, persistently:
//   values shard (S) compute dtype, master / m / v (S) f32 (parallel/flat_optimizer.h),
//   gradient shard (S) f32 (the dp sums of the step so far).
// The ParamSet's flat buffers are released. Units:
//   - a block (its parameters are contiguous in the flat buffer): all-gathered from
//     the shards before its forward and again before its backward (or recompute),
//     the next block's gather started while one runs (prefetch); released when the
//     forward moves on and after its backward. Its gradients live in a unit buffer
//     (f32) from before its backward until they are reduce-scattered into the
//     owners' gradient shards (every micro-batch, as ZeRO-2), then freed once the
//     next block's reduction is launched (at most two blocks' gradients alive);
//   - the parameters outside blocks (embeddings, final norm, heads) and blocks of at
//     most stage3_param_persistence_threshold elements: persistent (whole values and
//     gradients; the gradients summed over the step's micro-batches and
//     reduce-scattered once, after the last, straight into the gradient shard; the
//     values all-gathered after each update).
// Outside steps whole() gathers the whole model into the ParamSet (evaluation,
// checkpoints, statistics), released again at the next zero_grad().
// Pipeline schedules: each stage shards its own parameters over its dp group; a block
// in backward for one micro-batch while another's B or deferred W is still due keeps its
// gradient buffer until the last of them (Unit::outstanding), then reduces the sum.
// Expert parallelism: the shards are over the expert-data-parallel group (the ep ranks hold
// different experts, each its own flat layout of one shape); the pieces of dense parameters
// in each reduced slice are then summed over ep (the experts' are complete), and the
// average is over ep × edp.
// Not built: sharding the persistent units, initialising without the whole model (the model is
// built and initialised whole, then sharded).
#include <algorithm>
#include <cstdio>

#include "model/training/model_states.h"
#include "model/training/optimizer.h"
#include "model/training/states_table.h"
#include "tensor/elementwise.h"

namespace mpitron {
namespace {

class Zero3States final : public ModelStates {
 public:
  Zero3States(const StatesConfig& cfg, GPT& model, Communicator& dp, Communicator* norm_group)
      : ps_(model.params()), dp_(dp), norm_(norm_group), cfg_(cfg), layout_(ps_.numel(), dp.size()) {
    sb_ = layout_.begin(dp.rank());
    const int64_t n = layout_.size(dp.rank());
    const Tensor& all = ps_.values();
    values_shard_ = all.flat_range(sb_, n).clone();
    adam_ = FlatOptimizer(values_shard_, sb_, flat_params(ps_), cfg.optim);
    grad_shard_ = Tensor::zeros({n}, DType::F32, all.device());
    build_units();
    if (cfg.experts.active()) dense_ = dense_runs(flat_params(ps_));
    for (Unit& u : units_)
      if (!u.block) {
        u.values = all.flat_range(u.begin, u.size()).clone();
        u.grads = Tensor::zeros({u.size()}, DType::F32, all.device());
      }
    ps_.release_buffers();
    for (size_t k = 0; k < units_.size(); ++k) point(k);
  }
  ~Zero3States() override {
    if (dp_.broken()) return;
    try {
      drain();
    } catch (const std::exception& e) {
      std::fprintf(stderr, "ZeRO-3: %s\n", e.what());
    }
  }

  std::string describe() const override {
    int64_t blocks = 0, kept = 0, largest = 0;
    for (const Unit& u : units_) {
      (u.block ? blocks : kept) += u.block ? 1 : u.size();
      if (u.block) largest = std::max(largest, u.size());
    }
    return str("ZeRO-3 (parameters, gradients and optimizer state sharded over ", dp_.size(), " ranks: ", blocks,
               " blocks gathered on demand, the largest ", largest, " elements; ", kept,
               " elements outside them kept whole", prefetch_ ? "; the next block prefetched" : "", ")");
  }

  void zero_grad() override {
    drain();
    if (whole_) {
      ps_.release_buffers();
      for (size_t k = 0; k < units_.size(); ++k) point(k);
      whole_ = false;
    }
    grad_shard_.zero();
    for (Unit& u : units_)
      if (!u.block) u.grads.zero();
  }
  void begin_backward(bool last) override { last_ = last; }
  // grads_final is not needed: a block's gradients are reduced whenever no backward of
  // it is outstanding (every micro-batch without a pipeline; under a schedule, when its
  // last started backward, or deferred W, has finished).
  void add_hooks(ForwardOptions& o, bool) override {
    o.params_needed = [this](size_t first, size_t) { forward_needs(unit_of_[first]); };
    o.params_needed_backward = [this](size_t first, size_t) { backward_needs(unit_of_[first]); };
    o.grads_ready = [this](size_t first, size_t) { reduce_unit(unit_of_[first]); };
  }
  void end_backward() override {
    for (size_t k = 0; k < units_.size(); ++k) {
      Unit& u = units_[k];
      if (u.block && u.grads.defined()) {  // a block whose backward reported nothing
        u.outstanding = 1;
        reduce_unit(k);
      }
      // The persistent units' gradients add up over the step's micro-batches and are
      // reduced once, after the last, straight into the gradient shard (nothing else
      // writes their slice of it).
      if (!u.block && last_) reduce(u, u.grads, /*direct=*/true);
    }
    finish_reductions();
  }
  StepResult step(float lr, float loss_scale, const std::function<bool(double)>& veto) override {
    finish_reductions();
    release_blocks();
    const StepResult r = adam_.reduced_step(grad_shard_, &dp_, norm_, loss_scale, lr, veto, cfg_.experts.dp_size());
    if (!r.skipped) refresh_persistent();
    return r;
  }
  void set_weight_decay(float wd) override { adam_.set_weight_decay(wd); }

  void add_forward_hooks(ForwardOptions& o) override {
    o.params_needed = [this](size_t first, size_t) { forward_needs(unit_of_[first]); };
  }
  void whole() override {
    if (whole_) return;
    drain();
    release_blocks();
    ps_.restore_values();
    dp_.all_gather_v(mine(0, ps_.numel()), ps_.values(), layout_.pieces(0, ps_.numel()));
    whole_ = true;
  }

  OptimState local_state() const override {
    return {adam_.master(), adam_.exp_avg(), adam_.exp_avg_sq(), sb_, adam_.steps_taken(), adam_.optimizer()};
  }
  std::pair<int64_t, int64_t> state_range() const override { return {sb_, sb_ + values_shard_.numel()}; }
  void install(const OptimState& s, bool with_optim) override {
    if (values_shard_.numel() > 0) {
      adam_.master().copy_from(s.master.to(adam_.master().device()));
      if (with_optim) {
        adam_.exp_avg().copy_from(s.exp_avg.to(adam_.exp_avg().device()));
        if (adam_.exp_avg_sq().defined()) adam_.exp_avg_sq().copy_from(s.exp_avg_sq.to(adam_.exp_avg_sq().device()));
      }
    }
    if (with_optim) adam_.set_steps_taken(s.steps);
    adam_.sync_values_from_master();
    release_blocks();
    if (whole_) {  // the load wrote the whole values; the shards hold them now
      ps_.release_buffers();
      whole_ = false;
    }
    for (size_t k = 0; k < units_.size(); ++k) point(k);
    refresh_persistent();
  }
  bool sharded() const override { return true; }
  int memory_stage() const override { return 3; }
  void account(RankShard& r) const override {
    const Zero3Footprint f = zero3_footprint(ps_, cfg_.zero3);
    r.zero3_block = f.largest_block;
    r.zero3_persistent = f.persistent;
    r.zero3_live = f.live_blocks;
  }
  Tensor grad_slice() const override { return grad_shard_; }

 private:
  struct Unit : StateUnit {      // block: gathered on demand (else persistent)
    Tensor values, grads;        // (size) compute dtype / f32, undefined when released
    WorkPtr gather;              // an all-gather into values still in flight
    int outstanding = 0;         // backwards started (B) whose gradients are not final yet (W)
  };
  struct Reduction {
    WorkPtr work;
    Tensor in, out;  // the unit's gradients (kept alive), this rank's piece
    int64_t at = 0;  // the piece's offset in the gradient shard
    bool direct = false;  // out is that slice of the shard itself
  };

  void build_units() {
    for (const StateUnit& su : zero3_units(ps_, cfg_.zero3.persistence_threshold)) {
      Unit u;
      static_cast<StateUnit&>(u) = su;
      for (size_t i = su.first; i < su.end; ++i) unit_of_.push_back(units_.size());
      units_.push_back(std::move(u));
    }
    const Zero3Footprint f = zero3_footprint(ps_, cfg_.zero3);
    MPT_CHECK(cfg_.zero3.max_live_parameters == 0 || cfg_.zero3.max_live_parameters >= f.largest_block,
              str("stage3_max_live_parameters ", cfg_.zero3.max_live_parameters, " is below the largest block's ",
                  f.largest_block, " parameters (this rank's part), which ZeRO-3 gathers whole"),
              str("raise it to at least ", f.largest_block, " (", 2 * f.largest_block, " keeps the prefetch)"));
    prefetch_ = f.live_blocks == 2;
  }
  // This rank's elements of [lo, hi) in the values shard (empty when it owns none).
  Tensor mine(int64_t lo, int64_t hi) const {
    const int64_t c = layout_.pieces(lo, hi)[static_cast<size_t>(dp_.rank())];
    return values_shard_.flat_range(c > 0 ? std::max(lo, sb_) - sb_ : 0, c);
  }
  void point(size_t k) {
    const Unit& u = units_[k];
    for (size_t i = u.first; i < u.end; ++i) {
      const ParamInfo& p = ps_.infos()[i];
      const int64_t at = p.offset - u.begin;
      ps_.point(i, u.values.defined() && !u.gather ? u.values.flat_range(at, p.numel()) : Tensor(),
                u.grads.defined() ? u.grads.flat_range(at, p.numel()) : Tensor());
    }
  }
  void start_gather(size_t k) {
    Unit& u = units_[k];
    if (u.values.defined()) return;
    u.values = Tensor::empty({u.size()}, values_shard_.dtype(), values_shard_.device());
    u.gather = dp_.all_gather_v_async(mine(u.begin, u.stop), u.values, layout_.pieces(u.begin, u.stop));
  }
  void gathered(size_t k) {
    start_gather(k);
    Unit& u = units_[k];
    if (u.gather) {
      u.gather->wait();
      u.gather.reset();
    }
    point(k);
  }
  void release(size_t k) {
    Unit& u = units_[k];
    if (!u.block) return;
    if (u.gather) {
      u.gather->wait();
      u.gather.reset();
    }
    u.values = Tensor();
    u.grads = Tensor();
    u.outstanding = 0;
    point(k);
  }
  void release_blocks() {
    for (size_t k = 0; k < units_.size(); ++k) release(k);
  }
  // The next / previous block in ParamSet (= layer) order, or units_.size().
  size_t neighbour(size_t k, int dir) const {
    for (size_t j = k + dir; j < units_.size(); j += dir)
      if (units_[j].block) return j;
    return units_.size();
  }
  void forward_needs(size_t k) {
    if (whole_ || !units_[k].block) return;
    for (size_t j = 0; j < units_.size(); ++j)  // the forward has moved on from every other block
      if (j != k && units_[j].block && !units_[j].gather && !units_[j].grads.defined()) release(j);
    gathered(k);
    if (prefetch_ && neighbour(k, 1) < units_.size()) start_gather(neighbour(k, 1));
  }
  void backward_needs(size_t k) {
    Unit& u = units_[k];
    if (!u.block) return;
    MPT_CHECK(!whole_, "ZeRO-3: a backward after whole() without zero_grad()", "this is a bug in the trainer");
    if (!u.grads.defined()) u.grads = Tensor::zeros({u.size()}, DType::F32, values_shard_.device());
    ++u.outstanding;
    gathered(k);
    if (prefetch_ && neighbour(k, -1) < units_.size()) start_gather(neighbour(k, -1));
  }
  // A backward of a block has finished (its deferred W included). When none is
  // outstanding (a pipeline schedule may have started the next micro-batch's B before
  // this one's W), the gradients summed so far go to their owners and are freed.
  void reduce_unit(size_t k) {
    Unit& u = units_[k];
    if (!u.block) return;
    MPT_CHECK(u.grads.defined() && u.outstanding > 0,
              str("ZeRO-3: the gradients of parameters ", u.first, "..", u.end,
                  " were reported final but the block's backward never asked for them"),
              "this is a bug in the model's hooks");
    if (--u.outstanding > 0) return;
    reduce(u, u.grads);
    release(k);
    finish_reductions(1);  // the previous block's reduction: at most two blocks' gradients alive
  }
  // direct: into the gradient shard itself (its slice holds nothing yet this step),
  // else into a piece added to it when the reduction completes.
  void reduce(const Unit& u, const Tensor& grads, bool direct = false) {
    const std::vector<int64_t> counts = layout_.pieces(u.begin, u.stop);
    const int64_t c = counts[static_cast<size_t>(dp_.rank())];
    Reduction r;
    r.in = grads;
    r.at = c > 0 ? std::max(u.begin, sb_) - sb_ : 0;
    r.direct = direct;
    r.out = direct ? grad_shard_.flat_range(r.at, c) : Tensor::empty({c}, DType::F32, grads.device());
    r.work = dp_.reduce_scatter_v_async(grads, r.out, counts, ReduceOp::Sum);
    pending_.push_back(std::move(r));
  }
  // Completes every reduction in flight but the newest `keep`, in launch order.
  void finish_reductions(size_t keep = 0) {
    const size_t n = pending_.size() > keep ? pending_.size() - keep : 0;
    for (size_t i = 0; i < n; ++i) {
      Reduction& r = pending_[i];
      r.work->wait();
      sum_dense_over_ep(r);
      if (!r.direct && r.out.numel() > 0) axpby(1.0f, r.out, 1.0f, grad_shard_.flat_range(r.at, r.out.numel()));
    }
    pending_.erase(pending_.begin(), pending_.begin() + static_cast<std::ptrdiff_t>(n));
  }
  // Expert parallelism: the dense elements of a reduced piece (flat [sb_ + at, … + numel)) summed over
  // ep, one all-reduce per dense run (the same runs on every ep rank: one layout).
  void sum_dense_over_ep(const Reduction& r) {
    if (!cfg_.experts.active() || r.out.numel() == 0) return;
    const int64_t lo = sb_ + r.at, hi = lo + r.out.numel();
    for (const auto& [b, e] : dense_) {
      const int64_t x = std::max(lo, b), y = std::min(hi, e);
      if (y > x) cfg_.experts.ep->all_reduce(r.out.flat_range(x - lo, y - x), ReduceOp::Sum);
    }
  }
  void drain() {
    finish_reductions();
    for (Unit& u : units_)
      if (u.gather) {
        u.gather->wait();
        u.gather.reset();
      }
  }
  // After an update or a load: the persistent units from the new shards.
  void refresh_persistent() {
    for (size_t k = 0; k < units_.size(); ++k) {
      Unit& u = units_[k];
      if (u.block) continue;
      dp_.all_gather_v(mine(u.begin, u.stop), u.values, layout_.pieces(u.begin, u.stop));
    }
  }

  ParamSet& ps_;
  Communicator& dp_;
  Communicator* norm_;
  StatesConfig cfg_;
  ShardLayout layout_;
  int64_t sb_ = 0;
  Tensor values_shard_, grad_shard_;
  FlatOptimizer adam_;
  std::vector<Unit> units_;
  std::vector<size_t> unit_of_;  // parameter → unit
  std::vector<Reduction> pending_;
  bool whole_ = false;
  bool prefetch_ = true;
  bool last_ = true;  // the step's last micro-batch is in backward
  std::vector<std::pair<int64_t, int64_t>> dense_;  // expert parallelism: flat ranges of dense parameters
};

}  // namespace

std::vector<StateUnit> zero3_units(const ParamSet& ps, int64_t persistence_threshold) {
  const std::vector<ParamInfo>& infos = ps.infos();
  auto key = [&](size_t i) {  // "layers.<l>." for a block's parameters, "" outside blocks
    const std::string& n = infos[i].name;
    return n.rfind("layers.", 0) == 0 ? n.substr(0, n.find('.', 7) + 1) : std::string();
  };
  std::vector<StateUnit> units;
  for (size_t i = 0; i < infos.size(); ++i) {
    const std::string k = key(i);
    if (units.empty() || key(units.back().first) != k) {
      StateUnit u;
      u.first = i, u.begin = infos[i].offset, u.block = !k.empty();
      units.push_back(u);
    }
    units.back().end = i + 1;
    units.back().stop = infos[i].offset + infos[i].numel();
  }
  for (StateUnit& u : units)
    if (u.block && u.size() <= persistence_threshold) u.block = false;
  return units;
}

Zero3Footprint zero3_footprint(const ParamSet& ps, const Zero3Config& cfg) {
  Zero3Footprint f;
  for (const StateUnit& u : zero3_units(ps, cfg.persistence_threshold)) {
    if (u.block) f.largest_block = std::max(f.largest_block, u.size());
    else f.persistent += u.size();
  }
  const bool room = cfg.max_live_parameters == 0 || cfg.max_live_parameters >= 2 * f.largest_block;
  f.live_blocks = cfg.prefetch && room ? 2 : 1;
  return f;
}

std::unique_ptr<ModelStates> make_zero3_states(const StatesConfig& cfg, GPT& model, Communicator* grad_comm,
                                               Communicator* norm_group) {
  MPT_CHECK(grad_comm, "--zero-stage 3 needs the data-parallel runtime (pretrain_gpt sets it up)", "");
  return std::make_unique<Zero3States>(cfg, model, *grad_comm, norm_group);
}

}  // namespace mpitron
