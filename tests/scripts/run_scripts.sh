#!/bin/bash
# ctest driver for tests/scripts: tokenizes a slice of the bundled tiny Shakespeare,
# then runs each Megatron-LM / Megatron-DeepSpeed script (unchanged but for the
# launcher, paths and sizes) and checks that it trained, evaluated and saved.
#   run_scripts.sh BUILD_DIR SOURCE_DIR [script ...]
set -euo pipefail
BUILD=$(cd "$1" && pwd); SRC=$(cd "$2" && pwd); shift 2
SCRIPTS=("$@")
[ ${#SCRIPTS[@]} -gt 0 ] || SCRIPTS=("$SRC"/tests/scripts/megatron_*.sh)  # training scripts; eval_*.sh run after
WORK=$(mktemp -d /tmp/mpitron_scripts.XXXXXX)
trap 'rm -rf "$WORK"' EXIT
export OMP_NUM_THREADS=1 OMPI_MCA_rmaps_base_oversubscribe=1

python3 - "$SRC/assets/text/tinyshakespeare.txt" "$WORK/shakespeare.jsonl" <<'PY'
import json, sys
text = open(sys.argv[1], encoding="utf-8").read()
with open(sys.argv[2], "w", encoding="utf-8") as f:
    for p in text.split("\n\n"):
        if p.strip():
            f.write(json.dumps({"text": p + "\n\n"}) + "\n")
PY
"$BUILD/apps/preprocess_data" --input "$WORK/shakespeare.jsonl" --output-prefix "$WORK/shakespeare" \
  --append-eod --workers 1 --log-interval 100000 >/dev/null

export MPITRON_BUILD=$BUILD
export VOCAB_FILE=$SRC/assets/gpt2/gpt2-vocab.json MERGE_FILE=$SRC/assets/gpt2/gpt2-merges.txt
export DATA_PATH=$WORK/shakespeare_text_document
fail=0
for script in "${SCRIPTS[@]}"; do
  name=$(basename "$script" .sh)
  export CHECKPOINT_PATH=$WORK/$name/checkpoints
  log=$WORK/$name.log
  echo "== $name"
  if ! bash "$script" >"$log" 2>&1; then
    echo "FAILED: $name exited non-zero"; tail -30 "$log"; fail=1; continue
  fi
  ok=1
  grep -q "iteration " "$log" || { echo "FAILED: $name: no iteration log line"; ok=0; }
  grep -q "validation loss" "$log" || { echo "FAILED: $name: no validation"; ok=0; }
  [ -f "$CHECKPOINT_PATH/latest_checkpointed_iteration.txt" ] || { echo "FAILED: $name: no checkpoint"; ok=0; }
  if grep -qi "nan iterations: *[1-9]" "$log"; then echo "FAILED: $name: NaN iterations"; ok=0; fi
  if [ $ok = 1 ]; then
    echo "ok: $name ($(grep -c 'iteration ' "$log") log lines, checkpoint iteration $(cat "$CHECKPOINT_PATH/latest_checkpointed_iteration.txt"))"
    # The notes on the flags that change nothing here are printed once.
    grep -E "^.*--[a-zA-Z_-]+: " "$log" | sed 's/^/   note: /' | head -40 || true
  else
    tail -30 "$log"; fail=1
  fi
done
# Evaluation scripts run on the checkpoint the Megatron-LM pretraining script saved.
if [ -f "$WORK/megatron_lm_pretrain_gpt/checkpoints/latest_checkpointed_iteration.txt" ]; then
  head -n 40 "$SRC/assets/text/lambada_test.jsonl" > "$WORK/lambada_40.jsonl"
  export LAMBADA_DATA=$WORK/lambada_40.jsonl CHECKPOINT_PATH=$WORK/megatron_lm_pretrain_gpt/checkpoints
  for script in "$SRC"/tests/scripts/eval_*.sh; do
    name=$(basename "$script" .sh)
    log=$WORK/$name.log
    echo "== $name"
    if bash "$script" >"$log" 2>&1 && grep -q "validation results on LAMBADA" "$log"; then
      echo "ok: $name: $(grep 'validation results' "$log" | head -1)"
      grep -E -- "--[a-zA-Z_-]+: " "$log" | sed 's/^/   note: /' | head -20 || true
    else
      echo "FAILED: $name"; tail -30 "$log"; fail=1
    fi
  done
  # A model flag that disagrees with the checkpoint is named, with both values.
  if "$BUILD/apps/evaluate" --task LAMBADA --valid-data "$LAMBADA_DATA" --load "$CHECKPOINT_PATH" \
       --num-layers 2 --hidden-size 128 >"$WORK/mismatch.log" 2>&1; then
    echo "FAILED: evaluate accepted --hidden-size 128 for a hidden-size 64 checkpoint"; fail=1
  elif grep -q -- "--hidden-size 128 (checkpoint: 64)" "$WORK/mismatch.log"; then
    echo "ok: evaluate names the disagreeing model flag"
  else
    echo "FAILED: evaluate's mismatch error does not name the flag"; cat "$WORK/mismatch.log"; fail=1
  fi
fi
[ $fail = 0 ] && echo "all scripts ran" || exit 1
