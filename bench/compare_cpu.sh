#!/usr/bin/env bash
# bench/compare_cpu.sh — mpitron vs PyTorch, the whole training step on this CPU.
#
#   bench/compare_cpu.sh [CONFIGS] [BATCH] [SEQ]        e.g. bench/compare_cpu.sh tiny,124M 4 256
#
# For each config, one bench_train run measures mpitron with recompute off and
# on, then runs the PyTorch peer (bench/peers/torch_gpt.py) on the same config,
# batch, sequence, steps and thread count, so the two see the same machine load
# a minute apart. Prints every row, the ratio mpitron/PyTorch of tokens/s and the
# recompute memory saving; JSON per config in $OUT_DIR (default /tmp/mpitron-bench).
# Environment: BUILD (default build-bench, a -DMPITRON_CUDA=OFF tree; built if
# missing), PYTHON (default /usr/bin/python3: Debian's python3-torch), THREADS
# (default: all cores), WARMUP (1), STEPS (3).
set -euo pipefail
cd "$(dirname "$0")/.."
CONFIGS=${1:-tiny,124M}
BATCH=${2:-4}
SEQ=${3:-256}
BUILD=${BUILD:-build-bench}
PYTHON=${PYTHON:-/usr/bin/python3}
THREADS=${THREADS:-$(nproc)}
WARMUP=${WARMUP:-1}
STEPS=${STEPS:-3}
OUT_DIR=${OUT_DIR:-/tmp/mpitron-bench}
mkdir -p "$OUT_DIR"

if ! "$PYTHON" -c 'import torch' 2>/dev/null; then
  echo "compare_cpu.sh: $PYTHON has no torch (Debian: apt-get install -y python3-torch)" >&2
  exit 1
fi
if [ ! -x "$BUILD/bench/bench_train" ]; then
  [ -f "$BUILD/build.ninja" ] || cmake -S . -B "$BUILD" -G Ninja -DMPITRON_CUDA=OFF >/dev/null
  ninja -C "$BUILD" bench_train
fi

echo "compare_cpu: configs $CONFIGS, B=$BATCH T=$SEQ, $THREADS threads, $WARMUP warm-up + $STEPS timed steps"
echo "commit $(git rev-parse --short HEAD 2>/dev/null || echo '?')$(git diff --quiet 2>/dev/null || echo ' (+ uncommitted changes)'), $(date -u +%Y-%m-%dT%H:%MZ), load $(cut -d' ' -f1-3 /proc/loadavg)"
jsons=()
for cfg in ${CONFIGS//,/ }; do
  j="$OUT_DIR/compare_cpu_${cfg}.json"
  OMP_NUM_THREADS=$THREADS "$BUILD/bench/bench_train" --device cpu --config "$cfg" --batch "$BATCH" --seq "$SEQ" \
    --warmup "$WARMUP" --steps "$STEPS" --threads "$THREADS" --recompute both \
    --peer --python "$PYTHON" --json "$j"
  jsons+=("$j")
done

echo
echo "== summary: tokens/s, ratio = mpitron / PyTorch; tensor = peak live tensor bytes (mpitron), RSS = peak RSS above baseline =="
"$PYTHON" - "${jsons[@]}" <<'EOF'
import json, sys
G = 2**30
print(f"{'config':7s} {'mpitron':>9s} {'pytorch':>9s} {'ratio':>6s} {'MFU mpt':>8s} {'MFU pt':>7s} {'tensor':>7s} "
      f"{'tens rc':>7s} {'saved':>6s} {'RSS mpt':>7s} {'RSS rc':>7s} {'RSS pt':>7s} {'sgemm GF/s':>10s}")
for path in sys.argv[1:]:
    j = json.load(open(path))
    rows = {(r["config"], r["recompute"]): r for r in j["rows"]}
    for p in j.get("peer_rows", []):
        m, rc = rows.get((p["config"], False)), rows.get((p["config"], True))
        if not m:
            continue
        rc = rc or {"peak_bytes": float("nan"), "rss_peak_bytes": float("nan")}
        saved = 1 - rc["peak_bytes"] / m["peak_bytes"] if m["peak_bytes"] else float("nan")
        print(f"{p['config']:7s} {m['tokens_per_s']:9.1f} {p['tokens_per_s']:9.1f} "
              f"{m['tokens_per_s'] / p['tokens_per_s']:6.2f} {100 * m['mfu_ceiling']:7.1f}% {100 * p['mfu_ceiling']:6.1f}% "
              f"{m['peak_bytes'] / G:6.2f}G {rc['peak_bytes'] / G:6.2f}G {100 * saved:5.1f}% "
              f"{m['rss_peak_bytes'] / G:6.2f}G {rc['rss_peak_bytes'] / G:6.2f}G {p['rss_peak_bytes'] / G:6.2f}G "
              f"{1e3 * j['gemm_ceiling_tflops']:10.1f}")
EOF
