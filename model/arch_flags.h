// model/arch_flags.h — the architecture flags (Megatron's names) that choose a
// model family's sublayers, shared by pretrain_gpt and the inference tools.
//
//   --normalization LayerNorm|RMSNorm     --norm-epsilon E (= --layernorm-epsilon)
//   --swiglu                              --position-embedding-type learned_absolute|rope|none
//   --rotary-base B  --rotary-percent P   --use-rotary-position-embeddings (= rope)
//   --no-position-embedding               --group-query-attention --num-query-groups G
//   --untie-embeddings-and-output-weights --disable-bias-linear
//   --exact-gelu (erf GELU, HF BERT)       --openai-gelu (tanh GELU, the default)
// A Llama model: --normalization RMSNorm --swiglu --position-embedding-type rope
//   --untie-embeddings-and-output-weights --disable-bias-linear [--group-query-attention
//   --num-query-groups 8] (docs/model-families.md).
#pragma once
#include <boost/program_options.hpp>
#include <string>

#include "model/config.h"

namespace mpitron {

// The flag values before they are applied (strings and raw switches).
struct ArchFlags {
  std::string normalization = "LayerNorm";
  std::string position_embedding_type = "learned_absolute";
  float norm_epsilon = 0.0f;
  bool swiglu = false, rope = false, no_position_embedding = false, gqa = false, untie = false, no_bias = false;
  bool exact_gelu = false, openai_gelu = false;
  int64_t num_query_groups = 1;  // Megatron's default with --group-query-attention
  double rotary_base = 10000.0, rotary_percent = 1.0;
};

void add_architecture_flags(boost::program_options::options_description& d, ArchFlags& f);
// Sets m's architecture fields from the parsed flags; throws naming the flags of
// any combination that cannot work (rope flags without rope, groups without
// --group-query-attention, two spellings that disagree, …).
void apply_architecture_flags(const boost::program_options::variables_map& vm, const ArchFlags& f, GPTConfig& m);
// True when any architecture flag was given on the command line.
bool architecture_flags_given(const boost::program_options::variables_map& vm);
// Copies the architecture fields (everything apply_architecture_flags sets, and the norm epsilon).
void copy_architecture(const GPTConfig& from, GPTConfig& to);
// The architecture fields of a and b that differ, as "--flag value (checkpoint: value)" items.
std::string architecture_differences(const GPTConfig& given, const GPTConfig& saved);

}  // namespace mpitron
