// model/inference/inference_flags.h — what a Megatron generation or evaluation script passes
// to generate_text, evaluate and text_generation_server beside their own flags:
// the same GPT_ARGS as pretraining. The model shape is checked against the
// checkpoint (an error names each flag that disagrees), --fp16/--bf16 choose the
// compute dtype of the loaded model (the tools take --tokenizer-type themselves),
// and flags that mean nothing for inference are accepted with one start-up note
// each (as are Megatron's performance switches, model/training/megatron_compat.h).
#pragma once
#include <boost/program_options.hpp>
#include <string>
#include <vector>

#include "model/arch_flags.h"
#include "model/config.h"
#include "tensor/dtype.h"

namespace mpitron {

struct InferenceFlags {
  GPTConfig shape;                                // the model-shape flags, where given
  ArchFlags arch;                                 // the architecture flags, where given
  bool fp16 = false, bf16 = false;                // --fp16 / --bf16
  std::vector<std::string> notes;                 // one start-up line per accepted no-op flag
  bool with_seq_length = true;                    // --seq-length is the training length (not evaluate's window)
  DType dtype() const { return bf16 ? DType::BF16 : fp16 ? DType::F16 : DType::F32; }
};

// `with_seq_length`: false for evaluate, whose --seq-length is its window length.
void add_inference_flags(boost::program_options::options_description& desc, InferenceFlags& f, bool with_seq_length);

// After parsing: validates and collects the notes. Throws naming the flag.
void check_inference_flags(const boost::program_options::variables_map& vm, InferenceFlags& f);

// Every model-shape flag given must equal the checkpoint's value.
void check_against_checkpoint(const boost::program_options::variables_map& vm, const InferenceFlags& f,
                              const GPTConfig& checkpoint, const std::string& load_dir);

}  // namespace mpitron
