// pretrain_t5 — pretrain a T5 encoder-decoder (span corruption) on Megatron sentence data
// (Megatron-LM's pretrain_t5.py and its flags).
//   preprocess_data --input corpus.jsonl --output-prefix data/corpus --split-sentences
//     --tokenizer-type BertWordPieceLowerCase --vocab-file vocab.txt
//   pretrain_t5 --encoder-num-layers 12 --decoder-num-layers 12 --hidden-size 768 --num-attention-heads 12
//     --kv-channels 64 --ffn-hidden-size 3072 --encoder-seq-length 512 --decoder-seq-length 128
//     --max-position-embeddings 512 --micro-batch-size 16 --global-batch-size 128 --train-iters 1000000 --lr 1e-4
//     --tokenizer-type BertWordPieceLowerCase --vocab-file vocab.txt --vocab-extra-ids 100
//     --data-path data/corpus_text_sentence --split 949,50,1
// Hugging Face's T5 layout (RMSNorm, relative positions, no biases, ReLU or gated GELU):
//     --normalization RMSNorm --position-embedding-type relative --disable-bias-linear --relu (or --geglu)
// Run pretrain_t5 --help for every flag (the T5 group lists what differs from pretrain_gpt);
// the job is model/training/pretrain.h, the model model/t5.h, the samples data/t5_dataset.h.
#include "model/training/pretrain.h"

int main(int argc, char** argv) { return mpitron::pretrain_main(argc, argv, mpitron::PretrainModel::T5); }
