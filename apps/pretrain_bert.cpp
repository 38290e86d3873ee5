// pretrain_bert — pretrain a BERT (masked LM + sentence order) on Megatron sentence
// data (Megatron-LM's pretrain_bert.py and its flags).
//   preprocess_data --input corpus.jsonl --output-prefix data/corpus --split-sentences
//     --tokenizer-type BertWordPieceLowerCase --vocab-file vocab.txt
//   pretrain_bert --num-layers 12 --hidden-size 768 --num-attention-heads 12 --seq-length 512
//     --micro-batch-size 8 --global-batch-size 64 --train-iters 10000 --lr 1e-4
//     --tokenizer-type BertWordPieceLowerCase --vocab-file vocab.txt
//     --data-path data/corpus_text_sentence --split 949,50,1
// Run pretrain_bert --help for every flag (the BERT group lists what differs from pretrain_gpt);
// the job is model/training/pretrain.h, the model model/bert.h, the samples data/bert_dataset.h.
#include "model/training/pretrain.h"

int main(int argc, char** argv) { return mpitron::pretrain_main(argc, argv, mpitron::PretrainModel::BERT); }
