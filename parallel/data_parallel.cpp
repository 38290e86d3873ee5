#include "parallel/data_parallel.h"

#include <algorithm>
#include <numeric>

#include "core/log.h"
#include "tensor/elementwise.h"

namespace mpitron {

GradBuckets::GradBuckets(const Tensor& grads, std::vector<FlatParam> params, Communicator& dp, const DDPConfig& cfg)
    : grads_(grads), params_(std::move(params)), dp_(dp), cfg_(cfg), mode_(GradReduce::AllReduce) {
  build(cfg);
}

GradBuckets::GradBuckets(const Tensor& grads, std::vector<FlatParam> params, Communicator& dp, const DDPConfig& cfg,
                         const ShardLayout& shards, const Tensor& shard_grads, bool accumulate)
    : grads_(grads),
      params_(std::move(params)),
      dp_(dp),
      cfg_(cfg),
      mode_(GradReduce::ReduceScatter),
      shards_(shards),
      shard_grads_(shard_grads),
      accumulate_(accumulate) {
  MPT_CHECK(shards.ranks == dp.size() && shards.numel == grads.numel(),
            str("grad buckets: shard layout (", shards.numel, " elements over ", shards.ranks, " ranks) does not match ",
                grads.numel(), " gradients over ", dp.size(), " ranks"),
            "");
  MPT_CHECK(shard_grads.defined() && shard_grads.numel() == shards.size(dp.rank()) && shard_grads.dtype() == DType::F32,
            str("grad buckets: shard gradient tensor ", shard_grads.defined() ? shard_grads.describe() : "undefined",
                " must be f32 with ", shards.size(dp.rank()), " elements"),
            "");
  build(cfg);
}

GradBuckets::~GradBuckets() {
  // Outstanding reductions read and write our buffers: finish them first.
  if (!dp_.broken()) {
    try {
      wait_all();
    } catch (const std::exception& e) {
      log_error("grad buckets: ", e.what());
    }
  }
}

void GradBuckets::build(const DDPConfig& cfg) {
  MPT_CHECK(grads_.defined() && grads_.dtype() == DType::F32 && grads_.is_contiguous() && grads_.ndim() == 1,
            str("grad buckets need the flat (N) f32 gradient buffer, got ",
                grads_.defined() ? grads_.describe() : "undefined"),
            "");
  MPT_CHECK(cfg.bucket_size >= 0, str("--ddp-bucket-size ", cfg.bucket_size, " must be >= 0"), "0 means one bucket");
  // Parameters by decreasing offset: the order backward finishes them.
  std::vector<size_t> order(params_.size());
  std::iota(order.begin(), order.end(), size_t{0});
  // (Ties: empty parameters share an offset with a neighbour; later index first.)
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    return params_[a].offset != params_[b].offset ? params_[a].offset > params_[b].offset : a > b;
  });
  int64_t prev_begin = grads_.numel();
  for (size_t i : order) {
    const FlatParam& p = params_[i];
    MPT_CHECK(p.offset >= 0 && p.numel >= 0 && p.offset + p.numel <= prev_begin,
              str("grad buckets: parameter ", i, " [", p.offset, ", ", p.offset + p.numel,
                  ") overlaps another or lies outside the ", grads_.numel(), "-element buffer"),
              "");
    prev_begin = p.offset;
  }
  param_bucket_.assign(params_.size(), 0);
  const int64_t limit = cfg.bucket_size > 0 ? cfg.bucket_size : INT64_MAX;
  Bucket cur;
  bool open = false;
  for (size_t i : order) {
    const FlatParam& p = params_[i];
    if (!open) {
      cur = Bucket();
      cur.end = p.offset + p.numel;
      open = true;
    }
    if (cur.expert != p.expert && !cur.params.empty()) {  // the kinds reduce over different groups
      buckets_.push_back(std::move(cur));
      cur = Bucket();
      cur.end = p.offset + p.numel;
    }
    cur.expert = p.expert;
    cur.begin = p.offset;
    cur.params.push_back(i);
    param_bucket_[i] = buckets_.size();
    if (cur.end - cur.begin >= limit) {
      buckets_.push_back(std::move(cur));
      open = false;
    }
  }
  if (open) buckets_.push_back(std::move(cur));
  marked_.assign(params_.size(), 0);
}

void GradBuckets::set_expert_groups(const ExpertGroups& groups) {
  MPT_CHECK(!groups.active() || groups.edp, "grad buckets: expert parallelism needs the edp group", "");
  MPT_CHECK(mode_ == GradReduce::AllReduce || !groups.active() || &dp_ == groups.edp,
            "grad buckets: under ZeRO with expert parallelism the shards are over the edp group", "");
  experts_ = groups;
}

