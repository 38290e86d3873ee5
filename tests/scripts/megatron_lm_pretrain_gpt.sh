#!/bin/bash
# Megatron-LM's examples/pretrain_gpt.sh ("345M" GPT on one node), run by mpitron.
# Changed: the launcher (mpirun instead of torchrun), the paths, and the sizes
# (shrunk so CI runs it in seconds). Every flag is the script's own.

# --- launcher and paths (the only lines a user changes) -----------------------------
LAUNCHER=${LAUNCHER:-"mpirun --allow-run-as-root --oversubscribe -np 2"}
PRETRAIN_GPT=${MPITRON_BUILD:?}/apps/pretrain_gpt
CHECKPOINT_PATH=${CHECKPOINT_PATH:?}
VOCAB_FILE=${VOCAB_FILE:?}
MERGE_FILE=${MERGE_FILE:?}
DATA_PATH=${DATA_PATH:?}
# --------------------------------------------------------------------------------------

export CUDA_DEVICE_MAX_CONNECTIONS=1

GPT_ARGS="
    --num-layers 2 \
    --hidden-size 64 \
    --num-attention-heads 4 \
    --seq-length 64 \
    --max-position-embeddings 64 \
    --micro-batch-size 2 \
    --global-batch-size 8 \
    --lr 0.00015 \
    --train-iters 6 \
    --lr-decay-iters 5 \
    --lr-decay-style cosine \
    --min-lr 1.0e-5 \
    --weight-decay 1e-2 \
    --lr-warmup-fraction .01 \
    --clip-grad 1.0 \
    --fp16
"

DATA_ARGS="
    --data-path $DATA_PATH \
    --vocab-file $VOCAB_FILE \
    --merge-file $MERGE_FILE \
    --split 949,50,1
"

OUTPUT_ARGS="
    --log-interval 1 \
    --save-interval 3 \
    --eval-interval 3 \
    --eval-iters 1
"

$LAUNCHER $PRETRAIN_GPT \
    $GPT_ARGS \
    $DATA_ARGS \
    $OUTPUT_ARGS \
    --distributed-backend nccl \
    --save $CHECKPOINT_PATH \
    --load $CHECKPOINT_PATH
