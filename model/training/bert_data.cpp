#include "model/training/bert_data.h"

#include <functional>
#include <map>

#include "core/error.h"
#include "core/log.h"
#include "data/bert_dataset.h"
#include "data/t5_dataset.h"
#include "data/blended_dataset.h"

namespace mpitron {

namespace {

const char* kSplitNames[3] = {"train", "valid", "test"};

class BertSamples final : public MaskedLMSource {
 public:
  std::shared_ptr<const data::BertDataset> split[3];
  int64_t num_samples(int s) const override { return split[s] ? split[s]->size() : 0; }
  void bert_sample(int s, int64_t i, data::BertSample& out) const override { out = split[s]->sample(i); }
};

class T5Samples final : public SpanCorruptionSource {
 public:
  std::shared_ptr<const data::T5Dataset> split[3];
  int64_t num_samples(int s) const override { return split[s] ? split[s]->size() : 0; }
  void t5_sample(int s, int64_t i, data::T5Sample& out) const override { out = split[s]->sample(i); }
};

std::string one_prefix(const std::vector<std::string>& path, const char* flag, const char* tool) {
  const data::DataBlend blend = data::parse_data_path(path);
  MPT_CHECK(blend.prefixes.size() == 1,
            str(flag, " names ", blend.prefixes.size(), " datasets: ", tool, " reads one sentence dataset per split"),
            "merge them first (merge_datasets), or give one prefix per split with --train-data-path / "
            "--valid-data-path / --test-data-path");
  return blend.prefixes[0];
}

// The sentence dataset of each split pretrain_bert and pretrain_t5 read (--data-path cut by --split, or
// one prefix per split): build(s, file, range, samples wanted) makes split s's dataset (of `kind` samples)
// and returns its size.
void for_each_sentence_split(const TrainArgs& a, const char* tool, const char* kind,
                             const std::function<int64_t(int, std::shared_ptr<const data::IndexedDataset>, data::DocRange,
                                                         int64_t)>& build) {
  MPT_CHECK(!a.mock_data, str("--mock-data is not implemented for ", tool),
            "preprocess some text with preprocess_data --split-sentences and give it with --data-path");
  const std::vector<int64_t> wanted = samples_per_split(a);
  const bool per_split = !a.train_data_path.empty();
  MPT_CHECK(per_split || !a.data_path.empty(), str(tool, " needs --data-path (or --train-data-path)"),
            "give the prefix preprocess_data --split-sentences wrote (…_text_sentence)");
  const std::vector<std::string>* paths[3] = {&a.train_data_path, &a.valid_data_path, &a.test_data_path};
  const char* flags[3] = {"--train-data-path", "--valid-data-path", "--test-data-path"};
  std::map<std::string, std::shared_ptr<const data::IndexedDataset>> opened;
  auto open = [&](const std::string& prefix) {
    auto& ds = opened[prefix];
    if (!ds) ds = std::make_shared<const data::IndexedDataset>(prefix);
    return ds;
  };
  const std::string shared = per_split ? "" : one_prefix(a.data_path, "--data-path", tool);
  for (int s = 0; s < 3; ++s) {
    if (wanted[s] == 0) continue;
    std::string prefix = shared;
    if (per_split) {
      if (paths[s]->empty()) {
        log_warn("no ", flags[s], ": no ", kSplitNames[s], " evaluation");
        continue;
      }
      prefix = one_prefix(*paths[s], flags[s], tool);
    }
    const auto file = open(prefix);
    data::DocRange range{0, file->document_count()};
    if (!per_split) range = data::split_document_ranges(a.split, file->document_count())[s];
    if (range.size() == 0) {
      MPT_CHECK(s != 0, str("--split '", a.split, "' leaves no training documents in ", prefix),
                "give the train split a non-zero weight");
      log_warn("the ", kSplitNames[s], " split of --split '", a.split, "' is empty: no ", kSplitNames[s], " evaluation");
      continue;
    }
    const int64_t n = build(s, file, range, wanted[s]);
    log_info("> ", kSplitNames[s], " ", kind, " samples: ", n, " (needed ",
             wanted[s], ") from ", range.size(), " documents of ", prefix);
  }
}

}  // namespace

std::shared_ptr<SampleSource> make_bert_data(const TrainArgs& a, const data::TextTokenizer& tok) {
  const data::BertVocab vocab = data::BertVocab::from(tok);
  auto out = std::make_shared<BertSamples>();
  for_each_sentence_split(a, "pretrain_bert", "BERT", [&](int s, auto file, data::DocRange range, int64_t wanted) {
    data::BertDatasetConfig cfg;
    cfg.seq_length = a.model.seq_length;
    cfg.binary_head = a.model.binary_head;
    cfg.mask_prob = a.mask_prob;
    cfg.short_seq_prob = a.short_seq_prob;
    cfg.seed = static_cast<int32_t>(a.seed);
    cfg.num_samples = wanted;
    out->split[s] = std::make_shared<const data::BertDataset>(file, range, vocab, cfg);
    MPT_CHECK(s != 0 || out->split[s]->size() > 0,
              str(file->prefix(), ": no BERT samples in the train documents (each needs ",
                  cfg.binary_head ? "2 sentences" : "1 sentence", " of at most 512 tokens)"),
              str("BERT samples are built from sentences: preprocess with --split-sentences and give the …_text_sentence "
                  "prefix", cfg.binary_head ? "; --bert-no-binary-head also takes one-sentence documents" : ""));
    return out->split[s]->size();
  });
  return out;
}

std::shared_ptr<SampleSource> make_t5_data(const TrainArgs& a, const data::TextTokenizer& tok) {
  const data::T5Vocab vocab = data::T5Vocab::from(tok, a.vocab_extra_ids);
  auto out = std::make_shared<T5Samples>();
  for_each_sentence_split(a, "pretrain_t5", "T5", [&](int s, auto file, data::DocRange range, int64_t wanted) {
    data::T5DatasetConfig cfg;
    cfg.encoder_seq_length = a.model.seq_length;
    cfg.decoder_seq_length = a.model.decoder_seq_length;
    cfg.mask_prob = a.mask_prob;
    cfg.short_seq_prob = a.short_seq_prob;
    cfg.seed = static_cast<int32_t>(a.seed);
    cfg.num_samples = wanted;
    out->split[s] = std::make_shared<const data::T5Dataset>(file, range, vocab, cfg);
    MPT_CHECK(s != 0 || out->split[s]->size() > 0,
              str(file->prefix(), ": no T5 samples in the train documents"),
              "T5 samples are built from sentences: preprocess with --split-sentences and give the …_text_sentence prefix");
    return out->split[s]->size();
  });
  return out;
}

}  // namespace mpitron
