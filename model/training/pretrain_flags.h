// model/training/pretrain_flags.h — pretrain_gpt's and pretrain_bert's flags as Boost option
// descriptions, for the tools that accept a pretraining script's arguments unchanged
// (generate_text, evaluate, text_generation_server: model/inference/inference_flags.h).
#pragma once
#include <boost/program_options.hpp>

namespace mpitron {

// Every flag of `pretrain_gpt --help` and `pretrain_bert --help` (GPT's first, then the
// BERT-only ones). Their value semantics write into storage owned here that nothing
// reads: use them to know a flag's name and arity, and semantic()->parse() to check a value.
const boost::program_options::options_description& pretrain_flag_descriptions();

}  // namespace mpitron
