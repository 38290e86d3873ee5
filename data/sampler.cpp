// data/sampler.cpp — Megatron's pretraining sampler with consumed samples.
#include "data/sampler.h"

#include "core/error.h"

namespace mpitron::data {

PretrainingSampler::PretrainingSampler(int64_t total_samples, int64_t consumed_samples, int64_t micro_batch_size,
                                       int64_t global_batch_size, int dp_rank, int dp_size)
    : total_(total_samples),
      consumed_(consumed_samples),
      micro_batch_(micro_batch_size),
      global_batch_(global_batch_size),
      dp_rank_(dp_rank),
      dp_size_(dp_size) {
  MPT_CHECK(total_ > 0, str("no samples to draw from (total_samples=", total_, ")"), "");
  MPT_CHECK(micro_batch_ > 0 && dp_size_ > 0 && dp_rank_ >= 0 && dp_rank_ < dp_size_,
            str("bad sampler layout: micro_batch=", micro_batch_, " dp_rank=", dp_rank_, " dp_size=", dp_size_), "");
  MPT_CHECK(global_batch_ > 0 && global_batch_ % (micro_batch_ * dp_size_) == 0,
            str("--global-batch-size ", global_batch_, " is not a multiple of --micro-batch-size ", micro_batch_,
                " × data-parallel size ", dp_size_),
            "pick a global batch that micro batch × DP divides");
  MPT_CHECK(consumed_ >= 0 && consumed_ < total_,
            str("consumed_samples ", consumed_, " is not below the dataset's ", total_, " samples"),
            "the run has seen all its data: raise --train-samples/--train-iters or add data");
}

bool PretrainingSampler::next_micro_batch(std::vector<int64_t>& indices) {
  const int64_t chunk = micro_batch_ * dp_size_;
  indices.clear();
  if (consumed_ + chunk > total_) return false;
  const int64_t start = consumed_ + dp_rank_ * micro_batch_;
  for (int64_t i = 0; i < micro_batch_; ++i) indices.push_back(start + i);
  consumed_ += chunk;
  return true;
}

std::vector<std::vector<int64_t>> PretrainingSampler::next_step() {
  std::vector<std::vector<int64_t>> out;
  if (consumed_ + global_batch_ > total_) return out;
  for (int64_t m = 0; m < micro_batches_per_step(); ++m) {
    out.emplace_back();
    next_micro_batch(out.back());
  }
  return out;
}

}  // namespace mpitron::data
