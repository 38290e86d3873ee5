// data/blended_dataset.cpp — Megatron's greedy blending.
#include "data/blended_dataset.h"

#include <cmath>

#include "core/error.h"
#include "core/number.h"

namespace mpitron::data {

DataBlend parse_data_path(const std::vector<std::string>& args) {
  DataBlend b;
  MPT_CHECK(!args.empty(), "--data-path is empty", "give a dataset prefix, or weight prefix pairs: 0.3 a 0.7 b");
  if (args.size() == 1) {
    b.weights = {1.0};
    b.prefixes = args;
    return b;
  }
  MPT_CHECK(args.size() % 2 == 0,
            str("--data-path has ", args.size(), " entries; with several datasets give weight prefix pairs"),
            "e.g. --data-path 0.3 /data/a_text_document 0.7 /data/b_text_document");
  double sum = 0;
  for (size_t i = 0; i < args.size(); i += 2) {
    double w = 0;
    MPT_CHECK(parse_decimal(args[i], &w) && w >= 0,
              str("--data-path entry ", i + 1, " '", args[i], "' is not a non-negative weight"),
              "entries alternate weight and prefix: 0.3 a 0.7 b");
    b.weights.push_back(w);
    b.prefixes.push_back(args[i + 1]);
    sum += w;
  }
  MPT_CHECK(sum > 0, "--data-path weights sum to 0", "");
  for (double& w : b.weights) w /= sum;
  return b;
}

void build_blending_indices(const std::vector<double>& raw_weights, int64_t size, std::vector<int16_t>& dataset_index,
                            std::vector<int64_t>& dataset_sample_index) {
  const size_t n = raw_weights.size();
  MPT_CHECK(n > 0 && n < 32768, str("cannot blend ", n, " datasets"), "");
  double sum = 0;
  for (double w : raw_weights) {
    MPT_CHECK(std::isfinite(w) && w >= 0, str("blend weight ", w, " is not a non-negative number"), "");
    sum += w;
  }
  MPT_CHECK(sum > 0, "blend weights sum to 0", "");
  std::vector<double> weights(raw_weights);
  for (double& w : weights) w /= sum;
  dataset_index.resize(static_cast<size_t>(size));
  dataset_sample_index.resize(static_cast<size_t>(size));
  std::vector<int64_t> count(n, 0);
  for (int64_t k = 0; k < size; ++k) {
    const double kk = std::max(static_cast<double>(k), 1.0);
    size_t best = 0;
    double best_err = weights[0] * kk - static_cast<double>(count[0]);
    for (size_t d = 1; d < n; ++d) {
      const double err = weights[d] * kk - static_cast<double>(count[d]);
      if (err > best_err) {
        best_err = err;
        best = d;
      }
    }
    dataset_index[k] = static_cast<int16_t>(best);
    dataset_sample_index[k] = count[best]++;
  }
}

std::vector<int64_t> blended_samples_per_dataset(const std::vector<double>& weights, int64_t size) {
  double sum = 0;
  for (double w : weights) sum += w;
  std::vector<int64_t> out;
  for (double w : weights)
    out.push_back(static_cast<int64_t>(std::ceil(std::ceil(static_cast<double>(size) * (w / sum)) * 1.005)));
  return out;
}

BlendedDataset::BlendedDataset(std::vector<std::shared_ptr<const GPTDataset>> datasets, std::vector<double> weights,
                               int64_t size)
    : datasets_(std::move(datasets)), weights_(std::move(weights)) {
  MPT_CHECK(!datasets_.empty() && datasets_.size() == weights_.size(),
            str("blend of ", datasets_.size(), " datasets with ", weights_.size(), " weights"), "");
  for (const auto& d : datasets_)
    MPT_CHECK(d && d->sequence_length() == datasets_.front()->sequence_length(),
              "blended datasets must share one sequence length", "");
  build_blending_indices(weights_, size, dataset_index_, dataset_sample_index_);  // normalises
  std::vector<int64_t> need(datasets_.size(), 0);
  for (int64_t k = 0; k < size; ++k) need[dataset_index_[k]] = dataset_sample_index_[k] + 1;
  for (size_t d = 0; d < datasets_.size(); ++d)
    MPT_CHECK(need[d] <= datasets_[d]->size(),
              str("blend needs ", need[d], " samples from dataset ", d, " ('", datasets_[d]->data().prefix(),
                  "'), which has ", datasets_[d]->size()),
              "build each dataset with blended_samples_per_dataset() samples");
}

void BlendedDataset::sample(int64_t i, int32_t* out) const {
  MPT_CHECK(i >= 0 && i < size(), str("blended sample ", i, " out of range [0, ", size(), ")"), "");
  datasets_[dataset_index_[i]]->sample(dataset_sample_index_[i], out);
}

std::vector<int32_t> BlendedDataset::sample(int64_t i) const {
  std::vector<int32_t> out(static_cast<size_t>(sequence_length() + 1));
  sample(i, out.data());
  return out;
}

}  // namespace mpitron::data
