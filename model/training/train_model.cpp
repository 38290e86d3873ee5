#include "model/training/train_model.h"

#include <algorithm>

#include "core/error.h"
#include "data/bert_dataset.h"
#include "data/t5_dataset.h"
#include "model/training/finetune.h"
#include "model/training/trainer.h"

namespace mpitron {

void SampleSource::bert_sample(int, int64_t, data::BertSample&) const {
  MPT_THROW("this data source has no BERT samples", "pretrain_bert reads a sentence-level dataset "
                                                    "(preprocess_data --split-sentences)");
}

void SampleSource::t5_sample(int, int64_t, data::T5Sample&) const {
  MPT_THROW("this data source has no T5 samples", "pretrain_t5 reads a sentence-level dataset "
                                                  "(preprocess_data --split-sentences)");
}

void SampleSource::classification_sample(int, int64_t, ClassificationSample&) const {
  MPT_THROW("this data source has no classification samples", "finetune reads a task's files (--task, --train-data)");
}

void LossParts::add(const std::vector<double>& x) {
  if (v.size() < x.size()) v.resize(x.size(), 0.0);
  for (size_t i = 0; i < x.size(); ++i) v[i] += x[i];
}

TrainModel::TrainModel(const GPTConfig& cfg, Device device, const ModelParallel& mp) {
  if (cfg.bert) {
    bert_ = std::make_unique<Bert>(cfg, device, mp);
    names_ = {"lm loss"};  // a classifier's loss too, under Megatron's key (tasks/finetune_utils.py)
    if (cfg.binary_head && cfg.num_classes == 0) names_.push_back("sop loss");
  } else if (cfg.t5) {
    t5_ = std::make_unique<T5>(cfg, device, mp);
    names_ = {"lm loss"};
  } else {
    gpt_ = std::make_unique<GPT>(cfg, device, mp);
    names_ = {"lm loss"};
  }
}

MicroBatch TrainModel::micro_batch(const SampleSource& data, int split, int64_t first, int64_t mbs,
                                   int64_t counted) const {
  const int64_t n = data.num_samples(split);
  MPT_CHECK(n > 0, str("the ", split == 0 ? "train" : split == 1 ? "valid" : "test", " split has no samples"),
            "check --split and --data-path");
  MicroBatch mb;
  mb.counted = counted;
  if (is_classifier()) {
    MPT_CHECK(data.classification(), "a classifier trains on labelled task samples, but the data source has none",
              "this is a bug in the caller of Trainer (finetune builds the task's data)");
    std::vector<ClassificationSample> s(static_cast<size_t>(mbs));
    std::vector<const ClassificationSample*> ptrs;
    for (int64_t b = 0; b < mbs; ++b) {
      data.classification_sample(split, (first + b) % n, s[static_cast<size_t>(b)]);
      ptrs.push_back(&s[static_cast<size_t>(b)]);
    }
    mb.bert = classification_batch(ptrs);
    return mb;
  }
  if (bert_) {
    MPT_CHECK(data.masked_lm(), "BERT trains on masked samples, but the data source gives token runs",
              "this is a bug in the caller of Trainer (pretrain_bert builds the BERT data)");
    std::vector<data::BertSample> s(static_cast<size_t>(mbs));
    for (int64_t b = 0; b < mbs; ++b) data.bert_sample(split, (first + b) % n, s[static_cast<size_t>(b)]);
    mb.bert = BertBatch::from(s);
    return mb;
  }
  if (t5_) {
    MPT_CHECK(data.span_corruption(), "T5 trains on span-corruption samples, but the data source has none",
              "this is a bug in the caller of Trainer (pretrain_t5 builds the T5 data)");
    std::vector<data::T5Sample> s(static_cast<size_t>(mbs));
    for (int64_t b = 0; b < mbs; ++b) data.t5_sample(split, (first + b) % n, s[static_cast<size_t>(b)]);
    mb.t5 = T5Batch::from(s);
    return mb;
  }
  MPT_CHECK(!data.masked_lm() && !data.span_corruption(), "a GPT trains on token runs, but the data source gives BERT or T5 samples",
            "this is a bug in the caller of Trainer");
  // Context parallelism: this rank gets only its chunks of each sample (T/cp tokens
  // and their targets, chunks r and 2·cp − 1 − r; parallel/context_parallel.h).
  const ContextParallel& cp = core().parallel().cp;
  const int64_t T = core().config().seq_length, Tl = cp.local_seq(T);
  mb.tokens = Tensor::empty({mbs, Tl}, DType::I32);
  mb.targets = Tensor::empty({mbs, Tl}, DType::I32);
  std::vector<int32_t> buf(static_cast<size_t>(T + 1));
  for (int64_t b = 0; b < mbs; ++b) {
    data.sample(split, (first + b) % n, buf.data());
    for (const ContextParallel::Run& r : cp.runs(T)) {
      std::copy_n(buf.begin() + r.global, r.len, mb.tokens.data<int32_t>() + b * Tl + r.local);
      std::copy_n(buf.begin() + r.global + 1, r.len, mb.targets.data<int32_t>() + b * Tl + r.local);
    }
  }
  return mb;
}

Var TrainModel::chunk_forward(Tape& tape, int c, const MicroBatch& batch, const Var& input, const ForwardOptions& opt) {
  const bool last = core().chunk(c).last_stage;
  if (t5_) {  // one chunk: T5 is not pipelined
    Var out = t5_->forward(tape, batch.t5, opt);
    parts_.add({out.value().item()});
    return out;
  }
  if (!bert_) {
    Var out = gpt_->chunk_forward(tape, c, batch.tokens, batch.targets, input, opt);
    if (last) parts_.add({out.value().item()});
    return out;
  }
  Var out = bert_->chunk_forward(tape, c, batch.bert, input, opt);
  if (last && is_classifier()) {
    const BertLosses& l = bert_->last_losses();
    parts_.add({l.cls});
    if (batch.counted > 0) {  // argmax of each counted row against its label
      const std::vector<float> logits = l.class_logits.to_floats();
      const Tensor labels = batch.bert.class_labels.to(Device::cpu());
      const int64_t K = bert_->config().num_classes;
      for (int64_t b = 0; b < batch.counted; ++b) {
        const auto row = logits.begin() + static_cast<std::ptrdiff_t>(b * K);
        accuracy_.correct += std::max_element(row, row + K) - row == labels.data<int32_t>()[b];
      }
      accuracy_.total += batch.counted;
    }
  } else if (last) {
    const BertLosses& l = bert_->last_losses();
    if (bert_->config().binary_head) parts_.add({l.lm, l.sop});
    else parts_.add({l.lm});
  }
  return out;
}

}  // namespace mpitron
