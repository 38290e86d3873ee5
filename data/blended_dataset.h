// data/blended_dataset.h — `--data-path 0.3 a 0.7 b`: several GPT datasets
// mixed by weight, as megatron-core's BlendedDataset. Position k of the blend
// takes dataset d maximising w[d]·max(k,1) − count[d] (ties → lowest d), and
// that dataset's next sample (count[d]).
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "data/gpt_dataset.h"

namespace mpitron::data {

// Weighted prefixes from Megatron's --data-path list: "a" (weight 1) or
// "w1 a w2 b ...". Weights are normalised to sum 1.
struct DataBlend {
  std::vector<double> weights;
  std::vector<std::string> prefixes;
};
DataBlend parse_data_path(const std::vector<std::string>& args);

// Megatron's build_blending_indices: dataset_index[k] and dataset_sample_index[k]
// for k in [0, size); weights need not be normalised.
void build_blending_indices(const std::vector<double>& weights, int64_t size, std::vector<int16_t>& dataset_index,
                            std::vector<int64_t>& dataset_sample_index);

// Samples each dataset must provide for a blend of `size`:
// ceil(ceil(size × w) × 1.005) (megatron-core's margin).
std::vector<int64_t> blended_samples_per_dataset(const std::vector<double>& weights, int64_t size);

class BlendedDataset {
 public:
  BlendedDataset(std::vector<std::shared_ptr<const GPTDataset>> datasets, std::vector<double> weights, int64_t size);

  int64_t size() const { return static_cast<int64_t>(dataset_index_.size()); }
  void sample(int64_t i, int32_t* out) const;
  std::vector<int32_t> sample(int64_t i) const;
  int dataset_of(int64_t i) const { return dataset_index_.at(i); }
  int64_t dataset_sample_of(int64_t i) const { return dataset_sample_index_.at(i); }
  int64_t sequence_length() const { return datasets_.front()->sequence_length(); }

 private:
  std::vector<std::shared_ptr<const GPTDataset>> datasets_;
  std::vector<double> weights_;
  std::vector<int16_t> dataset_index_;
  std::vector<int64_t> dataset_sample_index_;
};

}  // namespace mpitron::data
