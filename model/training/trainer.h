// model/training/trainer.h — the training loop (library code; apps/pretrain_gpt is a thin main).
//
// One iteration = one optimizer step over the global batch: num_micro_batches
// forward/backward passes accumulate f32 gradients (each micro-batch's loss is
// scaled by loss_scale / num_micro_batches), then clipping, AdamW, LR schedule
// and (fp16) the loss scaler. Logging, evaluation and checkpoints follow
// Megatron's intervals and line shapes.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <mpi.h>

#include "model/training/arguments.h"
#include "model/training/checkpointing.h"
#include "parallel/communicator.h"

namespace mpitron {

namespace data {
struct BertSample;
struct T5Sample;
}
class GPT;
struct ClassificationSample;  // model/training/finetune.h

// Where samples come from: split 0 train, 1 valid, 2 test; each sample is
// seq_length + 1 tokens (inputs [:-1], targets [1:]). A masked-LM source
// (pretrain_bert, model/training/bert_data.h) gives BERT samples instead.
class SampleSource {
 public:
  virtual ~SampleSource() = default;
  virtual int64_t num_samples(int split) const = 0;
  virtual void sample(int split, int64_t index, int32_t* tokens) const = 0;
  // BERT samples (tokens, types, masked labels, sentence-order label); sources that
  // have none refuse.
  virtual bool masked_lm() const { return false; }
  virtual void bert_sample(int split, int64_t index, data::BertSample& out) const;
  // T5 span-corruption samples (encoder and decoder inputs, labels); sources that have none refuse.
  virtual bool span_corruption() const { return false; }
  virtual void t5_sample(int split, int64_t index, data::T5Sample& out) const;
  // Sequence-classification samples (finetune, model/training/finetune.h); sources that
  // have none refuse.
  virtual bool classification() const { return false; }
  virtual void classification_sample(int split, int64_t index, ClassificationSample& out) const;
  // Evaluation by accuracy over whole sets (finetune's --valid-data files): each a run
  // [first, first + count) of split 1, every sample counted once. Empty: evaluation is
  // the mean loss of --eval-iters global batches.
  struct EvalSet {
    std::string name;
    int64_t first = 0, count = 0;
  };
  virtual std::vector<EvalSet> eval_sets() const { return {}; }
};

struct TrainSummary {
  double first_loss = 0, last_loss = 0;  // train loss at the first and last logged iterations
  double valid_loss = 0, valid_ppl = 0;  // the final evaluation
  int64_t iterations = 0;
  int64_t steps_run = 0;       // optimizer steps this run took (0: a resumed run already at its end)
  int64_t spike_skips = 0;     // steps skipped as loss / grad-norm spikes (--skip-spike-zscore)
  int64_t spike_reruns = 0;    // of those, how many went back to the newest checkpoint (--spike-rerun)
  std::string checkpoint_dir;
  double tokens_per_second = 0;
  std::vector<double> losses;  // per iteration: the loss trained on (GPT: lm loss; BERT: lm + sop)
  std::vector<double> lm_losses, sop_losses;  // BERT: per iteration, the two parts of `losses`
  std::vector<double> grad_norms;  // per iteration (before clipping)
  std::vector<double> moe_aux_losses;  // MoE: per iteration, the load-balancing loss (summed over the layers)
  bool signalled = false;      // stopped by SIGTERM/SIGUSR1 (--exit-signal-handler)
  std::vector<double> accuracies;  // eval_sets() sources: after each evaluation, correct / total over every set
  int64_t peak_memory_bytes = 0;       // measured tensor memory peak (as of the last log line)
  int64_t estimated_memory_bytes = 0;  // model/memory.h's estimate printed at start-up
};

// The parallel layout the trainer runs in (model/training/parallel_runtime.h builds it
// from a Grid). Data parallelism: every rank of the dp group runs the same
// Trainer on its slice of each global batch; gradients are averaged over dp (in
// buckets overlapped with backward), or reduce-scattered to ZeRO shards.
// Tensor parallelism splits every layer over the tp group; pipeline
// parallelism splits the layers over the pp group and runs a schedule.
struct ParallelContext {
  MPI_Comm dp_comm = MPI_COMM_NULL;  // the dp group (host scalars: losses, flags); NULL: one process
  Communicator* dp = nullptr;        // gradient reduction (the device's backend)
  int dp_rank = 0, dp_size = 1;
  MPI_Comm world = MPI_COMM_NULL;    // every rank (stop decisions); NULL: dp_comm
  int tp_rank = 0, tp_size = 1;
  Communicator* tp = nullptr;        // tensor-parallel group (device tensors)
  int pp_rank = 0, pp_size = 1;
  Communicator* pp = nullptr;        // pipeline group: activations and their gradients
  MPI_Comm pp_comm = MPI_COMM_NULL;  // the same group for host scalars (the last stage's loss)
  Communicator* mp = nullptr;        // tp × pp (same dp rank): the grad norm's sum
  Communicator* embedding = nullptr; // first + last pipeline stage: the tied word embedding's grads
  // Context parallelism (--context-parallel-size): each sequence split over the cp group.
  int cp_rank = 0, cp_size = 1;
  Communicator* cp = nullptr;          // attention across the group (device tensors)
  MPI_Comm cp_comm = MPI_COMM_NULL;    // the same group for host scalars (the loss's mean over its ranks)
  // dp × cp: where gradients are reduced and ZeRO shards when cp > 1 (the cp ranks
  // hold the same parameters); null: dp / dp_comm.
  Communicator* dp_cp = nullptr;
  MPI_Comm dp_cp_comm = MPI_COMM_NULL;
  // Expert parallelism (--expert-model-parallel-size, parallel/grid.h): the ep group, the
  // expert-data-parallel group and tp × pp × ep (the grad norm's sum); null when ep == 1.
  int ep_rank = 0, ep_size = 1;
  Communicator* ep = nullptr;
  Communicator* edp = nullptr;
  Communicator* mp_ep = nullptr;
  MPI_Comm edp_comm = MPI_COMM_NULL;  // the edp group for host scalars
};

class Trainer {
 public:
  // after_init: runs on the model's whole parameters after init_weights and before the
  // model states shard them (finetune's --pretrained-checkpoint); collective when it is.
  Trainer(const TrainArgs& args, std::shared_ptr<SampleSource> data, ParallelContext par = {},
          const std::function<void(GPT&)>& after_init = {});
  ~Trainer();
  TrainSummary run();
  GPT& model();  // the decoder, or BERT's encoder core (its parameters, chunks and blocks)

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// Samples the run needs per split: train, valid, test (Megatron's formula).
std::vector<int64_t> samples_per_split(const TrainArgs& a);

}  // namespace mpitron
