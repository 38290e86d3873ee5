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

"$SRC/scripts/prepare-shakespeare.sh" "$BUILD" "$WORK" 100000 1 >/dev/null

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
# The inference tools with each training script's own argument list (GPT_ARGS, DATA_ARGS,
# OUTPUT_ARGS, parallel and DeepSpeed flags, --save/--load: every flag unchanged): the script
# runs again with MPITRON_BUILD pointing at a folder whose apps/pretrain_gpt is a wrapper (the
# scripts set PRETRAIN_GPT=$MPITRON_BUILD/apps/pretrain_gpt themselves) that starts the tool
# with those arguments plus the tool's own input flags. Only the launcher changes: inference runs on
# tensor x pipeline parallel ranks (no data parallelism), so the TP2 x PP2 script keeps its
# 4 ranks and the others run on one process. Model flags are checked against the checkpoint,
# training flags accepted with one note line.
head -n 20 "$SRC/assets/text/wikitext-2.test.txt" > "$WORK/wiki20.txt"
cat > "$WORK/tool.sh" <<'SH'
#!/bin/bash
# $TOOL with the training script's arguments ("$@") and its own ($TOOL_ARGS).
rank=${OMPI_COMM_WORLD_RANK:-0}
if [ "$TOOL" != text_generation_server ]; then exec "$TOOL_BUILD/apps/$TOOL" "$@" $TOOL_ARGS; fi
log=$TOOL_OUT.rank$rank
"$TOOL_BUILD/apps/$TOOL" "$@" --port 0 --max-requests 2 > "$log" 2>&1 &
pid=$!
if [ "$rank" = 0 ]; then
  for _ in $(seq 1200); do grep -q "listening on" "$log" && break; kill -0 $pid 2>/dev/null || break; sleep 0.1; done
  port=$(grep -o "listening on http://127.0.0.1:[0-9]*" "$log" | sed 's/.*://')
  python3 - "$port" > "$TOOL_OUT" <<'PY'
import json, sys, urllib.request
port = sys.argv[1]
for method, path, body in (("PUT", "/api", {"prompts": ["Hello"], "tokens_to_generate": 4}),
                           ("POST", "/v1/completions", {"prompt": "Hello", "max_tokens": 4})):
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=json.dumps(body).encode(), method=method,
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as r:
        print(path, r.status, r.read().decode())
PY
fi
wait $pid; rc=$?
cat "$log"
exit $rc
SH
chmod +x "$WORK/tool.sh"
mkdir -p "$WORK/toolbuild/apps"
ln -s "$WORK/tool.sh" "$WORK/toolbuild/apps/pretrain_gpt"
for script in "$SRC"/tests/scripts/megatron_*.sh; do
  name=$(basename "$script" .sh)
  export CHECKPOINT_PATH=$WORK/$name/checkpoints
  [ -f "$CHECKPOINT_PATH/latest_checkpointed_iteration.txt" ] || continue
  case $name in
    *with_mp) launcher="mpirun --allow-run-as-root --oversubscribe -np 4" ;;  # TP2 x PP2
    *) launcher="env" ;;  # (an empty LAUNCHER would mean the script's default)
  esac
  for tool in generate_text evaluate text_generation_server; do
    out=$WORK/$name.$tool.out
    case $tool in
      generate_text) args="--num-samples 2 --out-seq-length 8 --genfile $out" ;;
      evaluate) args="--task WIKITEXT2 --valid-data $WORK/wiki20.txt --results-json $out" ;;
      *) args="" ;;
    esac
    log=$WORK/$name.$tool.log
    echo "== $tool with $name's arguments (launcher: $launcher)"
    if ! TOOL=$tool TOOL_ARGS=$args TOOL_OUT=$out TOOL_BUILD=$BUILD MPITRON_BUILD=$WORK/toolbuild LAUNCHER=$launcher bash "$script" >"$log" 2>&1; then
      echo "FAILED: $tool exited non-zero with $name's arguments"; tail -20 "$log"; fail=1; continue
    fi
    ok=1
    grep -q "pretraining flags, accepted from the script" "$log" || { echo "FAILED: no note on the training flags"; ok=0; }
    case $tool in
      generate_text) [ "$(grep -c '"tokens"' "$out")" = 2 ] || { echo "FAILED: generate_text wrote no samples"; ok=0; } ;;
      evaluate) grep -q "validation results on WIKITEXT2" "$log" && grep -q "^windows .*tokens/s" "$log" \
                  || { echo "FAILED: evaluate printed no progress or result"; ok=0; } ;;
      *) [ "$(grep -c ' 200 ' "$out")" = 2 ] || { echo "FAILED: the server did not answer"; ok=0; } ;;
    esac
    if [ $ok = 1 ]; then
      echo "ok: $(grep -m1 'pretraining flags, accepted' "$log" | cut -c1-150)..."
    else
      tail -20 "$log"; fail=1
    fi
  done
done
[ $fail = 0 ] && echo "all scripts ran" || exit 1
