#!/usr/bin/env bash
# bench/spec_decode.sh — speculative decoding with the MTP layer (--num-speculative-tokens 1) beside plain
# greedy decoding, on a small DeepSeek-V3-style model (multi-latent attention, group-limited sigmoid MoE,
# one MTP layer) trained on the bundled tiny Shakespeare: the acceptance rate, tokens/s of each, and
# whether the tokens are the same (they must be). Everything lands in out/spec_decode/.
#   BUILD=build ITERS=300 NEW=96 REQUESTS=1 bench/spec_decode.sh
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
ITERS=${ITERS:-300}
NEW=${NEW:-96}
REQUESTS=${REQUESTS:-1}
OUT=out/spec_decode
mkdir -p "$OUT"
cmake --build "$BUILD" -j "$(nproc)" --target pretrain_gpt preprocess_data generate_text >/dev/null
./scripts/prepare-shakespeare.sh "$BUILD" "$OUT" >/dev/null
if [ ! -f "$OUT/checkpoints/latest_checkpointed_iteration.txt" ]; then
  echo "== training a DeepSeek-V3-style model with one MTP layer, $ITERS iterations"
  OMP_NUM_THREADS=$(nproc) "$BUILD/apps/pretrain_gpt" \
    --num-layers 4 --hidden-size 128 --num-attention-heads 4 --seq-length 128 --max-position-embeddings 256 \
    --normalization RMSNorm --swiglu --position-embedding-type rope --disable-bias-linear \
    --untie-embeddings-and-output-weights --ffn-hidden-size 352 \
    --multi-latent-attention --q-lora-rank 64 --kv-lora-rank 32 --qk-head-dim 32 --qk-pos-emb-head-dim 16 \
    --v-head-dim 32 --num-experts 8 --moe-router-topk 2 --moe-ffn-hidden-size 176 --moe-layer-freq '[0,1,1,1]' \
    --moe-router-score-function sigmoid --moe-router-enable-expert-bias --moe-router-num-groups 4 \
    --moe-router-group-topk 2 --moe-router-topk-scaling-factor 2.5 --moe-shared-expert-intermediate-size 176 \
    --mtp-num-layers 1 --mtp-loss-scaling-factor 0.3 \
    --micro-batch-size 8 --global-batch-size 16 --train-iters "$ITERS" \
    --lr 2e-3 --min-lr 2e-4 --lr-warmup-iters 20 --lr-decay-style cosine \
    --weight-decay 0.1 --adam-beta2 0.95 --clip-grad 1.0 --hidden-dropout 0.0 --attention-dropout 0.0 \
    --data-path "$OUT/shakespeare_text_document" --split 95,5,0 --log-interval 50 --eval-interval 1000 \
    --eval-iters 0 --device cpu --save "$OUT/checkpoints" --save-interval "$ITERS" 2>&1 | grep -E "iteration +($ITERS|[0-9]*00) " || true
fi
printf 'ROMEO:\nFirst Citizen:\nKING HENRY:\nJULIET:\n' > "$OUT/prompts.txt"
for mode in plain spec; do
  extra=""
  [ "$mode" = spec ] && extra="--num-speculative-tokens 1"
  start=$(date +%s.%N)
  OMP_NUM_THREADS=$(nproc) "$BUILD/apps/generate_text" --load "$OUT/checkpoints" --sample-input-file "$OUT/prompts.txt" \
    --greedy --out-seq-length "$NEW" --genfile "$OUT/$mode.jsonl" --inference-dynamic-batching-max-requests "$REQUESTS" \
    $extra > "$OUT/$mode.log" 2>&1
  end=$(date +%s.%N)
  tokens=$(python3 -c "import json,sys; print(sum(len(json.loads(l)['tokens']) for l in open('$OUT/$mode.jsonl') if l.strip()))")
  python3 -c "print('$mode: $tokens tokens in %.2f s, %.1f tokens/s' % ($end - $start, $tokens / ($end - $start)))"
  grep -o "speculative: .*" "$OUT/$mode.log" || true
done
if cmp -s <(python3 -c "import json; [print(json.loads(l)['tokens']) for l in open('$OUT/plain.jsonl')]") \
          <(python3 -c "import json; [print(json.loads(l)['tokens']) for l in open('$OUT/spec.jsonl')]"); then
  echo "tokens: identical"
else
  echo "tokens: DIFFERENT"
  exit 1
fi
