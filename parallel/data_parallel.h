// parallel/data_parallel.h — data-parallel gradient reduction in contiguous
// buckets, overlapped with backward (Megatron's DistributedDataParallel).
//
// The gradients of all parameters live in ONE flat f32 buffer (model/params.h).
// Buckets are contiguous slices of it, formed by walking the parameters in
// REVERSE order (the order backward completes them) and closing a bucket once
// it holds >= bucket_size elements. Each bucket is reduced by one async
// collective as soon as every parameter in it was marked ready, while backward
// goes on with earlier layers:
//   - AllReduce:     in place on the bucket (plain DDP), averaged over dp;
//   - ReduceScatter: to the owner of each element under a contiguous ShardLayout
//                    (ZeRO), written (or added) into a shard-sized tensor.
// Buckets launch strictly in bucket order on every rank (a bucket that becomes
// ready before its predecessor waits for it), so all ranks issue the same
// collectives in the same order even if readiness order differed.
//
// The logic knows nothing of autograd: the model calls mark_ready(i) when
// parameter i's gradient is final for this backward, on_backward_done() after
// the tape finished, and wait_all() before the optimizer reads gradients.
//
// Averaging: each bucket is multiplied by 1/dp BEFORE the collective (as
// Megatron's gradient_scaling_factor), so sums of large scaled gradients do
// not overflow. With the MPI backend, nonblocking collectives progress only
// inside MPI calls: mark_ready() therefore test()s launched buckets.
#pragma once
#include <algorithm>
#include <cstdint>
#include <utility>
#include <vector>

#include "parallel/communicator.h"

namespace mpitron {

// One parameter's slice of the flat buffers, in ParamSet order.
struct FlatParam {
  int64_t offset = 0;         // elements into the flat value/grad buffers
  int64_t numel = 0;
  bool weight_decay = true;   // false for biases and layernorm parameters
  bool in_norm = true;        // counted in the global grad norm (false: a model-parallel duplicate)
  bool expert = false;        // a routed expert's (expert parallelism: see ExpertGroups)
  // Matrix-wise optimizers (--optimizer muon, parallel/muon_rule.cpp): a 2-D weight they orthogonalise,
  // (rows, cols) its local shape; 0 for embeddings, output layers and 1-D parameters (the scalar optimizer's).
  int64_t rows = 0, cols = 0;
  std::vector<int64_t> row_parts;  // local rows of the blocks a fused weight holds (qkv: q | k | v); empty: one
  int tp_axis = -1;                // the axis tensor parallelism cuts (0 rows, 1 columns; -1 none) ...
  int tp_size = 1;                 // ... over this many ranks (the global shape: muon's scale, duplicated mode)
};

// Expert parallelism (parallel/expert_parallel.h): the experts' parameters differ between the
// ep ranks of a dp group, so their gradients (FlatParam::expert) are summed over the
// expert-data-parallel group only, in buckets of their own. All-reduce mode: the dense buckets
// over dp, the experts' over edp. Reduce-scatter mode (ZeRO): everything is sharded over edp
// (the `dp` given is edp), the dense pieces then summed over ep as each bucket finishes.
// Averaging stays 1/dp (the whole data-parallel size, dp_size()) for both kinds: the
// experts' gradients already hold every ep rank's tokens.
struct ExpertGroups {
  Communicator* ep = nullptr;   // the ep group (null: no expert parallelism)
  Communicator* edp = nullptr;  // the expert-data-parallel group
  bool active() const { return ep && ep->size() > 1; }
  int dp_size() const { return active() ? ep->size() * edp->size() : 0; }  // 0: no expert parallelism
};

// The flat ranges [begin, end) of the parameters that are not experts' (FlatParam::expert),
// adjacent ones merged: what expert parallelism sums over the ep group.
inline std::vector<std::pair<int64_t, int64_t>> dense_runs(const std::vector<FlatParam>& params) {
  std::vector<std::pair<int64_t, int64_t>> runs;
  for (const FlatParam& p : params) {
    if (p.expert || p.numel == 0) continue;
    if (!runs.empty() && runs.back().second == p.offset) runs.back().second += p.numel;
    else runs.emplace_back(p.offset, p.offset + p.numel);
  }
  return runs;
}

// Contiguous shards of a flat buffer of `numel` elements over `ranks` ranks:
// rank r owns [begin(r), end(r)), each of shard = ceil(numel / ranks) elements
// except the last ones (padding: the last rank's shard is short, or empty).
// Or, by whole tensors (whole_tensors(): Megatron's layer-wise distributed optimizer, dist_muon), rank
// r owns the parameters whose offsets fall in [r·numel/ranks, (r+1)·numel/ranks) — never part of one.
struct ShardLayout {
  int64_t numel = 0;
  int ranks = 1;
  std::vector<int64_t> bounds;  // ranks + 1 shard boundaries; empty: the even split above
  ShardLayout() = default;
  ShardLayout(int64_t n, int r) : numel(n), ranks(r) {}
  static ShardLayout whole_tensors(const std::vector<FlatParam>& params, int64_t n, int r) {
    ShardLayout l(n, r);
    l.bounds.assign(static_cast<size_t>(r) + 1, n);
    l.bounds[0] = 0;
    int next = 1;  // the next boundary to place: at the first parameter starting at or after its even share
    for (const FlatParam& p : params)
      while (next < r && p.offset >= (n * next + r - 1) / r) l.bounds[static_cast<size_t>(next++)] = p.offset;
    return l;
  }
  int64_t shard() const { return ranks > 0 ? (numel + ranks - 1) / ranks : 0; }  // padded shard size (even split)
  int64_t begin(int r) const {
    return bounds.empty() ? std::min<int64_t>(numel, r * shard()) : bounds[static_cast<size_t>(r)];
  }
  int64_t end(int r) const {
    return bounds.empty() ? std::min<int64_t>(numel, (r + 1) * shard()) : bounds[static_cast<size_t>(r) + 1];
  }
  int64_t size(int r) const { return end(r) - begin(r); }
  // The elements of [lo, hi) each rank owns, in rank order (they lie back to back in
  // [lo, hi)): the counts of a reduce-scatter or all-gather of that range.
  std::vector<int64_t> pieces(int64_t lo, int64_t hi) const {
    std::vector<int64_t> c(static_cast<size_t>(ranks));
    for (int r = 0; r < ranks; ++r) c[static_cast<size_t>(r)] = std::max<int64_t>(0, std::min(hi, end(r)) - std::max(lo, begin(r)));
    return c;
  }
};

enum class GradReduce { AllReduce, ReduceScatter };

struct DDPConfig {
  int64_t bucket_size = 40000000;    // --ddp-bucket-size: elements per bucket (Megatron: 40M); 0 = one bucket
  bool overlap_grad_reduce = true;   // --overlap-grad-reduce: launch as soon as ready (else all at on_backward_done)
  bool average = true;               // divide by the dp size (Megatron averages gradients over dp)
};

class GradBuckets {
 public:
  struct Bucket {
    int64_t begin = 0, end = 0;   // element range of the flat grad buffer
    std::vector<size_t> params;   // parameter indices in it
    int pending = 0;              // params not yet marked ready in this backward
    bool launched = false;
    WorkPtr work;
    Tensor scratch;               // ReduceScatter with accumulate: the received piece
    bool expert = false;          // holds experts' parameters only (ExpertGroups)
  };

