#!/bin/bash
# A BigScience-style Megatron-DeepSpeed training script (tr1-13B shape: samples-based
# schedule with underscores, DeepSpeed JSON written inline, ZeRO-1, fp16 with
# DeepSpeed's dynamic loss scaling, activation checkpointing), run by mpitron.
# Changed: the launcher (mpirun instead of deepspeed/srun), the paths and the sizes.

# --- launcher and paths ----------------------------------------------------------------
LAUNCHER=${LAUNCHER:-"mpirun --allow-run-as-root --oversubscribe -np 2"}
PRETRAIN_GPT=${MPITRON_BUILD:?}/apps/pretrain_gpt
CHECKPOINT_PATH=${CHECKPOINT_PATH:?}
VOCAB_FILE=${VOCAB_FILE:?}
MERGE_FILE=${MERGE_FILE:?}
DATA_PATH=${DATA_PATH:?}
TENSORBOARD_PATH=${TENSORBOARD_PATH:-$CHECKPOINT_PATH/tensorboard}
SLURM_JOBID=${SLURM_JOBID:-$$}
# --------------------------------------------------------------------------------------

TP_SIZE=1
PP_SIZE=1

MICRO_BATCH_SIZE=2
GLOBAL_BATCH_SIZE=8

NLAYERS=2
NHIDDEN=64
NHEADS=4
SEQ_LEN=64

SAVE_INTERVAL=4

OPTIMIZER_ARGS=" \
    --optimizer adam \
    --adam-beta1 0.9 \
    --adam-beta2 0.999 \
    --adam-eps 1e-8 \
    --lr 1e-4 \
    --min-lr 1e-5 \
    --lr-decay-style cosine \
    --lr-decay-samples 1_000 \
    --lr-warmup-samples 16 \
    --clip-grad 1.0 \
    --weight-decay 1e-1 \
    "

EXIT_OPTS=" \
    --exit-duration-in-mins 1190 \
    "

GPT_ARGS=" \
    --num-layers $NLAYERS \
    --hidden-size $NHIDDEN \
    --num-attention-heads $NHEADS \
    --seq-length $SEQ_LEN \
    --max-position-embeddings $SEQ_LEN \
    --micro-batch-size $MICRO_BATCH_SIZE \
    --global-batch-size $GLOBAL_BATCH_SIZE \
    --train-samples 48 \
    --vocab-file $VOCAB_FILE \
    --merge-file $MERGE_FILE \
    --clip-grad 1.0 \
    --fp16 \
    --checkpoint-activations \
    --seed 42
    $OPTIMIZER_ARGS \
    $EXIT_OPTS \
    "

OUTPUT_ARGS=" \
    --log-interval 1 \
    --save-interval $SAVE_INTERVAL \
    --eval-interval 3 \
    --eval-iters 1 \
    --tensorboard-dir $TENSORBOARD_PATH \
    --tensorboard-queue-size 5 \
    --log-batch-size-to-tensorboard \
    --log-validation-ppl-to-tensorboard \
    "

ZERO_STAGE=1

config_json="$CHECKPOINT_PATH/ds_config.$SLURM_JOBID.json"
mkdir -p "$CHECKPOINT_PATH"

# Deepspeed figures out GAS dynamically from dynamic GBS via set_train_batch_size()
cat <<EOT > $config_json
{
  "train_micro_batch_size_per_gpu": $MICRO_BATCH_SIZE,
  "train_batch_size": $GLOBAL_BATCH_SIZE,
  "gradient_clipping": 1.0,
  "zero_optimization": {
    "stage": $ZERO_STAGE
  },
  "fp16": {
    "enabled": true,
    "loss_scale": 0,
    "loss_scale_window": 500,
    "hysteresis": 2,
    "min_loss_scale": 1,
    "initial_scale_power": 12
  },
  "steps_per_print": 2000,
  "wall_clock_breakdown": false
}
EOT

DEEPSPEED_ARGS=" \
    --deepspeed \
    --deepspeed_config ${config_json} \
    --zero-stage ${ZERO_STAGE} \
    --deepspeed-activation-checkpointing \
    "

export CMD=" \
    $PRETRAIN_GPT \
    --tensor-model-parallel-size $TP_SIZE \
    --pipeline-model-parallel-size $PP_SIZE \
    $GPT_ARGS \
    $OUTPUT_ARGS \
    --save $CHECKPOINT_PATH \
    --load $CHECKPOINT_PATH \
    --data-path $DATA_PATH \
    --data-impl mmap \
    --split 949,50,1 \
    --distributed-backend nccl \
     $DEEPSPEED_ARGS \
    "

$LAUNCHER $CMD
