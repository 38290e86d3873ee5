#!/bin/bash
# bench/pipeline_sim_vs_measured.sh — does schedule_sim predict real step times?
#
# For each schedule (1f1b, interleaved, zb-h1, zbv) it trains a small GPT under
# PP ranks with --profile-pipeline (per-stage median F/B/W and p2p costs of the
# run itself), then feeds those costs to schedule_sim and prints the predicted
# step time beside the measured one: the schedule's wall time per step on
# pipeline rank 0 (median over the profiled steps; what the simulator models —
# the whole iteration, with the optimizer step and reductions, is printed too).
#   bench/pipeline_sim_vs_measured.sh [PP] [LAYERS]      (default PP 4, 8 layers)
# Env: BUILD (build), ITERS (8), MICRO (8 micro-batches per step), HIDDEN (256), SEQ (128).
# On a machine with fewer cores than ranks the ranks share cores, which the
# simulator (one device per rank) does not model: the measured step is then
# closer to the total work divided by the cores.
set -euo pipefail
cd "$(dirname "$0")/.."
PP=${1:-4}; LAYERS=${2:-8}
BUILD=${BUILD:-build}; ITERS=${ITERS:-8}; MICRO=${MICRO:-8}; HIDDEN=${HIDDEN:-256}; SEQ=${SEQ:-128}
OUT=$(mktemp -d /tmp/mpitron_pipebench.XXXXXX)
trap 'rm -rf "$OUT"' EXIT
python3 - "$OUT/text.jsonl" <<'PY'
import json, sys
text = open("assets/text/tinyshakespeare.txt", encoding="utf-8").read()
with open(sys.argv[1], "w", encoding="utf-8") as f:
    for p in text.split("\n\n"):
        if p.strip():
            f.write(json.dumps({"text": p + "\n\n"}) + "\n")
PY
"$BUILD/apps/preprocess_data" --input "$OUT/text.jsonl" --output-prefix "$OUT/text" --append-eod --workers 1 \
  --log-interval 100000 >/dev/null 2>&1
threads=$(( $(nproc) / PP )); [ "$threads" -ge 1 ] || threads=1
echo "pipeline_sim_vs_measured: PP $PP, $LAYERS layers, hidden $HIDDEN, seq $SEQ, $MICRO micro-batches of 1," \
     "$ITERS iterations, $(nproc) cores, $threads OpenMP thread(s) per rank, commit $(git rev-parse --short HEAD 2>/dev/null || echo ?)"
printf "%-12s %14s %14s %8s %10s %14s\n" schedule "measured ms" "predicted ms" "ratio" "bubble" "iteration ms"
for sched in 1f1b interleaved zb-h1 zbv; do
  extra=(); v=1
  case $sched in
    interleaved|zbv) v=2; extra=(--num-layers-per-virtual-pipeline-stage $(( LAYERS / (2 * PP) ))) ;;
  esac
  log="$OUT/$sched.log"
  OMP_NUM_THREADS=$threads mpirun --allow-run-as-root --oversubscribe -np "$PP" "$BUILD/apps/pretrain_gpt" \
    --num-layers "$LAYERS" --hidden-size "$HIDDEN" --num-attention-heads 4 --seq-length "$SEQ" \
    --micro-batch-size 1 --global-batch-size "$MICRO" --train-iters "$ITERS" --lr 1e-4 \
    --hidden-dropout 0 --attention-dropout 0 --data-path "$OUT/text_text_document" --split 100,0,0 \
    --eval-iters 0 --log-interval 1 --device cpu --pipeline-model-parallel-size "$PP" \
    --pipeline-schedule "$sched" "${extra[@]}" --profile-pipeline "$OUT/$sched.costs" >"$log" 2>&1 \
    || { echo "$sched: pretrain_gpt failed, see below"; tail -20 "$log"; exit 1; }
  measured=$(grep -oE "pipeline schedule time per step .*: [0-9.eE+-]+ ms" "$log" | awk '{ printf "%.1f", $(NF-1) }')
  iteration=$(grep -oE "elapsed time per iteration \(ms\): [0-9.]+" "$log" | awk -F': ' 'NR > 2 { s += $2; n++ } END { if (n) printf "%.1f", s / n; else print "nan" }')
  sim=$("$BUILD/apps/schedule_sim" --schedule "$sched" --pp "$PP" --micro-batches "$MICRO" --virtual-stages "$v" \
        --costs "$OUT/$sched.costs")
  predicted=$(echo "$sim" | awk '/^total time/ { printf "%.1f", $3 }')
  bubble=$(echo "$sim" | awk '/^bubble fraction/ { print $3 }')
  ratio=$(awk -v m="$measured" -v p="$predicted" 'BEGIN { if (p > 0) printf "%.2f", m / p; else print "nan" }')
  printf "%-12s %14s %14s %8s %10s %14s\n" "$sched" "$measured" "$predicted" "$ratio" "$bubble" "$iteration"
  [ -n "${KEEP_COSTS:-}" ] && cp "$OUT/$sched.costs" "$KEEP_COSTS.$sched" || true
done
