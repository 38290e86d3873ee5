// model/training/trainer.h — the training loop (library code; apps/pretrain_gpt is a thin main).
//
// One iteration = one optimizer step over the global batch: num_micro_batches
// forward/backward passes accumulate f32 gradients (each micro-batch's loss is
// scaled by loss_scale / num_micro_batches), then clipping, AdamW, LR schedule
// and (fp16) the loss scaler. Logging, evaluation and checkpoints follow
// Megatron's intervals and line shapes. What is trained (a GPT-like decoder, a BERT,
// a T5, a classifier) is a model kind (model/training/model_kind.h) the trainer
// never asks about.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "model/training/arguments.h"
#include "model/checkpoint/checkpointing.h"
#include "model/training/parallel_context.h"
#include "model/training/sample_source.h"
#include "model/training/train_summary.h"
#include "parallel/communicator.h"

namespace mpitron {

class GPT;

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
  struct Impl;  // model/training/trainer_impl.h
  std::unique_ptr<Impl> impl_;
};

// Samples the run needs per split: train, valid, test (Megatron's formula).
std::vector<int64_t> samples_per_split(const TrainArgs& a);

}  // namespace mpitron