void GradBuckets::begin_backward(bool reduce) {
  for (const Bucket& b : buckets_)
    MPT_CHECK(!b.work, "grad buckets: begin_backward while reductions of the previous backward are outstanding",
              "call wait_all() first");
  reducing_ = reduce;
  next_launch_ = 0;
  std::fill(marked_.begin(), marked_.end(), 0);
  for (Bucket& b : buckets_) {
    b.launched = false;
    b.pending = 0;
    for (size_t i : b.params) b.pending += params_[i].numel > 0;
  }
  if (reducing_ && cfg_.overlap_grad_reduce) launch_ready();  // buckets of only empty params
}

void GradBuckets::mark_ready(size_t i) {
  if (!reducing_) return;
  MPT_CHECK(i < params_.size(), str("grad buckets: mark_ready(", i, ") of ", params_.size(), " parameters"), "");
  MPT_CHECK(!marked_[i], str("grad buckets: parameter ", i, " marked ready twice in one backward"),
            "mark a parameter once, when its gradient is final");
  marked_[i] = 1;
  if (params_[i].numel > 0) --buckets_[param_bucket_[i]].pending;
  // Drive MPI's progress of what is in flight (no-op cost for NCCL).
  for (size_t k = 0; k < next_launch_; ++k)
    if (buckets_[k].work) buckets_[k].work->test();
  if (cfg_.overlap_grad_reduce) launch_ready();
}

void GradBuckets::launch_ready() {
  while (next_launch_ < buckets_.size() && buckets_[next_launch_].pending == 0) launch(buckets_[next_launch_++]);
}

void GradBuckets::on_backward_done() {
  if (!reducing_) return;
  size_t unmarked = 0;
  for (char m : marked_) unmarked += !m;
  if (unmarked) log_debug("grad buckets: ", unmarked, " parameter(s) were never marked ready; reducing them as they are");
  while (next_launch_ < buckets_.size()) launch(buckets_[next_launch_++]);
  reducing_ = false;
}

void GradBuckets::launch(Bucket& b) {
  b.launched = true;
  const int64_t n = b.end - b.begin;
  if (n == 0) return;
  Tensor g = grads_.flat_range(b.begin, n);
  const int average = experts_.active() ? experts_.dp_size() : dp_.size();
  if (cfg_.average && average > 1) scale(g, 1.0f / static_cast<float>(average));
  if (mode_ == GradReduce::AllReduce) {
    Communicator& over = experts_.active() && b.expert ? *experts_.edp : dp_;
    if (over.size() > 1) b.work = over.all_reduce_async(g, ReduceOp::Sum);
    return;
  }
  // The bucket's pieces for ranks 0..size-1 lie back to back in [begin, end).
  const std::vector<int64_t> counts = shards_.pieces(b.begin, b.end);
  const int me = dp_.rank();
  const int64_t mine = counts[static_cast<size_t>(me)];
  Tensor dst = mine > 0 ? shard_grads_.flat_range(std::max(b.begin, shards_.begin(me)) - shards_.begin(me), mine)
                        : Tensor::empty({0}, DType::F32, grads_.device());
  if (accumulate_) {
    b.scratch = Tensor::empty({mine}, DType::F32, grads_.device());
    b.work = dp_.reduce_scatter_v_async(g, b.scratch, counts, ReduceOp::Sum);
  } else {
    b.work = dp_.reduce_scatter_v_async(g, dst, counts, ReduceOp::Sum);
  }
}

void GradBuckets::finish(Bucket& b) {
  if (!b.work) return;
  b.work->wait();
  b.work.reset();
  if (mode_ == GradReduce::ReduceScatter && experts_.active() && !b.expert) {
    // The dense piece holds this edp shard's sum; the ep ranks own the same elements (one
    // layout), so summing it over ep completes the sum over dp. Buckets finish in bucket order
    // on every rank.
    const int me = dp_.rank();
    const int64_t mine = shards_.pieces(b.begin, b.end)[static_cast<size_t>(me)];
    if (mine > 0) {
      const Tensor piece = accumulate_ ? b.scratch
                                       : shard_grads_.flat_range(std::max(b.begin, shards_.begin(me)) - shards_.begin(me), mine);
      experts_.ep->all_reduce(piece, ReduceOp::Sum);
    }
  }
  if (mode_ == GradReduce::ReduceScatter && accumulate_ && b.scratch.numel() > 0) {
    const int me = dp_.rank();
    Tensor dst = shard_grads_.flat_range(std::max(b.begin, shards_.begin(me)) - shards_.begin(me), b.scratch.numel());
    axpby(1.0f, b.scratch, 1.0f, dst);
  }
  b.scratch = Tensor();
}

void GradBuckets::wait_all() {
  for (Bucket& b : buckets_) finish(b);
}

}  // namespace mpitron
