#!/bin/bash
# Megatron-LM's examples/evaluate_zeroshot_gpt.sh (LAMBADA, strict), run by mpitron's
# evaluate on the checkpoint of megatron_lm_pretrain_gpt.sh. Changed: the launcher
# (evaluate runs on one process), the paths and the sizes; every flag is the script's own.

# --- launcher and paths ----------------------------------------------------------------
LAUNCHER=${LAUNCHER:-""}
EVALUATE=${MPITRON_BUILD:?}/apps/evaluate
VALID_DATA=${LAMBADA_DATA:?}
VOCAB_FILE=${VOCAB_FILE:?}
MERGE_FILE=${MERGE_FILE:?}
CHECKPOINT=${CHECKPOINT_PATH:?}
# --------------------------------------------------------------------------------------

TASK="LAMBADA"

$LAUNCHER $EVALUATE \
               --task $TASK \
               --valid-data $VALID_DATA \
               --tokenizer-type GPT2BPETokenizer \
               --strict-lambada \
               --vocab-file $VOCAB_FILE \
               --merge-file $MERGE_FILE \
               --load $CHECKPOINT \
               --tensor-model-parallel-size 1 \
               --num-layers 2 \
               --hidden-size 64 \
               --num-attention-heads 4 \
               --micro-batch-size 8 \
               --seq-length 64 \
               --max-position-embeddings 64 \
               --log-interval 10 \
               --fp16 \
               --no-load-optim \
               --no-load-rng
