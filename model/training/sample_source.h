// model/training/sample_source.h — where the trainer's samples come from, one interface
// per sample form. Split 0 is train, 1 valid, 2 test.
//
// The base gives token runs (what every GPT-like model trains on): each sample is
// seq_length + 1 tokens, inputs [:-1] and targets [1:]. The other forms are
// sub-interfaces, each read by the one model kind that trains on it
// (model/training/model_kind.h), which refuses a source of another form by name.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace mpitron {

namespace data {
struct BertSample;
struct T5Sample;
}  // namespace data
struct ClassificationSample;  // model/training/finetune.h

class SampleSource {
 public:
  virtual ~SampleSource() = default;
  virtual int64_t num_samples(int split) const = 0;
  // Sample `index` of `split` as seq_length + 1 tokens. Sources of another form have none
  // and refuse (the default).
  virtual void sample(int split, int64_t index, int32_t* tokens) const;
  // Evaluation by accuracy over whole sets (finetune's --valid-data files): each a run
  // [first, first + count) of split 1, every sample counted once. Empty: evaluation is
  // the mean loss of --eval-iters global batches.
  struct EvalSet {
    std::string name;
    int64_t first = 0, count = 0;
  };
  virtual std::vector<EvalSet> eval_sets() const { return {}; }
};

// BERT's masked samples (tokens, types, masked labels, sentence-order label): pretrain_bert,
// model/training/bert_data.h.
class MaskedLMSource : public SampleSource {
 public:
  virtual void bert_sample(int split, int64_t index, data::BertSample& out) const = 0;
};

// T5's span-corruption samples (encoder and decoder inputs, labels): pretrain_t5,
// model/training/bert_data.h.
class SpanCorruptionSource : public SampleSource {
 public:
  virtual void t5_sample(int split, int64_t index, data::T5Sample& out) const = 0;
};

// Labelled sequence-classification samples: finetune, model/training/finetune.h.
class ClassificationSource : public SampleSource {
 public:
  virtual void classification_sample(int split, int64_t index, ClassificationSample& out) const = 0;
};

}  // namespace mpitron
