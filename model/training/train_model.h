// model/training/train_model.h — what the trainer trains: a GPT (next-token loss),
// a BERT (masked-LM + sentence-order losses) or a T5 (span corruption's lm loss), behind one micro-batch type and
// one chunk forward. The trainer, the pipeline stage runner and evaluation call
// only this; everything else (optimizer, buckets, ZeRO, checkpoints) works on the
// GPT core's flat parameters and is the same for both.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "model/bert.h"
#include "model/gpt.h"
#include "model/t5.h"

namespace mpitron {

class SampleSource;

// One micro-batch of (mbs) samples, host tensors.
struct MicroBatch {
  Tensor tokens, targets;  // GPT: (mbs, T) i32 inputs and next tokens
  BertBatch bert;          // BERT: the masked samples, or a classifier's (model/bert.h)
  T5Batch t5;              // T5: the span-corruption samples (model/t5.h)
  int64_t counted = 0;     // classification: the first `counted` samples count for accuracy
                           //   (the rest wrap around the end of an evaluation set)
};

// A classifier's correct predictions (argmax of the logits) since the last reset.
struct Accuracy {
  int64_t correct = 0, total = 0;
};

// The loss parts a model reports (Megatron's log keys): GPT "lm loss"; BERT
// "lm loss" and, with the binary head, "sop loss". The trained loss is their sum.
struct LossParts {
  std::vector<double> v;  // sums over the micro-batches since the last reset
  void add(const std::vector<double>& x);
};

class TrainModel {
 public:
  // A BERT when cfg.bert (a sequence classifier when cfg.num_classes > 0: finetune), a T5 when cfg.t5,
  // else a GPT of the family cfg describes.
  TrainModel(const GPTConfig& cfg, Device device, const ModelParallel& mp);
  GPT& core() { return bert_ ? bert_->core() : t5_ ? t5_->core() : *gpt_; }
  const GPT& core() const { return bert_ ? bert_->core() : t5_ ? t5_->core() : *gpt_; }
  bool is_bert() const { return bert_ != nullptr; }
  bool is_classifier() const { return bert_ && bert_->config().num_classes > 0; }
  // Names of the loss parts ("lm loss", "sop loss").
  const std::vector<std::string>& loss_names() const { return names_; }

  // Samples [first, first + mbs) of `split` (wrapping around the split's size);
  // `counted` of them count for accuracy (classifiers).
  MicroBatch micro_batch(const SampleSource& data, int split, int64_t first, int64_t mbs, int64_t counted = 0) const;
  // Local chunk c: the first stage reads the batch, others `input`; the last stage
  // returns the loss (1) f32 and adds its parts to parts(), others their activation.
  Var chunk_forward(Tape& tape, int c, const MicroBatch& batch, const Var& input, const ForwardOptions& opt);
  LossParts& parts() { return parts_; }
  Accuracy& accuracy() { return accuracy_; }  // classifiers, on the last stage

 private:
  std::unique_ptr<GPT> gpt_;
  std::unique_ptr<Bert> bert_;
  std::unique_ptr<T5> t5_;
  std::vector<std::string> names_;
  LossParts parts_;
  Accuracy accuracy_;
};

}  // namespace mpitron
