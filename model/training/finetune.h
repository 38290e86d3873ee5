// model/training/finetune.h — fine-tuning a pretrained BERT on a sequence-classification
// task (Megatron-LM's tasks/main.py --task MNLI: tasks/glue/, tasks/finetune_utils.py).
// docs/finetune.md has the workflow, the flags and how to add a task.
//
//   model:  Bert with cfg.num_classes = K (model/bert.h): encoder, pooler tanh(dense(h[CLS])),
//           dropout, classification_head (K, C); loss = mean cross-entropy over the batch
//   data:   a task's reader turns each file into examples (text_a, text_b, label, uid);
//           build_classification_sample makes [CLS] A [SEP] B [SEP] + [PAD]s of --seq-length
//           (Megatron's build_tokens_types_paddings_from_text)
//   start:  init_weights(--seed), then --pretrained-checkpoint's encoder weights (embeddings,
//           blocks, final norm, the pooler when it has one); the classification head stays
//           fresh, and neither the optimizer state nor the iteration is loaded (Megatron)
//   train:  the trainer's loop (model/training/trainer.h: the same steps, model states,
//           logging and checkpoints as pretrain_gpt). --epochs over the train files,
//           shuffled per epoch (seed + epoch); a step is a global batch (--global-batch-size,
//           default micro x dp) of consecutive samples of the epoch's order, cut into
//           micro-batches of --micro-batch-size; micro-batch k of a step runs on
//           data-parallel rank k % dp; the last partial global batch of an epoch is dropped
//           (Megatron's drop_last). AdamW, linear warmup over --lr-warmup-fraction of the
//           steps, then --lr-decay-style down to --min-lr.
//   eval:   accuracy (argmax of the logits) on each --valid-data file, after every epoch and
//           every --eval-interval steps, the samples dealt to the dp ranks
// Layouts: data x tensor x pipeline parallel, ZeRO 0-3 (--zero-stage), bf16; no sequence
// parallelism (the pooler reads the [CLS] rows) and no virtual pipeline stages.
#pragma once
#include <mpi.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "data/text_tokenizer.h"
#include "model/bert.h"
#include "model/config.h"
#include "model/training/optimizer.h"

