#include "parallel/zero.h"

#include <algorithm>

#include <cmath>
#include <cstdio>

#include "tensor/adamw.h"
#include "tensor/elementwise.h"
#include "tensor/norm.h"

namespace mpitron {

ZeroOptimizer::ZeroOptimizer(const Tensor& values, const Tensor& grads, std::vector<FlatParam> params,
                             Communicator& dp, const ZeroConfig& cfg, Communicator* norm_group)
    : values_(values), grads_(grads), params_(std::move(params)), dp_(dp), norm_group_(norm_group), cfg_(cfg) {
  MPT_CHECK(cfg.stage == 1 || cfg.stage == 2, str("--zero-stage ", cfg.stage, " is not 1 or 2"),
            "use 1 (--use-distributed-optimizer) or 2; without ZeRO use ReplicatedOptimizer with GradBuckets");
  MPT_CHECK(values.defined() && grads.defined() && values.numel() == grads.numel() && values.ndim() == 1 &&
                values.is_contiguous() && grads.dtype() == DType::F32,
            str("ZeRO optimizer needs flat (N) values and (N) f32 grads, got ",
                values.defined() ? values.describe() : "undefined", " and ",
                grads.defined() ? grads.describe() : "undefined"),
            "");
  // Matrix-wise rules (dist_muon) own whole tensors: Megatron's layer-wise distributed optimizer.
  layout_ = make_update_rule(cfg.optim)->matrix_wise() ? ShardLayout::whole_tensors(params_, values.numel(), dp.size())
                                                        : ShardLayout(values.numel(), dp.size());
  const int64_t b = shard_begin(), n = shard_end() - shard_begin();
  adam_ = FlatOptimizer(values.flat_range(b, n), b, params_, cfg.optim);
  // Both stages reduce in place into the grad buffer's own slice (no extra memory).
  shard_grads_ = grads.flat_range(b, n);
  // Sums, not averages: with stage 2 the owned slice already holds the reduced
  // sum of earlier micro-batches, which a 1/dp pre-scale would shrink again.
  // The 1/dp is folded into AdamW's grad_scale (and the norm) instead.
  DDPConfig ddp = cfg.ddp;
  ddp.average = false;
  buckets_ = std::make_unique<GradBuckets>(grads, params_, dp, ddp, layout_, shard_grads_, false);
  for (size_t k = buckets_->num_buckets(); k-- > 0;)  // buckets run from the end of the buffer: reverse
    gathers_.push_back({buckets_->bucket(k).begin, buckets_->bucket(k).end, nullptr});
  for (size_t k = 0; k < gathers_.size(); ++k) gather_order_.push_back(k);
}

ZeroOptimizer::~ZeroOptimizer() {
  if (dp_.broken()) return;
  try {
    finish_param_gather();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "ZeRO optimizer: %s\n", e.what());
  }
}

void ZeroOptimizer::zero_grad() {
  buckets_->wait_all();
  reduced_ = false;
  grads_.zero();
}

void ZeroOptimizer::begin_micro_batch(bool last) {
  // Expert parallelism, stage 2: the ep ranks own the same dense elements and each holds their
  // running sum, which the sum over ep would count ep times; between micro-batches it lives on
  // ep rank 0 only (the last sum over ep gives it back to every rank for the update).
  if (reduced_ && experts_.active() && experts_.ep->rank() > 0) {
    const int64_t b = shard_begin(), e = shard_end();
    for (const auto& [first, stop] : dense_) {
      const int64_t lo = std::max(b, first), hi = std::min(e, stop);
      if (hi > lo) grads_.flat_range(lo, hi - lo).zero();
    }
  }
  buckets_->begin_backward(cfg_.stage == 2 || last);
}

void ZeroOptimizer::on_backward_done() {
  reduced_ = reduced_ || buckets_->reducing();
  buckets_->on_backward_done();
  if (cfg_.stage == 2) {
    buckets_->wait_all();
    // Keep the owned slice (the running sum); the rest was this micro-batch's scratch.
    const int64_t b = shard_begin(), e = shard_end();
    if (b > 0) grads_.flat_range(0, b).zero();
    if (e < grads_.numel()) grads_.flat_range(e, grads_.numel() - e).zero();
  }
}

void ZeroOptimizer::all_gather_values() {
  finish_param_gather();
  const int64_t b = shard_begin(), n = shard_end() - shard_begin();
  dp_.all_gather_v(values_.flat_range(b, n), values_, layout_.pieces(0, values_.numel()));
}

void ZeroOptimizer::start_param_gather() {
  // This forward's order first (what it needed, in order), then any bucket it did not need.
  if (!needed_order_.empty()) {
    std::vector<char> seen(gathers_.size(), 0);
    gather_order_.clear();
    for (size_t k : needed_order_) gather_order_.push_back(k), seen[k] = 1;
    for (size_t k = 0; k < gathers_.size(); ++k)
      if (!seen[k]) gather_order_.push_back(k);
    needed_order_.clear();
  }
  const int me = dp_.rank();
  for (size_t k : gather_order_) {
    Gather& g = gathers_[k];
    if (g.end <= g.begin) continue;
    // Each rank's piece of [begin, end): its shard's intersection, back to back in rank order.
    const std::vector<int64_t> c = layout_.pieces(g.begin, g.end);
    const int64_t mine_at = std::max(g.begin, shard_begin());
    Tensor out = values_.flat_range(g.begin, g.end - g.begin);
    Tensor in = values_.flat_range(std::min(mine_at, g.end), c[static_cast<size_t>(me)]);
    g.work = dp_.all_gather_v_async(in, out, c);
  }
}

void ZeroOptimizer::params_needed(size_t first, size_t end) {
  if (first >= end || end > params_.size()) return;
  const int64_t lo = params_[first].offset, hi = params_[end - 1].offset + params_[end - 1].numel;
  for (size_t k = 0; k < gathers_.size(); ++k) {
    Gather& g = gathers_[k];
    if (!g.work || g.end <= lo || hi <= g.begin) continue;
    needed_order_.push_back(k);
    g.work->wait();
    g.work.reset();
  }
}

std::function<void(size_t, size_t)> ZeroOptimizer::params_hook() {
  if (!cfg_.overlap_param_gather) return {};
  return [this](size_t first, size_t end) { params_needed(first, end); };
}

void ZeroOptimizer::finish_param_gather() {
  for (Gather& g : gathers_)
    if (g.work) {
      g.work->wait();
      g.work.reset();
    }
}

StepResult ZeroOptimizer::step(float lr, float loss_scale, const std::function<bool(double)>& veto) {
  finish_param_gather();  // the update writes the values the last gathers read and wrote
  if (!reduced_) {
    buckets_->begin_backward(true);
    buckets_->on_backward_done();
  }
  buckets_->wait_all();
  reduced_ = false;
  // Global norm: every element is owned by exactly one dp rank; the shard holds dp sums.
  const StepResult r = adam_.reduced_step(shard_grads_, &dp_, norm_group_, loss_scale, lr, veto, experts_.dp_size());
  if (r.skipped) return r;
  if (cfg_.overlap_param_gather) start_param_gather();
  else all_gather_values();
  return r;
}

void ZeroOptimizer::sync_values_from_master() {
  adam_.sync_values_from_master();
  all_gather_values();
}

}  // namespace mpitron
