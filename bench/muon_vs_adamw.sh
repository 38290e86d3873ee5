#!/usr/bin/env bash
# Muon against AdamW on the bundled tiny Shakespeare (issue 44): the same 4-layer GPT, seed and data,
# each optimizer over a small learning-rate grid; prints, per run, the validation loss at each
# evaluation and the step time, then for each optimizer at its best learning rate the tokens it took
# to reach a fixed validation loss (TARGET), and Muon's step-time overhead (its Newton-Schulz
# iterations) against AdamW's.
#   bench/muon_vs_adamw.sh [BUILD]   (env: ITERS=240 TARGET=5.6 DEVICE=cpu SEQ=128 GBS=16 LRS_ADAM="..." LRS_MUON="...")
# Muon runs with --muon-scale-mode spectral --muon-extra-scale-factor 0.2 (Megatron's recipe for
# reusing AdamW's learning rates: the update's RMS matches AdamW's) and Nesterov momentum.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${1:-build}
ITERS=${ITERS:-240}
TARGET=${TARGET:-5.6}
DEVICE=${DEVICE:-cpu}
LRS_ADAM=${LRS_ADAM:-"1e-3 2e-3 4e-3"}
LRS_MUON=${LRS_MUON:-"2e-3 4e-3 8e-3"}
OUT=${OUT:-out/muon_bench}
mkdir -p "$OUT"
./scripts/prepare-shakespeare.sh "$BUILD" "$OUT" >/dev/null
SEQ=${SEQ:-128} GBS=${GBS:-16}
run() {  # optimizer lr → log
  local opt=$1 lr=$2 extra=()
  [ "$opt" = adam ] || extra=(--muon-use-nesterov --muon-scale-mode spectral --muon-extra-scale-factor 0.2)
  OMP_NUM_THREADS=${OMP_NUM_THREADS:-$(nproc)} "$BUILD/apps/pretrain_gpt" \
    --num-layers 4 --hidden-size 128 --num-attention-heads 4 --seq-length $SEQ \
    --micro-batch-size $GBS --global-batch-size $GBS --train-iters "$ITERS" \
    --optimizer "$opt" "${extra[@]}" --lr "$lr" --min-lr 0 --lr-warmup-iters 10 --lr-decay-style cosine \
    --weight-decay 0.1 --adam-beta2 0.95 --clip-grad 1.0 --hidden-dropout 0.0 --attention-dropout 0.0 \
    --data-path "$OUT/shakespeare_text_document" --split 95,5,0 --seed 1234 \
    --log-interval 20 --eval-interval 20 --eval-iters 8 --device "$DEVICE" > "$OUT/$opt-$lr.log" 2>&1
}
summary() {  # log → "best_val tokens_to_target ms_per_step"
  python3 - "$1" "$TARGET" $SEQ $GBS <<'PY'
import re, sys
log, target, seq, gbs = sys.argv[1], float(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
vals, ms = [], []
for line in open(log):
    m = re.search(r"validation loss at iteration (\d+) \| lm loss value: ([0-9.E+-]+)", line)
    if m:
        vals.append((int(m.group(1)), float(m.group(2))))
    m = re.search(r"iteration +(\d+)/.*elapsed time per iteration \(ms\): ([0-9.]+)", line)
    if m and int(m.group(1)) > 20:  # past the first interval (warm-up of caches and allocator)
        ms.append(float(m.group(2)))
reach = next((it for it, v in vals if v <= target), None)
best = min(v for _, v in vals) if vals else float("nan")
print(f"{best:.4f} {reach * seq * gbs if reach else 'never'} {sum(ms) / len(ms) if ms else float('nan'):.1f}")
PY
}
echo "optimizer lr best_val tokens_to_${TARGET} ms_per_step"
for opt in adam muon; do
  lrs=$LRS_ADAM; [ $opt = muon ] && lrs=$LRS_MUON
  for lr in $lrs; do
    run $opt "$lr"
    echo "$opt $lr $(summary "$OUT/$opt-$lr.log")"
  done
done | tee "$OUT/summary.txt"
python3 - "$OUT/summary.txt" <<'PY'
import sys
rows = [l.split() for l in open(sys.argv[1]) if not l.startswith("optimizer")]
best = {}
for opt, lr, val, tok, ms in rows:
    if opt not in best or float(val) < float(best[opt][2]):
        best[opt] = (opt, lr, val, tok, ms)
for opt, lr, val, tok, ms in best.values():
    print(f"best {opt}: lr {lr}, best validation loss {val}, tokens to target {tok}, {ms} ms/step")
if "adam" in best and "muon" in best:
    a, m = best["adam"], best["muon"]
    print(f"muon step time / adam step time: {float(m[4]) / float(a[4]):.3f}")
    if a[3] != "never" and m[3] != "never":
        print(f"tokens to target, muon / adam: {int(m[3]) / int(a[3]):.3f}")
PY
