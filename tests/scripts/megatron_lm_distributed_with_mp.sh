#!/bin/bash
# Megatron-LM's examples/pretrain_gpt_distributed_with_mp.sh (tensor and pipeline
# model parallelism, distributed optimizer, Megatron-Core flags), run by mpitron.
# Changed: the launcher, the paths and the sizes; every flag is the script's own.

# --- launcher and paths ----------------------------------------------------------------
LAUNCHER=${LAUNCHER:-"mpirun --allow-run-as-root --oversubscribe -np 4"}
PRETRAIN_GPT=${MPITRON_BUILD:?}/apps/pretrain_gpt
CHECKPOINT_PATH=${CHECKPOINT_PATH:?}
VOCAB_FILE=${VOCAB_FILE:?}
MERGE_FILE=${MERGE_FILE:?}
DATA_PATH=${DATA_PATH:?}
TENSORBOARD_LOGS_PATH=${TENSORBOARD_LOGS_PATH:-$CHECKPOINT_PATH/tb}
# --------------------------------------------------------------------------------------

export CUDA_DEVICE_MAX_CONNECTIONS=1

GPT_MODEL_ARGS=(
    --num-layers 4
    --hidden-size 64
    --num-attention-heads 4
    --seq-length 64
    --max-position-embeddings 64
)

TRAINING_ARGS=(
    --micro-batch-size 2
    --global-batch-size 8
    --train-iters 4
    --weight-decay 0.1
    --adam-beta1 0.9
    --adam-beta2 0.95
    --init-method-std 0.006
    --clip-grad 1.0
    --bf16
    --lr 6.0e-5
    --lr-decay-style cosine
    --min-lr 6.0e-6
    --lr-warmup-fraction .001
    --lr-decay-iters 4
    --use-mcore-models
    --transformer-impl local
    --use-distributed-optimizer
    --overlap-grad-reduce
    --overlap-param-gather
    --no-gradient-accumulation-fusion
    --recompute-granularity selective
)

MODEL_PARALLEL_ARGS=(
    --tensor-model-parallel-size 2
    --pipeline-model-parallel-size 2
    --sequence-parallel
)

DATA_ARGS=(
    --data-path $DATA_PATH
    --vocab-file $VOCAB_FILE
    --merge-file $MERGE_FILE
    --split 949,50,1
    --data-impl mmap
    --num-workers 2
)

EVAL_AND_LOGGING_ARGS=(
    --log-interval 1
    --save-interval 2
    --eval-interval 2
    --save $CHECKPOINT_PATH
    --load $CHECKPOINT_PATH
    --eval-iters 1
    --tensorboard-dir $TENSORBOARD_LOGS_PATH
    --log-throughput
    --timing-log-level 0
    --use-dist-ckpt
    --ckpt-format torch_dist
)

$LAUNCHER $PRETRAIN_GPT \
    ${GPT_MODEL_ARGS[@]} \
    ${TRAINING_ARGS[@]} \
    ${MODEL_PARALLEL_ARGS[@]} \
    ${DATA_ARGS[@]} \
    ${EVAL_AND_LOGGING_ARGS[@]}
