// ZeRO-3 model states (--zero-stage 3, DeepSpeed's stage 3, Megatron-FSDP's
// optim_grads_params): parameters, gradients and optimizer state sharded over the
// data-parallel group.
//
// The flat buffer [0, N) is sharded as ZeRO-1/2 shard it (ShardLayout: rank r owns
// [r·S, (r+1)·S), S = ceil(N / dp)), so checkpoints are the same hyperslabs and load
// under every other layout. A rank holds, persistently:
//   values shard (S) compute dtype, master / m / v (S) f32 (parallel/flat_optimizer.h),
//   gradient shard (S) f32 (the dp sums of the step so far).
// The ParamSet's flat buffers are released. Units (zero3_units):
//   - a block (its parameters are contiguous in the flat buffer): all-gathered from
//     the shards before its forward and again before its backward (or recompute),
//     the next block's gather started while one runs (prefetch); released when the
//     forward moves on and after its backward. Its gradients live in a unit buffer
//     (f32) from before its backward until they are reduce-scattered into the
//     owners' gradient shards (every micro-batch, as ZeRO-2), then freed once the
//     next block's reduction is launched (at most two blocks' gradients alive);
//   - the word and position embeddings and the untied output matrix (each alone; the
//     model calls the hooks at every use, GPT::hooked_outside_params; under TP each rank's
//     vocab-parallel piece): all-gathered just before the lookup and before the output
//     layer's forward, released when a block's forward starts. In backward each use
//     brackets its contribution: params_needed_backward gathers the output matrix for the
//     input gradient, grads_needed frees the values and allocates the f32 gradient,
//     grads_added reduce-scatters it into the owners' shards (straight into the shard the
//     first time in a step, else through a piece added to it), waits and frees it. So a
//     rank holds one such table at a time, its values or its gradient, never both. The
//     tied embedding's uses (the head, MTP's, then the lookup; on the first and last
//     pipeline stage or both chunks of a V schedule) each reduce their own contribution,
//     and so does every micro-batch: the sum lands in the shard. Pipeline copies: the
//     dp-reduced shards are summed over the embedding group (sum_grad_over);
//   - the other parameters outside blocks (final norm, MTP's, BERT's and T5's), and
//     blocks and tables of at most stage3_param_persistence_threshold elements:
//     persistent (whole values and gradients; the gradients summed over the step's
//     micro-batches and reduce-scattered once, after the last, straight into the
//     gradient shard; the values all-gathered after each update).
// Outside steps whole() gathers the whole model into the ParamSet (evaluation,
// checkpoints, statistics), released again at the next zero_grad().
// Pipeline schedules: each stage shards its own parameters over its dp group; a block
// in backward for one micro-batch while another's B or deferred W is still due keeps its
// gradient buffer until the last of them (Unit::outstanding), then reduces the sum.
// Expert parallelism: the shards are over the expert-data-parallel group (the ep ranks hold
// different experts, each its own flat layout of one shape); the pieces of dense parameters
// in each reduced slice are then summed over ep (the experts' are complete), and the
// average is over ep × edp.
// Not built: sharding BERT's and T5's embeddings and heads (their forwards do not hook each use),
// initialising without the whole model (the model is built and initialised whole, then sharded).
#include <algorithm>
#include <cstdio>

#include "model/training/model_states.h"
#include "model/training/optimizer.h"
#include "parallel/communicator.h"
#include "model/training/states_table.h"
#include "tensor/elementwise.h"

