// model/checkpoint/megatron_checkpoint.h — a Megatron-LM / Megatron-Core checkpoint directory
// read as a --load checkpoint, under any mpitron layout, with no PyTorch (io/torch_checkpoint.h,
// io/torch_dist.h read the files).
//
// A directory DIR written by Megatron-LM's save_checkpoint holds latest_checkpointed_iteration.txt
// and iter_XXXXXXX/ in one of two formats (Megatron's --ckpt-format):
//   torch        iter_XXXXXXX/mp_rank_TT[_PPP]/model_optim_rng.pt   per TP (and PP) rank: 'args',
//                'iteration', 'model' (the local TP shards; decoder.layers.N numbered within the
//                pipeline stage), 'opt_param_scheduler', ...; distrib_optim.pt beside it under the
//                distributed optimizer (DistributedOptimizer.save_parameter_state: per grad buffer
//                the flat fp32 'param', 'exp_avg', 'exp_avg_sq' of every bucket, unpadded, concatenated)
//   torch_dist   iter_XXXXXXX/{metadata.json,.metadata,__R_N.distcp,common.pt}: global tensors, a
//                block's parameters stacked over the layers ("decoder.layers.mlp.linear_fc1.weight"
//                (L, 2F, C)); the optimizer in the 'dp_reshardable' layout: per model-parallel rank
//                (dp_group_idx = tp + TP·pp) and bucket, the padded flat buffer of param / exp_avg /
//                exp_avg_sq.
// The flat buffers are laid out as Megatron-Core's _ParamAndGradBuffer lays them (the stage's
// parameters in reverse registration order, each start padded to 64 elements, the tied embedding
// of a pipelined run in a bucket of its own, buckets of --ddp-bucket-size with
// --overlap-grad-reduce): megatron_buffer_layout() rebuilds that from the checkpoint's args.
//
// Names map by parameter role (model/param_table.h), not by string matching on mpitron's names:
//   embedding.word_embeddings.weight (V, C)          wte (vocab rows split over TP)
//   embedding.position_embeddings.weight (P, C)      wpe
//   decoder.layers.N.input_layernorm.{weight,bias}   ln1 (torch_dist / TE: linear_qkv.layer_norm_{weight,bias})
//   self_attention.linear_qkv.{weight,bias}          qkv: Megatron interleaves per query group
//                                                    [q_g (NH/G·HD); k_g (HD); v_g (HD)] for g = 0 … G−1,
//                                                    mpitron stores Q | K | V: a row permutation
//   self_attention.linear_proj.{weight,bias}         attn.proj (columns split over TP)
//   pre_mlp_layernorm.{weight,bias}                  ln2 (mlp.linear_fc1.layer_norm_{weight,bias})
//   mlp.linear_fc1.{weight,bias}                     mlp.fc: [gate; up] with SwiGLU (each TP shard its own
//                                                    [gate_t; up_t]), as mpitron's gate | up
//   mlp.linear_fc2.{weight,bias}                     mlp.proj
//   decoder.final_layernorm.{weight,bias}            lnf
//   output_layer.weight (V, C)                       head (untied only)
// Refused by name, with what to do: MoE, virtual pipeline stages, uneven pipeline splits, MLA,
// BERT / T5 / Megatron-DeepSpeed checkpoints (writing Megatron's legacy format: megatron_save.h).
#pragma once
#include <mpi.h>

#include <cstdint>
#include <string>
#include <vector>

#include "model/checkpoint/checkpointing.h"
#include "model/config.h"

namespace mpitron {

enum class MegatronFormat { None, Torch, TorchDist };
const char* to_string(MegatronFormat f);

// What load_dir holds: Megatron's tracker file and iter_XXXXXXX/ with mp_rank_* (torch) or
// metadata.json / .metadata (torch_dist); None for anything else (an mpitron checkpoint).
// `want` (Megatron's --ckpt-format; "" = detect) must name the format of a Megatron directory;
// it is not checked against mpitron's own checkpoints (Megatron scripts pass --ckpt-format with
// --save and --load of the same directory, where mpitron writes its own format).
struct MegatronDir {
  MegatronFormat format = MegatronFormat::None;
  std::string root, iter_dir;
  int64_t iteration = 0;
};
MegatronDir detect_megatron_checkpoint(const std::string& load_dir, const std::string& want = "");

// The model configuration from the checkpoint's args (argparse.Namespace); throws naming an
// argument that makes a model mpitron cannot build from it.
GPTConfig megatron_config(const std::string& load_dir);

// One entry of a model-parallel rank's flat grad buffer (Megatron-Core's param_index_map).
struct MegatronBufferEntry {
  std::string name;    // as in that rank's state dict: decoder.layers.<local N>.…
  Shape shape;         // the TP-local shape
  int64_t bucket = 0;
  int64_t start = 0;   // elements from the bucket's start
};
struct MegatronBufferLayout {
  std::vector<MegatronBufferEntry> entries;  // in buffer order (reverse registration order)
  std::vector<int64_t> bucket_numel_unpadded;
};
// The buffer of pipeline stage `pp` (tensor rank shapes) for a model of `c` as the writer's
// args describe it (tp, pp sizes; dp for the bucket padding; transformer_impl; bucket size).
struct MegatronLayoutArgs {
  int64_t tp = 1, pp = 1, dp = 1;
  bool te_names = false;      // transformer_impl "transformer_engine": fused norm names and order
  int64_t bucket_size = 0;    // 0: one bucket (no --overlap-grad-reduce)
};
MegatronBufferLayout megatron_buffer_layout(const GPTConfig& c, const MegatronLayoutArgs& a, int64_t pp_rank);

// load_checkpoint (model/checkpoint/checkpointing.h) for a Megatron directory: fills the model's
// values, opt [begin, end) (fp32 master weights and Adam moments from the distributed
// optimizer's state), the iteration, consumed samples; checks the LR schedule
// (opt_param_scheduler) against o.lr_schedule. Collective over comm only for the byte count.
bool load_megatron_checkpoint(const MegatronDir& d, GPT& model, OptimState& opt, int64_t begin, int64_t end,
                              TrainState& st, const LoadOptions& o, SaveInfo* info, MPI_Comm comm);

}  // namespace mpitron
