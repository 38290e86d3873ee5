// The GPT-like decoder kind (model/training/model_kind.h): next-token loss on token runs,
// for every decoder family (GPT-2, Llama, Mistral, Qwen, Gemma, MoE). With experts, the
// MoE step hook (model/training/moe_step.h) adds its statistics, expert-bias update and
// log fields.
#include <algorithm>

#include "model/training/arguments.h"
#include "model/training/kinds.h"
#include "model/training/loss_parts.h"
#include "model/training/moe_step.h"
#include "model/training/sample_source.h"

namespace mpitron {

namespace {

// (mbs, T) i32 inputs and their next tokens; with context parallelism this rank's T/cp of them.
struct TokenBatch final : MicroBatch {
  Tensor tokens, targets;
};

class DecoderKind final : public ModelKind {
 public:
  DecoderKind(const TrainArgs& args, Device device, const ModelParallel& mp)
      : gpt_(args.model, device, mp), expert_bias_rate_(args.moe.expert_bias_update_rate), mtp_(mtp_names(args.model)) {
    if (args.model.moe()) moe_ = std::make_unique<MoeStep>(args, gpt_);
  }

  GPT& core() override { return gpt_; }
  void init_weights(uint64_t seed) override {
    gpt_.init_weights(seed);
    if (expert_bias_rate_ > 0) gpt_.enable_expert_bias();
  }

  std::string describe() const override {
    const GPTConfig& c = gpt_.config();
    return kind_heading("pretrain_gpt", str(c.num_layers, " layers"), c, str(", seq ", c.seq_length));
  }
  std::vector<std::string> startup_lines() const override {
    if (!moe_) return {};
    return {moe_->describe()};
  }

  std::unique_ptr<MicroBatch> micro_batch(const SampleSource& data, int split, int64_t first, int64_t mbs,
                                          int64_t) const override {
    const int64_t n = sample_count(data, split);
    // Context parallelism: this rank gets only its chunks of each sample (T/cp tokens
    // and their targets, chunks r and 2·cp − 1 − r; parallel/context_parallel.h).
    const ContextParallel& cp = gpt_.parallel().cp;
    const int64_t T = gpt_.config().seq_length, Tl = cp.local_seq(T);
    auto mb = std::make_unique<TokenBatch>();
    mb->tokens = Tensor::empty({mbs, Tl}, DType::I32);
    mb->targets = Tensor::empty({mbs, Tl}, DType::I32);
    std::vector<int32_t> buf(static_cast<size_t>(T + 1));
    for (int64_t b = 0; b < mbs; ++b) {
      data.sample(split, (first + b) % n, buf.data());
      for (const ContextParallel::Run& r : cp.runs(T)) {
        std::copy_n(buf.begin() + r.global, r.len, mb->tokens.data<int32_t>() + b * Tl + r.local);
        std::copy_n(buf.begin() + r.global + 1, r.len, mb->targets.data<int32_t>() + b * Tl + r.local);
      }
    }
    return mb;
  }

  Var chunk_forward(Tape& tape, int c, const MicroBatch& batch, const Var& input, const ForwardOptions& opt) override {
    const TokenBatch& b = batch_as<TokenBatch>(batch);
    Var out = gpt_.chunk_forward(tape, c, b.tokens, b.targets, input, opt);
    const std::vector<double>& m = gpt_.last_mtp_losses();
    if (gpt_.chunk(c).last_stage && !m.empty()) {  // a training forward with MTP: "lm loss", "mtp_k loss"
      std::vector<double> parts{gpt_.last_lm_loss()};
      parts.insert(parts.end(), m.begin(), m.end());
      mtp_.add(parts);
    }
    return out;
  }

  void begin_step(float loss_seed) override {
    mtp_.clear();
    if (moe_) moe_->begin_step(loss_seed);
  }
  void add_training_options(ForwardOptions& o) override {
    if (moe_) o.moe = moe_->run();
  }
  void end_step(const HostGroups& groups, int64_t n_micro) override {
    if (mtp()) mtp_.end_step(groups, n_micro);
    if (moe_) moe_->end_step(groups, n_micro);
  }
  void record_step(bool counted, TrainSummary& sum) override {
    if (mtp()) mtp_.record_step(counted, sum);
    if (moe_) moe_->record_step(counted, sum);
  }

  void log_interval(double mean_loss, LogFields& losses, LogFields& extra) override {
    if (mtp()) mtp_.log_interval(mean_loss, losses);  // "lm loss" without MTP, then "mtp_k loss" (Megatron's)
    else add_losses(losses, {{"lm loss", mean_loss}});
    if (moe_) moe_->log_interval(extra);
  }
  std::vector<NamedLoss> evaluation_losses(double mean_loss, double, const HostGroups&) override {
    return {{"lm loss", mean_loss}};
  }

 private:
  // "lm loss", "mtp_1 loss", … "mtp_D loss" (Megatron-LM's log keys).
  static std::vector<std::string> mtp_names(const GPTConfig& c) {
    std::vector<std::string> v{"lm loss"};
    for (int64_t k = 1; k <= c.mtp_num_layers; ++k) v.push_back(str("mtp_", k, " loss"));
    return v;
  }
  bool mtp() const { return gpt_.config().mtp_num_layers > 0; }

  GPT gpt_;
  double expert_bias_rate_;
  LossParts mtp_;  // with MTP: the training losses' parts
  std::unique_ptr<MoeStep> moe_;  // null: a dense model
};

}  // namespace

std::unique_ptr<ModelKind> make_decoder_kind(const TrainArgs& args, Device device, const ModelParallel& mp) {
  return std::make_unique<DecoderKind>(args, device, mp);
}

}  // namespace mpitron
