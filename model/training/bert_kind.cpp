// The BERT kind (model/training/model_kind.h): pretrain_bert's masked-LM loss plus, with
// the binary head, the sentence-order loss, on masked samples (MaskedLMSource). Its log
// line and evaluation show both parts (Megatron prints each loss key).
#include "data/bert_dataset.h"
#include "model/bert.h"
#include "model/training/arguments.h"
#include "model/training/kinds.h"
#include "model/training/loss_parts.h"
#include "model/training/sample_source.h"

namespace mpitron {

namespace {

struct MaskedBatch final : MicroBatch {
  BertBatch bert;
};

std::vector<std::string> part_names(const GPTConfig& c) {
  if (c.binary_head) return {"lm loss", "sop loss"};
  return {"lm loss"};
}

class BertKind final : public ModelKind {
 public:
  BertKind(const TrainArgs& args, Device device, const ModelParallel& mp)
      : bert_(args.model, device, mp), parts_(part_names(args.model)) {}

  GPT& core() override { return bert_.core(); }

  std::string describe() const override {
    const GPTConfig& c = bert_.config();
    return kind_heading("pretrain_bert", str(c.num_layers, " layers"), c, str(", seq ", c.seq_length));
  }

  std::unique_ptr<MicroBatch> micro_batch(const SampleSource& data, int split, int64_t first, int64_t mbs,
                                          int64_t) const override {
    const int64_t n = sample_count(data, split);
    const auto* masked = dynamic_cast<const MaskedLMSource*>(&data);
    MPT_CHECK(masked, "BERT trains on masked samples, but the data source gives token runs",
              "this is a bug in the caller of Trainer (pretrain_bert builds the BERT data)");
    std::vector<data::BertSample> s(static_cast<size_t>(mbs));
    for (int64_t b = 0; b < mbs; ++b) masked->bert_sample(split, (first + b) % n, s[static_cast<size_t>(b)]);
    auto mb = std::make_unique<MaskedBatch>();
    mb->bert = BertBatch::from(s);
    return mb;
  }

  Var chunk_forward(Tape& tape, int c, const MicroBatch& batch, const Var& input, const ForwardOptions& opt) override {
    Var out = bert_.chunk_forward(tape, c, batch_as<MaskedBatch>(batch).bert, input, opt);
    if (bert_.core().chunk(c).last_stage) {
      const BertLosses& l = bert_.last_losses();
      if (bert_.config().binary_head) parts_.add({l.lm, l.sop});
      else parts_.add({l.lm});
    }
    return out;
  }

  void begin_step(float) override { parts_.clear(); }
  void end_step(const HostGroups& groups, int64_t n_micro) override { parts_.end_step(groups, n_micro); }
  void record_step(bool counted, TrainSummary& sum) override { parts_.record_step(counted, sum); }
  void log_interval(double mean_loss, LogFields& losses, LogFields&) override { parts_.log_interval(mean_loss, losses); }

  void begin_evaluation() override { parts_.clear(); }
  std::vector<NamedLoss> evaluation_losses(double, double count, const HostGroups& groups) override {
    return parts_.evaluation_losses(count, groups);
  }

 private:
  Bert bert_;
  LossParts parts_;
};

}  // namespace

std::unique_ptr<ModelKind> make_bert_kind(const TrainArgs& args, Device device, const ModelParallel& mp) {
  return std::make_unique<BertKind>(args, device, mp);
}

}  // namespace mpitron
