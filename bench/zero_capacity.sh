#!/bin/bash
# bench/zero_capacity.sh — the largest GPT that trains in a fixed per-rank memory cap
# (--memory-cap), per way of holding the model states: for each --zero-stage it grows
# --num-layers over LAYERS until the start-up estimate is refused by the cap, training
# 2 steps of every size that is accepted and checking the measured peak against the cap.
#   bench/zero_capacity.sh [DEVICE]           (cpu | cuda; default cpu)
# Env: BUILD (build), CAP (MB per rank, 1000), DP (4), HIDDEN (512), HEADS (8), SEQ (64),
#      LAYERS ("8 16 24 32 40 48 56 64"), STAGES ("0 1 3"), DTYPE ("" or --bf16), EXTRA.
# Prints one row per run and, per stage, the largest size that trained.
set -euo pipefail
cd "$(dirname "$0")/.."
DEVICE=${1:-cpu}
BUILD=${BUILD:-build}; CAP=${CAP:-1000}; DP=${DP:-4}; HIDDEN=${HIDDEN:-512}; HEADS=${HEADS:-8}; SEQ=${SEQ:-64}
LAYERS=${LAYERS:-"8 16 24 32 40 48 56 64"}; STAGES=${STAGES:-"0 1 3"}; DTYPE=${DTYPE:-}; EXTRA=${EXTRA:-}
OUT=$(mktemp -d /tmp/mpitron_zerocap.XXXXXX)
trap 'rm -rf "$OUT"' EXIT
force=""
[ "$DEVICE" = cuda ] && force="--force-mpi-for-device"
echo "# bench/zero_capacity.sh: --memory-cap $CAP MB per rank, dp $DP, GPT hidden $HIDDEN, seq $SEQ, micro-batch 1, ${DTYPE:-f32} on $DEVICE"
printf '%-6s %-7s %12s %10s %10s %10s  %s\n' stage layers params "est MB" "peak MB" "ms/step" result
summary=""
for stage in $STAGES; do
  best="none"
  for layers in $LAYERS; do
    log="$OUT/z${stage}_l$layers.log"
    rc=0
    OMP_NUM_THREADS=${OMP_NUM_THREADS:-1} mpirun --allow-run-as-root --oversubscribe -np "$DP" "$BUILD/apps/pretrain_gpt" \
      --num-layers "$layers" --hidden-size "$HIDDEN" --num-attention-heads "$HEADS" --seq-length "$SEQ" \
      --micro-batch-size 1 --global-batch-size "$DP" --train-iters 2 --lr 1e-4 --mock-data \
      --vocab-file assets/gpt2/gpt2-vocab.json --merge-file assets/gpt2/gpt2-merges.txt --log-interval 2 --eval-iters 0 \
      --attention-dropout 0 --hidden-dropout 0 --zero-stage "$stage" --memory-cap "$CAP" --device "$DEVICE" \
      $force $DTYPE $EXTRA >"$log" 2>&1 || rc=$?
    params=$(grep -m1 'mpitron pretrain_gpt:' "$log" | grep -oE '[0-9]+ parameters' | grep -oE '[0-9]+' || echo "-")
    if [ "$rc" != 0 ]; then
      if grep -q -- "--memory-cap $CAP" "$log"; then
        printf '%-6s %-7s %12s %10s %10s %10s  %s\n' "$stage" "$layers" "$params" "-" "-" "-" "refused: the estimate exceeds the cap"
      else
        echo "stage $stage layers $layers FAILED:"; tail -3 "$log"
      fi
      break
    fi
    est=$(grep -m1 'memory per rank (estimate)' "$log" | sed -E 's/.*total ([0-9.]+) MB.*/\1/')
    peak=$(grep 'peak memory (MB)' "$log" | tail -1 | sed -E 's/.*peak memory \(MB\): ([0-9.]+).*/\1/')
    ms=$(grep 'elapsed time per iteration' "$log" | tail -1 | sed -E 's/.*per iteration \(ms\): ([0-9.]+).*/\1/')
    verdict=$(python3 -c "print('trained, peak within the cap' if $peak <= $CAP else 'trained, PEAK ABOVE THE CAP')")
    printf '%-6s %-7s %12s %10s %10s %10s  %s\n' "$stage" "$layers" "$params" "$est" "$peak" "$ms" "$verdict"
    best="$layers layers ($params parameters)"
  done
  summary="$summary\n  --zero-stage $stage: $best"
done
echo -e "# largest that trained within --memory-cap $CAP MB per rank at dp $DP:$summary"