namespace mpitron {

// One labelled text pair of a classification task (Megatron's sample dict).
struct ClassificationExample {
  std::string text_a, text_b;  // after clean_text; text_b empty for single-sentence tasks
  int32_t label = 0;           // class index in the task's label order
  int64_t uid = 0;             // the file's id column
};

// A task: its classes and how one file is read. Adding a task = one entry in
// classification_tasks() (finetune.cpp) with a reader; docs/finetune.md.
struct ClassificationTask {
  std::string name;                 // --task
  std::vector<std::string> labels;  // class index -> label text (Megatron's LABELS order)
  std::function<std::vector<ClassificationExample>(const std::string& path)> read;
};

// Every task finetune knows, and the one named by --task (throws naming --task and the known ones).
const std::vector<ClassificationTask>& classification_tasks();
const ClassificationTask& find_classification_task(const std::string& name);

// Megatron's tasks/data_utils.py clean_text: newlines to spaces, runs of whitespace to one
// space, then " . " -> ". " three times.
std::string clean_text(const std::string& text);

// Megatron's tasks/glue/mnli.py: a TSV with a header row; column 0 the id, 8 sentence1,
// 9 sentence2, the last column gold_label (contradiction / entailment / neutral -> 0 / 1 / 2).
// A header of exactly 10 columns is a test file without labels: every label is `test_label`.
// Lines are stripped of surrounding whitespace and split on tabs (Python's
// line.strip().split('\t')). Throws naming file:line for a short row, an empty sentence, a
// negative or non-integer id, or a label that is not one of the three (e.g. "-").
std::vector<ClassificationExample> read_mnli_tsv(const std::string& path, const std::string& test_label = "");

// One fixed-length model input.
struct ClassificationSample {
  std::vector<int32_t> tokens;  // [seq_length] [CLS] A [SEP] B [SEP], then [PAD]
  std::vector<int32_t> types;   // [seq_length] 0 for [CLS] A [SEP], 1 for B [SEP], 0 on padding
  int32_t length = 0;           // tokens before the padding
  int32_t label = 0;
  int64_t uid = 0;
};

// Megatron's build_tokens_types_paddings_from_ids: [CLS] A [SEP] (B), cut to seq_length − 1
// tokens when it reaches seq_length, then [SEP] (when there is a B or it was cut), then
// [PAD]s. Megatron pads the types with pad_id; here they are 0 (the same for every BERT
// vocab, where [PAD] is id 0), so a type is always a valid token-type row.
ClassificationSample build_classification_sample(const std::vector<int32_t>& ids_a, const std::vector<int32_t>* ids_b,
                                                 int64_t seq_length, int32_t cls, int32_t sep, int32_t pad);
// The same from text: the tokenizer's ids of text_a and text_b (no special tokens added).
ClassificationSample build_classification_sample(const data::TextTokenizer& tok, const ClassificationExample& ex,
                                                 int64_t seq_length);

// A micro-batch for Bert (class_labels set; no MLM labels).
BertBatch classification_batch(const std::vector<const ClassificationSample*>& samples);

// --pretrained-checkpoint: the newest checkpoint of `dir` (pretrain_bert's, or any BERT
// checkpoint of this format, saved under any layout) into `model`'s encoder: every
// parameter but the classification head, the pooler and token types only when the
// checkpoint has them (else they keep their init; listed in `fresh`). The saved model's
// shape must equal the run's: a difference throws naming the flags. Collective over comm
// (MPI_COMM_NULL: one process). Writes the values (and nothing of the optimizer).
struct PretrainedLoad {
  std::string path;                  // the checkpoint file read
  std::vector<std::string> loaded;   // parameter names taken from it
  std::vector<std::string> fresh;    // this model's parameters it did not have
};
// `tokenizer`: this run's data::tokenizer_identity JSON ("" = not checked); a checkpoint
// trained with another tokenizer is refused unless allow_tokenizer_change (checkpointing.h).
PretrainedLoad load_pretrained_encoder(const std::string& dir, GPT& model, MPI_Comm comm = MPI_COMM_NULL,
                                       const std::string& tokenizer = "", bool allow_tokenizer_change = false);

// The flags (Megatron's names; apps/finetune.cpp).
struct FinetuneArgs {
  std::string task;                        // --task
  std::vector<std::string> train_data;     // --train-data F [F ...]
  std::vector<std::string> valid_data;     // --valid-data F [F ...]
  std::string pretrained_checkpoint;       // --pretrained-checkpoint DIR ("" = from scratch)
  GPTConfig model;                         // the shape flags, plus BERT's (bert, bidirectional, 2 token types)
  OptimizerConfig optim;                   // --weight-decay --clip-grad --adam-beta1/2 --adam-eps
  int64_t epochs = 3;                      // --epochs
  int64_t micro_batch_size = 4;            // --micro-batch-size
  int64_t global_batch_size = 0;           // --global-batch-size (0: micro x dp)
  float lr = 1e-4f, min_lr = 0.0f;         // --lr --min-lr
  std::string lr_decay_style = "linear";   // --lr-decay-style
  float lr_warmup_fraction = 0.0f;         // --lr-warmup-fraction
  std::string tokenizer_type = "BertWordPieceLowerCase";  // --tokenizer-type
  std::string vocab_file;                  // --vocab-file
  bool allow_tokenizer_change = false;     // --allow-tokenizer-change: the pretrained checkpoint's may differ
  int64_t make_vocab_size_divisible_by = 128;
  std::string save;                        // --save DIR: after every epoch (and --save-interval steps)
  int64_t save_interval = 0;               // --save-interval
  int64_t log_interval = 10;               // --log-interval
  int64_t eval_interval = 0;               // --eval-interval (0: only after each epoch)
  uint64_t seed = 1234;                    // --seed
  int64_t tensor_model_parallel_size = 1;  // --tensor-model-parallel-size
  int64_t pipeline_model_parallel_size = 1;  // --pipeline-model-parallel-size
  int64_t zero_stage = 0;                  // --zero-stage 0..3 (--use-distributed-optimizer = 1)
  bool bf16 = false;                       // --bf16
  bool recompute_activations = false;      // --recompute-activations
  std::string device = "auto";             // --device auto|cpu|cuda
  bool force_mpi_for_device = false;       // --force-mpi-for-device
  std::string flags_json;                  // the command line, for checkpoints
};

// Parses argv (throws naming a bad or unsupported flag). False when --help was printed.
bool parse_finetune_args(int argc, char** argv, FinetuneArgs& out);

struct FinetuneResult {
  std::vector<double> losses;            // per step: the global batch's mean loss
  std::vector<double> accuracies;        // after each epoch: correct / total over every --valid-data file
  int64_t steps = 0;
};

// The whole run, collective over `world` (every rank, same args).
FinetuneResult run_finetune(const FinetuneArgs& args, MPI_Comm world);

}  // namespace mpitron
