#!/usr/bin/env bash
# make demo: on a fresh machine, install what is missing, build, tokenize the
# bundled tiny Shakespeare with preprocess_data, train a small GPT (CPU, or the
# GPU when one is present), and finish with the validation loss and where the
# checkpoint and logs are. Everything lands in out/demo/.
set -euo pipefail
cd "$(dirname "$0")/.."
ITERS=${DEMO_ITERS:-120}
OUT=out/demo
./scripts/install-deps.sh

if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
  BUILD=${BUILD:-build}; CUDA_FLAG=""; DEVICE=cuda
else
  # No GPU: a CPU-only tree builds in a fraction of the time.
  BUILD=${BUILD:-build-cpu}; CUDA_FLAG="-DMPITRON_CUDA=OFF"; DEVICE=cpu
fi
[ -f "$BUILD/CMakeCache.txt" ] || cmake -S . -B "$BUILD" -G Ninja $CUDA_FLAG >/dev/null
echo "== building pretrain_gpt and preprocess_data in $BUILD"
cmake --build "$BUILD" -j "$(nproc)" --target pretrain_gpt preprocess_data

mkdir -p "$OUT"
echo "== tokenizing assets/text/tinyshakespeare.txt (one document per paragraph)"
rm -f "$OUT/shakespeare_text_document.bin"  # the demo tokenizes afresh each time
./scripts/prepare-shakespeare.sh "$BUILD" "$OUT" 2000

echo "== training a 4-layer GPT (${ITERS} iterations) on $DEVICE"
rm -rf "$OUT/checkpoints" "$OUT/tensorboard"
OMP_NUM_THREADS=${OMP_NUM_THREADS:-$(nproc)} "$BUILD/apps/pretrain_gpt" \
  --num-layers 4 --hidden-size 128 --num-attention-heads 4 --seq-length 128 \
  --micro-batch-size 8 --global-batch-size 16 --train-iters "$ITERS" \
  --lr 2e-3 --min-lr 2e-4 --lr-warmup-iters 10 --lr-decay-style cosine \
  --weight-decay 0.1 --adam-beta2 0.95 --clip-grad 1.0 --hidden-dropout 0.0 --attention-dropout 0.0 \
  --data-path "$OUT/shakespeare_text_document" --split 95,5,0 \
  --log-interval 10 --eval-interval 40 --eval-iters 4 --device "$DEVICE" \
  --save "$OUT/checkpoints" --tensorboard-dir "$OUT/tensorboard"
