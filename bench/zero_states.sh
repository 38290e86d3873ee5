#!/bin/bash
# bench/zero_states.sh — per-rank memory and step time of every way of holding the
# model states (model/training/model_states.h): --zero-stage 0, 1, 2, 3 at data
# parallelism 1, 2 and 4, on a GPT whose weights dominate (default 16 layers,
# hidden 512: 50M of its 77M parameters in blocks), with --mock-data (no files).
# For each run it prints rank 0's start-up estimate beside the measured peak of
# the log line (tensor memory; on CUDA the caching allocator's reserve too).
#   bench/zero_states.sh [DEVICE]           (cpu | cuda; default cpu)
# Env: BUILD (build), LAYERS (16), HIDDEN (512), HEADS (8), SEQ (64), ITERS (4),
#      DPS ("1 2 4"), STAGES ("0 1 2 3"), DTYPE ("" or --bf16), EXTRA (more flags).
# On CUDA with fewer GPUs than ranks the ranks share one GPU and their collectives go
# through MPI (--force-mpi-for-device): memory per rank is what this measures there.
set -euo pipefail
cd "$(dirname "$0")/.."
DEVICE=${1:-cpu}
BUILD=${BUILD:-build}; LAYERS=${LAYERS:-16}; HIDDEN=${HIDDEN:-512}; HEADS=${HEADS:-8}; SEQ=${SEQ:-64}; ITERS=${ITERS:-4}
DPS=${DPS:-"1 2 4"}; STAGES=${STAGES:-"0 1 2 3"}; DTYPE=${DTYPE:-}; EXTRA=${EXTRA:-}
OUT=$(mktemp -d /tmp/mpitron_zerobench.XXXXXX)
trap 'rm -rf "$OUT"' EXIT
force=""
[ "$DEVICE" = cuda ] && force="--force-mpi-for-device"
echo "# bench/zero_states.sh: GPT $LAYERS layers, hidden $HIDDEN, seq $SEQ, micro-batch 1, ${DTYPE:-f32} on $DEVICE, $ITERS steps"
printf '%-6s %-3s %12s %12s %12s %10s  %s\n' stage dp "est MB" "peak MB" "peak/est" "ms/step" "model states (est: weights | grads | master | moments)"
for dp in $DPS; do
  for stage in $STAGES; do
    [ "$dp" = 1 ] && [ "$stage" != 0 ] && continue  # one rank: every stage is the replicated one
    log="$OUT/z${stage}_dp$dp.log"
    OMP_NUM_THREADS=${OMP_NUM_THREADS:-1} mpirun --allow-run-as-root --oversubscribe -np "$dp" "$BUILD/apps/pretrain_gpt" \
      --num-layers "$LAYERS" --hidden-size "$HIDDEN" --num-attention-heads "$HEADS" --seq-length "$SEQ" \
      --micro-batch-size 1 --global-batch-size "$dp" --train-iters "$ITERS" --lr 1e-4 --mock-data \
      --vocab-file assets/gpt2/gpt2-vocab.json --merge-file assets/gpt2/gpt2-merges.txt --log-interval "$ITERS" --eval-iters 0 \
      --attention-dropout 0 --hidden-dropout 0 --zero-stage "$stage" --device "$DEVICE" $force $DTYPE $EXTRA \
      >"$log" 2>&1 || { echo "stage $stage dp $dp FAILED:"; tail -5 "$log"; continue; }
    est=$(grep -m1 'memory per rank (estimate)' "$log" | sed -E 's/.*total ([0-9.]+) MB.*/\1/')
    parts=$(grep -m1 'memory per rank (estimate)' "$log" | sed -E 's/.*weights ([0-9.]+) MB \| gradients ([0-9.]+) MB \| master weights ([0-9.]+) MB \| moments ([0-9.]+) MB.*/\1 | \2 | \3 | \4/')
    peak=$(grep 'peak memory (MB)' "$log" | tail -1 | sed -E 's/.*peak memory \(MB\): ([0-9.]+).*/\1/')
    ms=$(grep 'elapsed time per iteration' "$log" | tail -1 | sed -E 's/.*per iteration \(ms\): ([0-9.]+).*/\1/')
    printf '%-6s %-3s %12s %12s %12s %10s  %s\n' "$stage" "$dp" "$est" "$peak" \
      "$(python3 -c "print(f'{$peak/$est:.3f}')")" "$ms" "$parts"
  done
done