namespace mpitron {
namespace {

class Zero3States final : public ModelStates {
 public:
  Zero3States(const StatesConfig& cfg, GPT& model, Communicator& dp, Communicator* norm_group)
      : ps_(model.params()), hooked_(model.hooked_outside_params()), dp_(dp), norm_(norm_group), cfg_(cfg),
        layout_(ps_.numel(), dp.size()) {
    sb_ = layout_.begin(dp.rank());
    const int64_t n = layout_.size(dp.rank());
    const Tensor& all = ps_.values();
    values_shard_ = all.flat_range(sb_, n).clone();
    adam_ = FlatOptimizer(values_shard_, sb_, flat_params(ps_), cfg.optim);
    grad_shard_ = Tensor::zeros({n}, DType::F32, all.device());
    build_units();
    if (cfg.experts.active()) dense_ = dense_runs(flat_params(ps_));
    for (Unit& u : units_)
      if (!u.sharded) {
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
    int64_t blocks = 0, tables = 0, kept = 0, largest = 0, largest_table = 0;
    for (const Unit& u : units_) {
      if (!u.sharded) kept += u.size();
      else if (u.outside) ++tables, largest_table = std::max(largest_table, u.size());
      else ++blocks, largest = std::max(largest, u.size());
    }
    return str("ZeRO-3 (parameters, gradients and optimizer state sharded over ", dp_.size(), " ranks: ", blocks,
               " blocks gathered on demand, the largest ", largest, " elements; ", tables,
               " embedding/output tables gathered at each use, the largest ", largest_table, " elements; ", kept,
               " elements kept whole", prefetch_ ? "; the next block prefetched" : "", ")");
  }

  void zero_grad() override {
    drain();
    if (whole_) {
      ps_.release_buffers();
      for (size_t k = 0; k < units_.size(); ++k) point(k);
      whole_ = false;
    }
    grad_shard_.zero();
    for (Unit& u : units_) {
      if (!u.sharded) u.grads.zero();
      u.reduced = false;
    }
  }
  void begin_backward(bool last) override { last_ = last; }
  // grads_final is not needed: a block's gradients are reduced whenever no backward of
  // it is outstanding (every micro-batch without a pipeline; under a schedule, when its
  // last started backward, or deferred W, has finished).
  void add_hooks(ForwardOptions& o, bool) override {
    o.params_needed = [this](size_t first, size_t end) { forward_needs(first, end); };
    o.params_needed_backward = [this](size_t first, size_t end) { each(first, end, &Zero3States::backward_needs); };
    o.grads_ready = [this](size_t first, size_t end) { each(first, end, &Zero3States::reduce_unit); };
    o.grads_needed = [this](size_t first, size_t end) { each(first, end, &Zero3States::grads_needed); };
    o.grads_added = [this](size_t first, size_t end) { each(first, end, &Zero3States::reduce_unit); };
  }
  void end_backward() override {
    for (size_t k = 0; k < units_.size(); ++k) {
      Unit& u = units_[k];
      if (u.sharded && u.grads.defined()) {  // a unit whose backward reported nothing
        u.outstanding = 1;
        reduce_unit(k);
      }
      // The persistent units' gradients add up over the step's micro-batches and are
      // reduced once, after the last, straight into the gradient shard (nothing else
      // writes their slice of it).
      if (!u.sharded && last_) reduce(u, u.grads, /*direct=*/true);
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
    o.params_needed = [this](size_t first, size_t end) { forward_needs(first, end); };
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
    const Zero3Footprint f = zero3_footprint(ps_, cfg_.zero3, hooked_);
    r.zero3_block = f.largest_block;
    r.zero3_outside = f.largest_outside;
    r.zero3_persistent = f.persistent;
    r.zero3_live = f.live_blocks;
  }
  Tensor grad_slice() const override { return grad_shard_; }
  // A sharded table's dp sum is in the owners' shards: gathered whole (f32), summed over the
  // group, this rank's piece written back (both stages hold the same sum, each in its own layout).
  void sum_grad_over(const Var& p, size_t i, Communicator& group) override {
    const Unit& u = units_[unit_of_[i]];
    if (!u.sharded) return ModelStates::sum_grad_over(p, i, group);
    MPT_CHECK(u.first == i && u.end == i + 1, "ZeRO-3: a sharded table is a unit of its own", "this is a bug");
    finish_reductions();
    const std::vector<int64_t> counts = layout_.pieces(u.begin, u.stop);
    const int64_t c = counts[static_cast<size_t>(dp_.rank())];
    const int64_t at = c > 0 ? std::max(u.begin, sb_) - sb_ : 0;
    const Tensor mine = grad_shard_.flat_range(at, c);
    const Tensor whole = Tensor::empty({u.size()}, DType::F32, grad_shard_.device());
    dp_.all_gather_v(mine, whole, counts);
    group.all_reduce(whole, ReduceOp::Sum);
    if (c > 0) mine.copy_from(whole.flat_range(sb_ + at - u.begin, c));
  }

 private:
  struct Unit : StateUnit {      // sharded: gathered on demand (else persistent)
    Tensor values, grads;        // (size) compute dtype / f32, undefined when released
    WorkPtr gather;              // an all-gather into values still in flight
    int outstanding = 0;         // backwards started (B) whose gradients are not final yet (W)
    bool reduced = false;        // a reduction of this step has written its slice of the shard
  };
  struct Reduction {
    WorkPtr work;
    Tensor in, out;  // the unit's gradients (kept alive), this rank's piece
    int64_t at = 0;  // the piece's offset in the gradient shard
    bool direct = false;  // out is that slice of the shard itself
  };

  void build_units() {
    for (const StateUnit& su : zero3_units(ps_, cfg_.zero3.persistence_threshold, hooked_)) {
      Unit u;
      static_cast<StateUnit&>(u) = su;
      for (size_t i = su.first; i < su.end; ++i) unit_of_.push_back(units_.size());
      units_.push_back(std::move(u));
    }
    const Zero3Footprint f = zero3_footprint(ps_, cfg_.zero3, hooked_);
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
    if (!u.sharded) return;
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
  bool is_block(size_t k) const { return units_[k].sharded && !units_[k].outside; }
  // f on every unit of parameters [first, end).
  void each(size_t first, size_t end, void (Zero3States::*f)(size_t)) {
    if (first >= end) return;
    for (size_t k = unit_of_[first]; k <= unit_of_[end - 1]; ++k) (this->*f)(k);
  }
  // The next / previous block in ParamSet (= layer) order, or units_.size().
  size_t neighbour(size_t k, int dir) const {
    for (size_t j = k + dir; j < units_.size(); j += dir)
      if (is_block(j)) return j;
    return units_.size();
  }
  // The forward reads parameters [first, end): a block's, or tables' (the lookup's, the output layer's).
  void forward_needs(size_t first, size_t end) {
    if (whole_ || first >= end) return;
    const size_t a = unit_of_[first], b = unit_of_[end - 1];
    bool sharded = false, block = false;
    for (size_t k = a; k <= b; ++k) sharded |= units_[k].sharded, block |= is_block(k);
    if (!sharded) return;
    // The forward has moved on from every other block, and at a block from the tables.
    for (size_t j = 0; j < units_.size(); ++j)
      if ((j < a || j > b) && units_[j].sharded && (block || !units_[j].outside) && !units_[j].gather &&
          !units_[j].grads.defined())
        release(j);
    for (size_t k = a; k <= b; ++k)
      if (units_[k].sharded) gathered(k);
    if (block && prefetch_ && neighbour(b, 1) < units_.size()) start_gather(neighbour(b, 1));
  }
  void backward_needs(size_t k) {
    Unit& u = units_[k];
    if (!u.sharded) return;
    MPT_CHECK(!whole_, "ZeRO-3: a backward after whole() without zero_grad()", "this is a bug in the trainer");
    if (u.outside) return gathered(k);  // a table: its values only (grads_needed comes next)
    if (!u.grads.defined()) u.grads = Tensor::zeros({u.size()}, DType::F32, values_shard_.device());
    ++u.outstanding;
    gathered(k);
    if (prefetch_ && neighbour(k, -1) < units_.size()) start_gather(neighbour(k, -1));
  }
  // A backward is about to add to a table's gradient and reads its values no more: the
  // values freed before the (f32, whole) gradient is allocated.
  void grads_needed(size_t k) {
    Unit& u = units_[k];
    if (!u.sharded) return;
    MPT_CHECK(!whole_, "ZeRO-3: a backward after whole() without zero_grad()", "this is a bug in the trainer");
    if (u.gather) {
      u.gather->wait();
      u.gather.reset();
    }
    u.values = Tensor();
    point(k);  // the Var's view let go before the gradient is allocated
    if (!u.grads.defined()) u.grads = Tensor::zeros({u.size()}, DType::F32, values_shard_.device());
    ++u.outstanding;
    point(k);
  }
  // A backward of a block has finished (its deferred W included). When none is
  // outstanding (a pipeline schedule may have started the next micro-batch's B before
  // this one's W), the gradients summed so far go to their owners and are freed.
  void reduce_unit(size_t k) {
    Unit& u = units_[k];
    if (!u.sharded) return;
    MPT_CHECK(u.grads.defined() && u.outstanding > 0,
              str("ZeRO-3: the gradients of parameters ", u.first, "..", u.end,
                  " were reported final but the block's backward never asked for them"),
              "this is a bug in the model's hooks");
    if (--u.outstanding > 0) return;
    // A table (one whole at a time): straight into its slice of the shard when nothing of this
    // step has written it, and completed now, so its gradient is freed before the next use.
    const bool direct = u.outside && !u.reduced;
    u.reduced = true;
    reduce(u, u.grads, direct);
    release(k);
    finish_reductions(u.outside ? 0 : 1);  // else the previous block's: at most two blocks' gradients alive
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
      if (u.sharded) continue;
      dp_.all_gather_v(mine(u.begin, u.stop), u.values, layout_.pieces(u.begin, u.stop));
    }
  }

  ParamSet& ps_;
  std::vector<size_t> hooked_;  // GPT::hooked_outside_params
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

std::vector<StateUnit> zero3_units(const ParamSet& ps, int64_t persistence_threshold,
                                   const std::vector<size_t>& hooked) {
  const std::vector<ParamInfo>& infos = ps.infos();
  // "layers.<l>." for a block's parameters, "#<i>" for hooked parameter i, "" for the others outside blocks.
  auto key = [&](size_t i) {
    const std::string& n = infos[i].name;
    if (n.rfind("layers.", 0) == 0) return n.substr(0, n.find('.', 7) + 1);
    return std::find(hooked.begin(), hooked.end(), i) != hooked.end() ? "#" + std::to_string(i) : std::string();
  };
  std::vector<StateUnit> units;
  std::string last;
  for (size_t i = 0; i < infos.size(); ++i) {
    const std::string k = key(i);
    if (units.empty() || last != k || k[0] == '#') {
      StateUnit u;
      u.first = i, u.begin = infos[i].offset, u.outside = k.rfind("layers.", 0) != 0;
      u.sharded = !k.empty();
      units.push_back(u);
    }
    last = k;
    units.back().end = i + 1;
    units.back().stop = infos[i].offset + infos[i].numel();
  }
  for (StateUnit& u : units)
    if (u.sharded && u.size() <= persistence_threshold) u.sharded = false;
  return units;
}

Zero3Footprint zero3_footprint(const ParamSet& ps, const Zero3Config& cfg, const std::vector<size_t>& hooked) {
  Zero3Footprint f;
  for (const StateUnit& u : zero3_units(ps, cfg.persistence_threshold, hooked)) {
    if (!u.sharded) f.persistent += u.size();
    else if (u.outside) f.largest_outside = std::max(f.largest_outside, u.size());
    else f.largest_block = std::max(f.largest_block, u.size());
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
