#!/usr/bin/env bash
# Tokenizes the bundled tiny Shakespeare (assets/text/tinyshakespeare.txt, one document per
# paragraph, GPT-2 BPE with an end-of-document token) into OUT/shakespeare_text_document.{bin,idx}
# for the demo and the benches. Skips the work when the .bin is already there.
#   scripts/prepare-shakespeare.sh BUILD OUT [preprocess_data's --log-interval [--workers]]
set -euo pipefail
BUILD=$1 OUT=$2 LOG_INTERVAL=${3:-100000} WORKERS=${4:-2}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
[ -f "$OUT/shakespeare_text_document.bin" ] && exit 0
mkdir -p "$OUT"
python3 - "$ROOT/assets/text/tinyshakespeare.txt" "$OUT/shakespeare.jsonl" <<'PY'
import json, sys
text = open(sys.argv[1], encoding="utf-8").read()
with open(sys.argv[2], "w", encoding="utf-8") as f:
    for p in text.split("\n\n"):
        if p.strip():
            f.write(json.dumps({"text": p + "\n\n"}) + "\n")
PY
"$BUILD/apps/preprocess_data" --input "$OUT/shakespeare.jsonl" --output-prefix "$OUT/shakespeare" \
  --append-eod --workers "$WORKERS" --log-interval "$LOG_INTERVAL"
