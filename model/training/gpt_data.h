// model/training/gpt_data.h — the trainer's samples from Megatron data: --data-path
// (one prefix, or weights and prefixes to blend) split by --split into train,
// valid and test GPT datasets (data/gpt_dataset.h, data/blended_dataset.h).
#pragma once
#include <memory>

#include "model/training/trainer.h"

namespace mpitron {

// Builds the three splits with the sample counts the run needs; validates that
// every token id is below the tokenizer's vocabulary (vocab_size).
std::shared_ptr<SampleSource> make_gpt_data(const TrainArgs& args, int64_t vocab_size);

}  // namespace mpitron
