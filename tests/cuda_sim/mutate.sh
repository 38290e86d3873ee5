#!/usr/bin/env bash
# tests/cuda_sim/mutate.sh — proof that the simulated suite can fail: applies one
# deliberate defect at a time to the kernels, rebuilds the simulated build
# (build-sim, incremental), runs the tests that cover that kernel, and reports
# whether they caught it. Every kernel file is backed up first and restored
# afterwards (also on Ctrl-C). Slow (a rebuild per defect): not run in CI.
#   tests/cuda_sim/mutate.sh            all defects
#   tests/cuda_sim/mutate.sh M3 M5      some of them
# Prints one line per defect: CAUGHT (tests failed) or MISSED, and the time taken.
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
cd "$ROOT"
BUILD=${SIM_BUILD:-build-sim}
JOBS=${JOBS:-$(nproc)}

# id # file # perl substitution # ctest regex # what
DEFECTS=(
  'M1#tensor/cuda/map.cuh#s/for \(int64_t i = nv \* V \+ tid; i < n;/for (int64_t i = nv * V + tid; i <= n;/#^tensor_test_(elementwise|gelu)$#off-by-one bound: the element-wise tail loop runs to i <= n'
  'M2#tensor/cuda/embedding.cu#s/if \(n >= n_ids\) return;/if (n > n_ids) return;/#^tensor_test_embedding$#off-by-one bound: embedding forward lets warp n_ids through'
  'M3#tensor/cuda/common.cuh#s/for \(int o = 16; o > 0; o >>= 1\) v \+= __shfl_xor_sync/for (int o = 16; o > 1; o >>= 1) v += __shfl_xor_sync/#^tensor_test_(norm|layernorm)$#shuffle loop one step short: warp_sum stops before offset 1'
  'M4#tensor/cuda/row_stats.cuh#s/for \(int o = 16; o > 0; o >>= 1\) \{/for (int o = 16; o > 1; o >>= 1) {/#^tensor_test_(softmax|cross_entropy|cross_entropy_vp|attention)$#shuffle loop one step short: warp_max_sum (softmax / cross-entropy row statistics)'
  'M5#tensor/cuda/common.cuh#s/(if \(lane == 0\) shared\[warp\] = v;\n)  __syncthreads\(\);\n(  v = lane < nwarps \? shared\[lane\] : 0\.0f;)/$1$2/#^tensor_test_(norm|adamw)$#removed __syncthreads: block_sum reads the per-warp sums before all are written'
  'M6#tensor/cuda/row_stats.cuh#s/(    sh_s\[warp\] = s;\n  \}\n)  __syncthreads\(\);\n/$1/#^tensor_test_(cross_entropy|cross_entropy_vp)$#removed __syncthreads: block_logsumexp reads the per-warp (max, sum) before all are written'
)

want=("$@")
backup=$(mktemp -d)
# Restore changed files with a fresh mtime, so the build recompiles them.
restore() {
  local f
  for f in "$backup"/*; do cmp -s "$f" "tensor/cuda/${f##*/}" || cp "$f" "tensor/cuda/${f##*/}"; done
}
trap 'restore; rm -rf "$backup"' EXIT
cp -p tensor/cuda/*.cu tensor/cuda/*.cuh tensor/cuda/*.cpp tensor/cuda/*.h "$backup"/

[ -f "$BUILD/CMakeCache.txt" ] || cmake -S . -B "$BUILD" -G Ninja -DMPITRON_CUDA_SIM=ON >/dev/null
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=0:abort_on_error=0:detect_stack_use_after_return=0}
export MPITRON_TEST_DEVICE=cuda
summary=()
all_targets=""
for d in "${DEFECTS[@]}"; do
  IFS='#' read -r id file subst regex what <<<"$d"
  if [ ${#want[@]} -gt 0 ] && ! printf '%s\n' "${want[@]}" | grep -qx "$id"; then continue; fi
  restore
  before=$(md5sum "$file")
  perl -0pi -e "$subst" "$file"
  if [ "$(md5sum "$file")" = "$before" ]; then
    summary+=("$id NOT APPLIED ($file changed?): $what")
    continue
  fi
  echo "=== $id: $what"
  diff -u "$backup/${file#tensor/cuda/}" "$file" | sed -n '3,$p'
  t0=$(date +%s)
  targets=$(sed -E 's/[\^$()]//g; s/\|/ /g' <<<"$regex")
  targets=$(for t in $targets; do case $t in tensor_test_*) echo "$t";; *) echo "tensor_test_$t";; esac; done | sort -u)
  all_targets+=" $targets"$'\n'
  if ! cmake --build "$BUILD" -j "$JOBS" --target $targets >/tmp/mutate_build_$id.log 2>&1; then
    summary+=("$id BUILD FAILED (see /tmp/mutate_build_$id.log): $what")
    continue
  fi
  if (cd "$BUILD" && ctest -j "$JOBS" -R "$regex" --output-on-failure >/tmp/mutate_test_$id.log 2>&1); then
    verdict=MISSED
  else
    verdict=CAUGHT
  fi
  how=$(grep -m3 -E "cuda-sim:|AddressSanitizer|ERROR: |CHECK\(|REQUIRE|mismatch|max abs" /tmp/mutate_test_$id.log | cut -c1-200 | tr '\n' ' ')
  summary+=("$id $verdict in $(( $(date +%s) - t0 )) s: $what — ${how:-see /tmp/mutate_test_$id.log}")
done
restore
echo "=== restoring the kernels and rebuilding"
cmake --build "$BUILD" -j "$JOBS" --target $(sort -u <<<"$all_targets") >/dev/null 2>&1 || true
printf '%s\n' "${summary[@]}"
printf '%s\n' "${summary[@]}" | grep -q "MISSED\|NOT APPLIED\|BUILD FAILED" && exit 1
exit 0
