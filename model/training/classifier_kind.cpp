// The sequence-classifier kind (model/training/model_kind.h): finetune's BERT with a
// classification head (cfg.num_classes > 0) on labelled samples (ClassificationSource).
// Its loss is logged under Megatron's "lm loss" key (tasks/finetune_utils.py); it
// counts correct predictions for evaluation by accuracy.
#include <algorithm>

#include "model/bert.h"
#include "model/training/arguments.h"
#include "model/training/finetune.h"
#include "model/training/kinds.h"
#include "model/training/loss_parts.h"
#include "model/training/sample_source.h"

namespace mpitron {

namespace {

struct LabelledBatch final : MicroBatch {
  BertBatch bert;        // with class_labels
  int64_t counted = 0;   // the first `counted` samples count for accuracy (the rest wrap
                         //   around the end of an evaluation set)
};

class ClassifierKind final : public ModelKind {
 public:
  ClassifierKind(const TrainArgs& args, Device device, const ModelParallel& mp)
      : bert_(args.model, device, mp), parts_({"lm loss"}) {}

  GPT& core() override { return bert_.core(); }

  std::string describe() const override {
    const GPTConfig& c = bert_.config();
    return kind_heading("finetune", str(c.num_layers, " layers"), c, str(", seq ", c.seq_length));
  }

  std::unique_ptr<MicroBatch> micro_batch(const SampleSource& data, int split, int64_t first, int64_t mbs,
                                          int64_t counted) const override {
    const int64_t n = sample_count(data, split);
    const auto* labelled = dynamic_cast<const ClassificationSource*>(&data);
    MPT_CHECK(labelled, "a classifier trains on labelled task samples, but the data source has none",
              "this is a bug in the caller of Trainer (finetune builds the task's data)");
    std::vector<ClassificationSample> s(static_cast<size_t>(mbs));
    std::vector<const ClassificationSample*> ptrs;
    for (int64_t b = 0; b < mbs; ++b) {
      labelled->classification_sample(split, (first + b) % n, s[static_cast<size_t>(b)]);
      ptrs.push_back(&s[static_cast<size_t>(b)]);
    }
    auto mb = std::make_unique<LabelledBatch>();
    mb->bert = classification_batch(ptrs);
    mb->counted = counted;
    return mb;
  }

  Var chunk_forward(Tape& tape, int c, const MicroBatch& batch, const Var& input, const ForwardOptions& opt) override {
    const LabelledBatch& b = batch_as<LabelledBatch>(batch);
    Var out = bert_.chunk_forward(tape, c, b.bert, input, opt);
    if (bert_.core().chunk(c).last_stage) {
      const BertLosses& l = bert_.last_losses();
      parts_.add({l.cls});
      if (b.counted > 0) count_correct(l.class_logits, b);
    }
    return out;
  }

  void begin_step(float) override { parts_.clear(); }
  void end_step(const HostGroups& groups, int64_t n_micro) override { parts_.end_step(groups, n_micro); }
  void record_step(bool counted, TrainSummary& sum) override { parts_.record_step(counted, sum); }
  void log_interval(double mean_loss, LogFields& losses, LogFields&) override { parts_.log_interval(mean_loss, losses); }

  void begin_evaluation() override {
    parts_.clear();
    accuracy_ = {};
  }
  std::vector<NamedLoss> evaluation_losses(double, double count, const HostGroups& groups) override {
    return parts_.evaluation_losses(count, groups);
  }
  const Accuracy* accuracy() const override { return &accuracy_; }

 private:
  // The argmax of each counted row of the (B, K) logits against its label.
  void count_correct(const Tensor& class_logits, const LabelledBatch& b) {
    const std::vector<float> logits = class_logits.to_floats();
    const Tensor labels = b.bert.class_labels.to(Device::cpu());
    const int64_t K = bert_.config().num_classes;
    for (int64_t i = 0; i < b.counted; ++i) {
      const auto row = logits.begin() + static_cast<std::ptrdiff_t>(i * K);
      accuracy_.correct += std::max_element(row, row + K) - row == labels.data<int32_t>()[i];
    }
    accuracy_.total += b.counted;
  }

  Bert bert_;
  LossParts parts_;
  Accuracy accuracy_;
};

}  // namespace

std::unique_ptr<ModelKind> make_classifier_kind(const TrainArgs& args, Device device, const ModelParallel& mp) {
  return std::make_unique<ClassifierKind>(args, device, mp);
}

}  // namespace mpitron
