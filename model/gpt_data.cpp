#include "model/gpt_data.h"

#include "core/device_memory.h"
#include "core/error.h"
#include "core/log.h"
#include "data/blended_dataset.h"
#include "data/gpt_dataset.h"

namespace mpitron {

namespace {

class GPTSamples final : public SampleSource {
 public:
  std::shared_ptr<const data::BlendedDataset> blended[3];
  std::shared_ptr<const data::GPTDataset> single[3];
  int64_t num_samples(int split) const override {
    if (blended[split]) return blended[split]->size();
    return single[split] ? single[split]->size() : 0;
  }
  void sample(int split, int64_t i, int32_t* out) const override {
    if (blended[split]) blended[split]->sample(i, out);
    else single[split]->sample(i, out);
  }
};

const char* kSplitNames[3] = {"train", "valid", "test"};

}  // namespace

std::shared_ptr<SampleSource> make_gpt_data(const TrainArgs& a, int64_t vocab_size) {
  const data::DataBlend blend = data::parse_data_path(a.data_path);
  const std::vector<int64_t> wanted = samples_per_split(a);
  {
    // The sample and shuffle indices hold at least 12 bytes per sample (megatron-core's
    // int32 [N+1, 2] sample index + the shuffle index): refuse what cannot fit before building it.
    const double samples = static_cast<double>(wanted[0]) + static_cast<double>(wanted[1]) + static_cast<double>(wanted[2]);
    const double need = 12.0 * samples, have = static_cast<double>(device_memory_bytes(Device::cpu()));
    MPT_CHECK(need <= have,
              str("the run asks for ", samples, " samples (train ", wanted[0], ", valid ", wanted[1], ", test ", wanted[2],
                  "): their indices need at least ", need / 1e9, " GB but this machine has ", have / 1e9, " GB"),
              "lower --train-iters / --train-samples, --global-batch-size or --eval-iters");
  }
  auto out = std::make_shared<GPTSamples>();
  std::vector<std::shared_ptr<const data::IndexedDataset>> files;
  for (const std::string& prefix : blend.prefixes) {
    auto ds = std::make_shared<const data::IndexedDataset>(prefix);
    data::validate_token_ids(*ds, vocab_size);
    files.push_back(ds);
  }
  for (int split = 0; split < 3; ++split) {
    if (wanted[split] == 0) continue;
    std::vector<std::shared_ptr<const data::GPTDataset>> parts;
    // Each blended dataset is built a little larger than its share (Megatron uses 0.5%).
    const std::vector<int64_t> per = blend.prefixes.size() > 1
                                         ? data::blended_samples_per_dataset(blend.weights, wanted[split])
                                         : std::vector<int64_t>{wanted[split]};
    for (size_t d = 0; d < files.size(); ++d) {
      const auto ranges = data::split_document_ranges(a.split, files[d]->document_count());
      if (ranges[split].size() == 0) {
        if (split == 0)
          MPT_THROW(str("--split '", a.split, "' leaves no training documents in ", blend.prefixes[d]),
                    "give the train split a non-zero weight");
        parts.clear();
        break;
      }
      data::GPTDatasetConfig cfg;
      cfg.sequence_length = a.model.seq_length;
      cfg.num_samples = static_cast<int64_t>(static_cast<double>(per[d]) * 1.005) + 1;
      cfg.seed = static_cast<uint32_t>(a.seed);
      parts.push_back(std::make_shared<const data::GPTDataset>(files[d], ranges[split], cfg, kSplitNames[split]));
    }
    if (parts.empty()) {
      log_warn("the ", kSplitNames[split], " split of --split '", a.split, "' is empty: no ", kSplitNames[split],
               " evaluation");
      continue;
    }
    if (parts.size() == 1) out->single[split] = parts[0];
    else out->blended[split] = std::make_shared<const data::BlendedDataset>(parts, blend.weights, wanted[split]);
    log_info("> ", kSplitNames[split], " samples: ", out->num_samples(split), " (needed ", wanted[split], ")");
  }
  return out;
}

}  // namespace mpitron
