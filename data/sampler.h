// data/sampler.h — which samples each data-parallel rank reads, Megatron's
// MegatronPretrainingSampler: samples are consumed in order from
// consumed_samples; every micro-batch step takes the next micro_batch × dp
// samples and rank r reads [r × micro_batch, (r+1) × micro_batch) of them. A
// run resumed with the checkpoint's consumed_samples continues with exactly
// the next sample.
#pragma once
#include <cstdint>
#include <vector>

namespace mpitron::data {

class PretrainingSampler {
 public:
  // total_samples: size of the dataset; global_batch must be a multiple of
  // micro_batch × dp_size (the rest is gradient accumulation).
  PretrainingSampler(int64_t total_samples, int64_t consumed_samples, int64_t micro_batch_size,
                     int64_t global_batch_size, int dp_rank, int dp_size);

  // This rank's next micro-batch (micro_batch_size sample indices); false when
  // the data cannot fill a whole micro-batch across all ranks (drop_last).
  bool next_micro_batch(std::vector<int64_t>& indices);
  // This rank's micro-batches of the next global batch (optimizer step);
  // empty when the data is exhausted. Advances consumed_samples by global_batch.
  std::vector<std::vector<int64_t>> next_step();

  int64_t consumed_samples() const { return consumed_; }
  int64_t micro_batches_per_step() const { return global_batch_ / (micro_batch_ * dp_size_); }

 private:
  int64_t total_, consumed_, micro_batch_, global_batch_;
  int dp_rank_, dp_size_;
};

}  // namespace mpitron::data