  // All-reduce mode. grads: (N) f32 flat gradient buffer (host or device, as
  // `dp` expects); params: every parameter's slice, in ParamSet order.
  GradBuckets(const Tensor& grads, std::vector<FlatParam> params, Communicator& dp, const DDPConfig& cfg);
  // Reduce-scatter mode (ZeRO): every element goes to its owner under `shards`
  // (shards.ranks == dp.size()); this rank's piece of a bucket lands in
  // shard_grads (shards.size(rank) f32) at (element - shards.begin(rank)),
  // overwritten, or added when `accumulate`.
  GradBuckets(const Tensor& grads, std::vector<FlatParam> params, Communicator& dp, const DDPConfig& cfg,
              const ShardLayout& shards, const Tensor& shard_grads, bool accumulate);
  // Either mode with expert parallelism (before the first backward): all-reduce mode reduces
  // the experts' buckets over groups.edp; reduce-scatter mode (dp = groups.edp) sums the dense
  // pieces over groups.ep. Buckets never mix the two kinds.
  void set_expert_groups(const ExpertGroups& groups);
  ~GradBuckets();
  GradBuckets(const GradBuckets&) = delete;
  GradBuckets& operator=(const GradBuckets&) = delete;

  // Start of a backward. reduce = false (a micro-batch whose gradients are only
  // accumulated locally, Megatron's no_sync): mark_ready/on_backward_done do nothing.
  void begin_backward(bool reduce = true);
  // Parameter i's gradient is final for this backward. Launches its bucket
  // (and any ready successors) when it completes. Marking twice throws.
  void mark_ready(size_t param_index);
  // Backward finished: launches every bucket not launched yet (parameters never
  // marked, e.g. unused in this step, are reduced as they are), in bucket order.
  void on_backward_done();
  // Wait for every launched bucket; afterwards the gradients are reduced.
  void wait_all();

  size_t num_buckets() const { return buckets_.size(); }
  const Bucket& bucket(size_t i) const { return buckets_[i]; }
  GradReduce mode() const { return mode_; }
  // Inside a backward that reduces (between begin_backward(true) and on_backward_done()).
  bool reducing() const { return reducing_; }
  // Which bucket holds parameter i.
  size_t bucket_of(size_t param_index) const { return param_bucket_[param_index]; }

 private:
  void build(const DDPConfig& cfg);
  void launch_ready();
  void launch(Bucket& b);
  void finish(Bucket& b);

  Tensor grads_;
  std::vector<FlatParam> params_;
  Communicator& dp_;
  ExpertGroups experts_;
  DDPConfig cfg_;
  GradReduce mode_;
  ShardLayout shards_;
  Tensor shard_grads_;
  bool accumulate_ = false;
  std::vector<Bucket> buckets_;
  std::vector<size_t> param_bucket_;
  std::vector<char> marked_;
  size_t next_launch_ = 0;
  bool reducing_ = false;  // inside a backward that reduces
};

}  // namespace mpitron
