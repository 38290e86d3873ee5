// model/training/model_kind.h — what the trainer trains, as one interface.
//
// The trainer (model/training/trainer.h) runs steps, logs, evaluates and saves without
// asking which model it trains; a model kind supplies every part that differs:
//   batch     micro_batch: samples of a split in the kind's own form (its SampleSource)
//   forward   chunk_forward: one model chunk; the last stage returns the loss (1) f32
//   hooks     begin_step / add_training_options / end_step / record_step around each step
//             (MoE: the auxiliary losses' scale, the routing statistics, the expert bias)
//   log       log_interval: the loss fields of Megatron's line and any fields of the kind's
//   eval      evaluation_losses: the named losses of an evaluation; accuracy: classifiers
// Every kind is built over the GPT core (parameters, chunks, blocks), so the model
// states, checkpoints and the pipeline executor work on it unchanged.
//
// Implementations, one file each: decoder_kind.cpp (GPT-like decoders, MoE families
// included), bert_kind.cpp (pretrain_bert), t5_kind.cpp (pretrain_t5),
// classifier_kind.cpp (finetune). make_model_kind picks one from the configuration.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "model/gpt.h"

namespace mpitron {

class HostGroups;
class SampleSource;
struct TrainArgs;
struct TrainSummary;

// One micro-batch of samples, host tensors, in the form of the kind that built it.
struct MicroBatch {
  virtual ~MicroBatch() = default;
};

// A loss under Megatron's log key ("lm loss", "sop loss") and its value.
struct NamedLoss {
  std::string name;
  double value = 0;
};

// A classifier's correct predictions (argmax of the logits) since the last reset.
struct Accuracy {
  int64_t correct = 0, total = 0;
};

// Fields a kind adds to a log interval's output: text for the log line, TensorBoard
// scalars (each also "<name> vs samples") and metrics JSONL entries.
struct LogFields {
  struct Scalar {
    std::string group, name;  // Megatron-DeepSpeed's group, Megatron-LM's tag
    double value = 0;
  };
  std::string text;
  std::vector<Scalar> scalars;
  nlohmann::json metrics = nlohmann::json::object();
};

class ModelKind {
 public:
  virtual ~ModelKind() = default;

  // The model's parameters, chunks and blocks.
  virtual GPT& core() = 0;
  // Megatron's init from the seed, and what the kind adds to it (MoE: zero expert biases).
  virtual void init_weights(uint64_t seed) { core().init_weights(seed); }

  // The start-up line's head: "mpitron <tool>: <layers>, hidden H, heads A, seq T".
  virtual std::string describe() const = 0;
  // Lines after the flags' notes (MoE: experts, router, balancing, expert parallelism).
  virtual std::vector<std::string> startup_lines() const { return {}; }

  // Samples [first, first + mbs) of `split` (wrapping around the split's size); the first
  // `counted` of them count for accuracy (classifiers). Refuses a source of another form.
  virtual std::unique_ptr<MicroBatch> micro_batch(const SampleSource& data, int split, int64_t first, int64_t mbs,
                                                  int64_t counted = 0) const = 0;
  // Local chunk c: the first stage reads the batch, others `input`; the last stage returns
  // the loss (1) f32 (and notes its parts), others their activation.
  virtual Var chunk_forward(Tape& tape, int c, const MicroBatch& batch, const Var& input,
                            const ForwardOptions& opt) = 0;

  // Before a training step's first forward; loss_seed: the backward's seed (loss scale /
  // micro-batches).
  virtual void begin_step(float loss_seed) { (void)loss_seed; }
  // What a training forward adds to the trainer's options (MoE: the run's settings).
  virtual void add_training_options(ForwardOptions& o) { (void)o; }
  // After the step's last backward, before the optimizer; collective over `groups`.
  virtual void end_step(const HostGroups& groups, int64_t n_micro) { (void)groups, (void)n_micro; }
  // The step was kept (not abandoned for a rerun); counted: its loss joins the interval's mean.
  virtual void record_step(bool counted, TrainSummary& sum) { (void)counted, (void)sum; }

  // The interval's fields, then a new interval. losses: the line's loss text
  // ("lm loss: X | sop loss: Y"), written in place of the loss, with its scalars and
  // metrics; extra: the kind's own fields after the parameters' norm. mean_loss: the
  // trained loss's mean over the counted steps (NaN when none).
  virtual void log_interval(double mean_loss, LogFields& losses, LogFields& extra) = 0;

  // Before an evaluation's first forward: what the last one counted is dropped.
  virtual void begin_evaluation() {}
  // The losses an evaluation reports: mean_loss over `count` micro-batches of every dp rank.
  // Collective over `groups`.
  virtual std::vector<NamedLoss> evaluation_losses(double mean_loss, double count, const HostGroups& groups) = 0;
  // Correct predictions since begin_evaluation, on the last stage; null: the kind does not classify.
  virtual const Accuracy* accuracy() const { return nullptr; }
};

// The kind args.model describes: a BERT classifier (num_classes > 0), a BERT, a T5, or a
// GPT-like decoder.
std::unique_ptr<ModelKind> make_model_kind(const TrainArgs& args, Device device, const ModelParallel& mp);

// "lm loss: X | sop loss: Y" with their TensorBoard scalars ("lm-loss-training" group) and
// metrics ("lm_loss", "sop_loss"): the loss fields every kind writes.
void add_losses(LogFields& out, const std::vector<NamedLoss>& losses);

// The batch as the kind that built it (a batch of another kind is a bug).
[[noreturn]] void throw_wrong_batch();
template <class Batch>
const Batch& batch_as(const MicroBatch& b) {
  const Batch* p = dynamic_cast<const Batch*>(&b);
  if (!p) throw_wrong_batch();
  return *p;
}

}  // namespace mpitron
