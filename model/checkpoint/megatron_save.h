// model/checkpoint/megatron_save.h — a model written as a Megatron-LM legacy `torch` checkpoint
// (Megatron's --ckpt-format torch), which Megatron-LM's load_checkpoint and megatron-core's
// GPTModel.load_state_dict read, with no PyTorch here (io/torch_save.h writes the files):
//
//   DIR/latest_checkpointed_iteration.txt            "N"
//   DIR/iter_XXXXXXX/mp_rank_TT[_PPP]/model_optim_rng.pt     one per Megatron TP (× PP) rank:
//     'args'                 argparse.Namespace: the model's Megatron arguments (num_layers, hidden_size,
//                            num_query_groups, swiglu, normalization, position_embedding_type,
//                            padded_vocab_size, tensor/pipeline_model_parallel_size, transformer_impl
//                            'local', ckpt_format 'torch', iteration, consumed_train_samples, seed, …)
//     'checkpoint_version'   3.0
//     'iteration'            N
//     'model'                OrderedDict of the local spec's state dict (GPTModel
//                            state_dict_for_save_checkpoint): the rank's TP shards, fp32, decoder.layers.N
//                            numbered within the pipeline stage, `_extra_state` None for each parallel
//                            linear layer (strict loading asks for them)
// The names, splits and fused layouts come from the same table the reader uses
// (model/checkpoint/megatron_names.h), reversed: mpitron's Q | K | V rows interleaved per query group,
// SwiGLU's gate | up each split over TP as Megatron's [gate_t; up_t], the vocabulary rows of the
// embedding and output layer split over TP, the tied embedding's copy as output_layer.weight on the
// last stage of a pipelined layout.
//
// Model only: no 'optimizer', 'opt_param_scheduler' or 'rng_state'. Megatron-LM loads it with
// --no-load-optim --no-load-rng (keeps the iteration) or --finetune (starts at 0). mpitron's own
// reader loads it back (pretrain_gpt --load DIR --ckpt-format torch --no-load-optim).
// Refused by name: a model GPTModel cannot express (the round trip through the args must give
// back the same architecture), TP that does not divide the heads / groups / FFN / vocabulary,
// PP that does not divide the layers.
#pragma once
#include <mpi.h>

#include <cstdint>
#include <string>
#include <vector>

#include "model/checkpoint/checkpointing.h"
#include "model/gpt.h"

namespace mpitron {

struct MegatronSaveOptions {
  int64_t tp = 1, pp = 1;  // the layout written: Megatron loads it at this TP × PP
  int64_t make_vocab_size_divisible_by = 128;  // recorded in args (Megatron compares it with --vocab-file)
  std::string tokenizer_type = "GPT2BPETokenizer";  // recorded in args (Megatron compares it with --vocab-file)
  bool overwrite = false;  // replace an existing iter_XXXXXXX/ holding Megatron files
  bool write_tracker = true;  // false: the directory's tracker is mpitron's (the same text)
};

struct MegatronSaved {
  std::string iter_dir;
  std::vector<std::string> files;  // in (pp, tp) order
  uint64_t bytes = 0;
};

// Writes model (one process, every parameter local: TP1 PP1, no ZeRO-3 sharding) and st's
// iteration / consumed samples / seed into dir. The tracker file is replaced last.
MegatronSaved save_megatron_checkpoint(const GPT& model, const TrainState& st, const std::string& dir,
                                       const MegatronSaveOptions& o);

// Refuses, naming the flag, a model or layout save_megatron_checkpoint cannot write (at start-up,
// before any training).
void check_megatron_save(const GPTConfig& c, const MegatronSaveOptions& o);

// pretrain_gpt --save DIR --ckpt-format torch: after mpitron's own checkpoint of the latest
// iteration is committed in DIR, rank 0 reads it back whole (one process, on the host) and writes
// Megatron's files beside it, in the same iter_XXXXXXX/ (mp_rank_*/model_optim_rng.pt next to
// mpitron's model_optim_rng.h5; the tracker is mpitron's, the same text). mpitron resumes the
// directory from its own file (with the optimizer); Megatron-LM from its files (model only).
// Collective over comm: an error on rank 0 is thrown on every rank.
void save_megatron_beside(const std::string& save_dir, const MegatronSaveOptions& o, MPI_Comm comm);

}  // namespace mpitron
