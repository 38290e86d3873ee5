// finetune — fine-tune a pretrained BERT on a sequence-classification task, as Megatron-LM's
// tasks/main.py --task MNLI (model/training/finetune.h; docs/finetune.md).
//   mpirun -np 2 build/apps/finetune --task MNLI --train-data train.tsv --valid-data dev_matched.tsv
//       --pretrained-checkpoint bert_ckpt --vocab-file vocab.txt --tokenizer-type BertWordPieceLowerCase
//       --num-layers 12 --hidden-size 768 --num-attention-heads 12 --seq-length 128
//       --max-position-embeddings 512 --epochs 3 --micro-batch-size 8 --lr 5e-5
//       --lr-warmup-fraction 0.065 --weight-decay 1e-2 --log-interval 100 --save ckpt_mnli
// Every rank runs the same command: world = tensor x pipeline x data parallel.
#include <mpi.h>

#include <cstdio>
#include <exception>

#include "model/training/finetune.h"
#include "parallel/job_exit.h"

using namespace mpitron;

int main(int argc, char** argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_FUNNELED, &provided);
  int rank = 0, world = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  set_process_rank(world > 1 ? rank : -1);  // the trainer's log lines: rank 0's only
  install_job_exit();  // a collective that times out ends every rank (parallel/job_exit.h)
  int rc = 0;
  try {
    FinetuneArgs args;
    if (parse_finetune_args(argc, argv, args)) run_finetune(args, MPI_COMM_WORLD);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s\n", e.what());
    std::fflush(stderr);
    rc = 1;
  }
  return finish_job(rc);  // a failed rank ends every rank within kJobExitGraceS
}
