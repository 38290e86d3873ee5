// model/checkpoint_args.h — the model flags (Megatron's GPT_ARGS) against a
// checkpoint's model_config: `--use-checkpoint-args` fills the ones not given,
// and every tool that loads a checkpoint (pretrain_gpt --load, generate_text,
// evaluate, text_generation_server) rejects a given flag that disagrees with it,
// naming the flag and both values.
#pragma once
#include <boost/program_options.hpp>
#include <string>

#include "model/config.h"

namespace mpitron {

// The model-shape flags and how each maps onto GPTConfig.
//   --num-layers --hidden-size --num-attention-heads --ffn-hidden-size
//   --seq-length --max-position-embeddings --layernorm-epsilon
// `fill`: set every flag not given on the command line from `saved`.
// Throws naming every flag whose given value differs from `saved` (`where`
// names the checkpoint in the message).
// `check_seq_length` false: --seq-length means something else to the caller
// (evaluate's window length) and is neither compared nor filled.
void reconcile_model_flags(const boost::program_options::variables_map& vm, const GPTConfig& saved, GPTConfig& m,
                           bool fill, const std::string& where, bool check_seq_length = true);

// Adds the model-shape flags above to a tool's options (values land in `m`), so
// that generate_text / evaluate / the server accept the GPT_ARGS of a Megatron script.
void add_model_shape_flags(boost::program_options::options_description& desc, GPTConfig& m);

}  // namespace mpitron
