// model/flags/inference_flags.h — what a Megatron generation, serving or evaluation
// script passes to generate_text, text_generation_server and evaluate beside their own
// flags: the whole argument list of a pretraining script (GPT_ARGS, DATA_ARGS,
// OUTPUT_ARGS), the parallel layout, and the dynamic engine's flags.
//
//  * model flags (the rows of model/arch_fields.h, registered by model/flags/model_flags.h)
//    are checked against the checkpoint: an error names each flag that disagrees, with both values;
//  * --fp16/--bf16 choose the compute dtype, --device the device,
//    --tensor-model-parallel-size / --pipeline-model-parallel-size the layout
//    the tool runs under (mpirun -np TP×PP); model/inference/runner_flags.h turns them
//    into the model runner's options;
//  * --inference-dynamic-batching* and --enable-chunked-prefill configure the
//    dynamic engine (model/inference/dynamic_engine.h);
//  * every other flag of pretrain_gpt or pretrain_bert (--lr, --global-batch-size,
//    --data-path, --save-interval, …) is a training flag: its value is checked as
//    pretraining checks it and ONE start-up line lists them all as having no
//    effect here; a few with a reason of their own (--no-load-optim, the
//    dropouts, …) and Megatron's performance switches get a line each. The tool
//    passes pretraining's flags in (model/training/pretrain_flags.h): this layer sits
//    below training and inference and includes neither;
//  * a flag no tool of ours knows stays an error naming it.
// A tool's own flag of the same name (evaluate's --seq-length, generate_text's
// --seed, --micro-batch-size, evaluate's --log-interval) wins: the tool declares
// its flags first and add_inference_flags adds only the names still missing.
#pragma once
#include <boost/program_options.hpp>
#include <string>
#include <vector>

#include "model/arch_fields.h"
#include "model/config.h"
#include "tensor/dtype.h"

namespace mpitron {

struct DynamicBatchingFlags {
  bool enabled = false;         // --inference-dynamic-batching: the server batches requests (else one at a time)
  double buffer_size_gb = 0;    // --inference-dynamic-batching-buffer-size-gb: KV cache per rank, GiB
                                //   (0: room for max-requests sequences of max_position_embeddings, at most
                                //   1 GiB, at least one sequence)
  int64_t block_size = 256;     // --inference-dynamic-batching-block-size: positions per KV block
  int64_t max_requests = 0;     // --inference-dynamic-batching-max-requests: requests in flight (0: the tool's default)
  int64_t max_tokens = 512;     // --inference-dynamic-batching-max-tokens: tokens per step
  bool chunked_prefill = false; // --enable-chunked-prefill: prompts split over steps
  int64_t num_speculative_tokens = 0;  // --num-speculative-tokens: MTP drafts per step (greedy requests)
  bool prefix_caching = false;  // --inference-dynamic-batching-prefix-caching: requests share the KV blocks of a
                                //   common prompt prefix (model/inference/prefix_cache.h); needs --inference-dynamic-batching
  std::string prefix_caching_eviction_policy = "ref_zero";  // --inference-dynamic-batching-prefix-caching-eviction-policy:
                                //   ref_zero (a block leaves the cache with its last request) | lru (kept until needed)
};

struct InferenceFlags {
  GivenFlags given;                      // the model and architecture flags given (model/arch_fields.h)
  bool fp16 = false, bf16 = false;       // --fp16 / --bf16
  int64_t tp = 1, pp = 1;                // --tensor-model-parallel-size / --pipeline-model-parallel-size
  std::string device = "auto";           // --device: auto | cpu | cuda
  bool force_mpi_for_device = false;     // --force-mpi-for-device: MPI (host-staged) for GPU tensors
  DynamicBatchingFlags batching;
  std::vector<std::string> notes;        // start-up lines: flags accepted with no effect here
  std::vector<std::string> training_only;  // the pretraining flags added by add_inference_flags
  std::vector<std::string> no_op;          // the no-op flags with a reason of their own it added
  bool with_seq_length = true;           // --seq-length is the training length (not evaluate's window)
  // Pretraining's flags (add_inference_flags' argument): each one's name, arity and value check.
  const boost::program_options::options_description* pretraining = nullptr;
  DType dtype() const { return bf16 ? DType::BF16 : fp16 ? DType::F16 : DType::F32; }
};

// `with_seq_length`: false for evaluate, whose --seq-length is its window length.
// `pretraining`: every flag of the pretraining tools (pretrain_flag_descriptions()); it
// must outlive f. Adds only flags `desc` does not have yet (declare the tool's own first).
void add_inference_flags(boost::program_options::options_description& desc, InferenceFlags& f, bool with_seq_length,
                         const boost::program_options::options_description& pretraining);

// After parsing: validates the values (a training flag's as pretraining would) and collects the notes.
void check_inference_flags(const boost::program_options::variables_map& vm, InferenceFlags& f);

// Every model and architecture flag given must equal the checkpoint's value. A BERT is refused, and a
// T5 unless allow_t5 (generate_text decodes one; evaluate and the server run decoder models only).
void check_against_checkpoint(const boost::program_options::variables_map& vm, const InferenceFlags& f,
                              const GPTConfig& checkpoint, const std::string& load_dir, bool allow_t5 = false);

}  // namespace mpitron
