// model/training/pretrain.h — the body of apps/pretrain_gpt, apps/pretrain_bert and apps/pretrain_t5:
// MPI start-up, flags, the parallel runtime, tokenizer, data, Trainer, summary line.
#pragma once

namespace mpitron {

enum class PretrainModel { GPT, BERT, T5 };

// Runs a whole pretraining job; returns the process exit code (errors are printed).
int pretrain_main(int argc, char** argv, PretrainModel which);

}  // namespace mpitron
