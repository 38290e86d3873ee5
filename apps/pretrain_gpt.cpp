// pretrain_gpt — train a GPT on Megatron .bin/.idx data (Megatron-LM's flags).
//   pretrain_gpt --num-layers 4 --hidden-size 256 --num-attention-heads 4 --seq-length 256
//     --micro-batch-size 8 --global-batch-size 16 --train-iters 1000 --lr 6e-4
//     --data-path data/shakespeare_text_document --save ckpt --tensorboard-dir tb
// Run pretrain_gpt --help for every flag; the job is model/training/pretrain.h.
#include "model/training/pretrain.h"

int main(int argc, char** argv) { return mpitron::pretrain_main(argc, argv, mpitron::PretrainModel::GPT); }
