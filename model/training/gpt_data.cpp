#include "model/training/gpt_data.h"

#include <algorithm>
#include <map>
#include <random>

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

// --mock-data: Megatron's mock GPT data — documents of seeded random length whose
// tokens count up 1, 2, 3, … and end with the end-of-document token (vocab - 1).
// Learnable (the next token is the last + 1), reproducible, and no files.
class MockSamples final : public SampleSource {
 public:
  MockSamples(std::vector<int64_t> sizes, int64_t seq_length, int64_t vocab_size, uint64_t seed)
      : sizes_(std::move(sizes)), T_(seq_length), V_(vocab_size), seed_(seed) {}
  int64_t num_samples(int split) const override { return sizes_[static_cast<size_t>(split)]; }
  void sample(int split, int64_t i, int32_t* out) const override {
    std::mt19937_64 rng(seed_ ^ (0x9E3779B97F4A7C15ull * static_cast<uint64_t>(split + 1)) ^
                        (static_cast<uint64_t>(i) * 0xD1B54A32D192ED03ull));
    const int64_t max_len = std::min<int64_t>(2 * T_, V_ - 1);
    std::uniform_int_distribution<int64_t> len_of(2, std::max<int64_t>(2, max_len));
    int64_t len = len_of(rng), pos = static_cast<int64_t>(rng() % static_cast<uint64_t>(len));
    for (int64_t k = 0; k <= T_; ++k) {
      out[k] = pos == len - 1 ? static_cast<int32_t>(V_ - 1) : static_cast<int32_t>(pos + 1);
      if (++pos == len) {
        len = len_of(rng);
        pos = 0;
      }
    }
  }

 private:
  std::vector<int64_t> sizes_;
  int64_t T_, V_;
  uint64_t seed_;
};

}  // namespace

std::shared_ptr<SampleSource> make_gpt_data(const TrainArgs& a, int64_t vocab_size) {
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
  if (a.mock_data) {
    log_info("> --mock-data: synthetic documents (1, 2, 3, …, end-of-document), no files read");
    return std::make_shared<MockSamples>(wanted, a.model.seq_length, vocab_size, a.seed);
  }
  const bool per_split = !a.train_data_path.empty();
  const std::vector<std::string>* paths[3] = {&a.train_data_path, &a.valid_data_path, &a.test_data_path};
  auto out = std::make_shared<GPTSamples>();
  std::map<std::string, std::shared_ptr<const data::IndexedDataset>> opened;  // a prefix may serve several splits
  auto open = [&](const std::string& prefix) {
    auto& ds = opened[prefix];
    if (!ds) {
      ds = std::make_shared<const data::IndexedDataset>(prefix);
      data::validate_token_ids(*ds, vocab_size);
    }
    return ds;
  };
  const data::DataBlend shared_blend = per_split ? data::DataBlend{} : data::parse_data_path(a.data_path);
  for (int split = 0; split < 3; ++split) {
    if (wanted[split] == 0) continue;
    // --data-path: every split from the same files, cut by --split; --train-data-path & co: own files, all documents.
    const data::DataBlend blend = per_split ? (paths[split]->empty() ? data::DataBlend{} : data::parse_data_path(*paths[split]))
                                            : shared_blend;
    std::vector<std::shared_ptr<const data::GPTDataset>> parts;
    // Each blended dataset is built a little larger than its share (Megatron uses 0.5%).
    const std::vector<int64_t> per = blend.prefixes.size() > 1
                                         ? data::blended_samples_per_dataset(blend.weights, wanted[split])
                                         : std::vector<int64_t>{wanted[split]};
    for (size_t d = 0; d < blend.prefixes.size(); ++d) {
      const auto file = open(blend.prefixes[d]);
      data::DocRange range{0, file->document_count()};
      if (!per_split) range = data::split_document_ranges(a.split, file->document_count())[split];
      if (range.size() == 0) {
        if (split == 0)
          MPT_THROW(str(per_split ? "--train-data-path " : str("--split '", a.split, "' leaves no training documents in "),
                        blend.prefixes[d], per_split ? " has no documents" : ""),
                    per_split ? "check the prefix" : "give the train split a non-zero weight");
        parts.clear();
        break;
      }
      data::GPTDatasetConfig cfg;
      cfg.sequence_length = a.model.seq_length;
      cfg.num_samples = static_cast<int64_t>(static_cast<double>(per[d]) * 1.005) + 1;
      cfg.seed = static_cast<uint32_t>(a.seed);
      cfg.cache_dir = a.data_cache_path;
      parts.push_back(std::make_shared<const data::GPTDataset>(file, range, cfg, kSplitNames[split]));
    }
    if (parts.empty()) {
      if (per_split) log_warn("no --", kSplitNames[split], "-data-path: no ", kSplitNames[split], " evaluation");
      else
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
