// The T5 kind (model/training/model_kind.h): pretrain_t5's span-corruption loss on the
// decoder's labels (SpanCorruptionSource). One chunk: the encoder-decoder is not pipelined.
#include "data/t5_dataset.h"
#include "model/t5.h"
#include "model/training/arguments.h"
#include "model/training/kinds.h"
#include "model/training/sample_source.h"

namespace mpitron {

namespace {

struct SpanBatch final : MicroBatch {
  T5Batch t5;
};

class T5Kind final : public ModelKind {
 public:
  T5Kind(const TrainArgs& args, Device device, const ModelParallel& mp) : t5_(args.model, device, mp) {}

  GPT& core() override { return t5_.core(); }

  std::string describe() const override {
    const GPTConfig& c = t5_.config();
    return kind_heading("pretrain_t5", str(c.encoder_num_layers, " encoder + ", c.decoder_num_layers(), " decoder layers"),
                        c, str(", seq ", c.seq_length, " (decoder ", c.decoder_seq_length, ")"));
  }

  std::unique_ptr<MicroBatch> micro_batch(const SampleSource& data, int split, int64_t first, int64_t mbs,
                                          int64_t) const override {
    const int64_t n = sample_count(data, split);
    const auto* spans = dynamic_cast<const SpanCorruptionSource*>(&data);
    MPT_CHECK(spans, "T5 trains on span-corruption samples, but the data source has none",
              "this is a bug in the caller of Trainer (pretrain_t5 builds the T5 data)");
    std::vector<data::T5Sample> s(static_cast<size_t>(mbs));
    for (int64_t b = 0; b < mbs; ++b) spans->t5_sample(split, (first + b) % n, s[static_cast<size_t>(b)]);
    auto mb = std::make_unique<SpanBatch>();
    mb->t5 = T5Batch::from(s);
    return mb;
  }

  Var chunk_forward(Tape& tape, int, const MicroBatch& batch, const Var&, const ForwardOptions& opt) override {
    return t5_.forward(tape, batch_as<SpanBatch>(batch).t5, opt);
  }

  void log_interval(double mean_loss, LogFields& losses, LogFields&) override {
    add_losses(losses, {{"lm loss", mean_loss}});
  }
  std::vector<NamedLoss> evaluation_losses(double mean_loss, double, const HostGroups&) override {
    return {{"lm loss", mean_loss}};
  }

 private:
  T5 t5_;
};

}  // namespace

std::unique_ptr<ModelKind> make_t5_kind(const TrainArgs& args, Device device, const ModelParallel& mp) {
  return std::make_unique<T5Kind>(args, device, mp);
}

}  // namespace mpitron
