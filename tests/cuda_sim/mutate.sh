#!/usr/bin/env bash
# tests/cuda_sim/mutate.sh — proof that the simulated suite can fail: applies one
# deliberate defect at a time to the kernels (M*) or to the NCCL communicator's
# stream ordering (S*), rebuilds the simulated build (build-sim, incremental),
# runs the tests that cover it, and reports whether they caught it. Every file
# it changes is backed up first and restored afterwards (also on Ctrl-C). Slow
# (a rebuild per defect): not run in CI.
#   tests/cuda_sim/mutate.sh            all defects
#   tests/cuda_sim/mutate.sh M3 S1      some of them
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
  'S1#parallel/comm_nccl.cpp#s/    cuda_ok\(cudaStreamWaitEvent\(stream_, ready_, 0\), "cudaStreamWaitEvent"\);\n//#^(cuda_sim_test_nccl_np2|parallel_test_comm_np2|model_test_trainer_mp_np2)$#no cudaStreamWaitEvent before a collective: the NCCL stream does not wait for the kernels that wrote its input'
  'S2#parallel/comm_nccl.cpp#s/    cuda_ok\(cudaEventRecord\(st->done_ev, stream_\), "cudaEventRecord"\);\n//#^(cuda_sim_test_nccl_np2|parallel_test_comm_np2|model_test_trainer_mp_np2)$#no completion event recorded after a collective: wait() returns before the collective ran'
  'S3#parallel/comm_nccl.cpp#s/      c_\.nccl_ok\(ncclGroupEnd\(\), "ncclGroupEnd"\);\n//#^(cuda_sim_test_nccl_np2|parallel_test_comm_np2|model_test_trainer_mp_np2)$#no ncclGroupEnd: a batch of sends and receives (and the uneven collectives) is never launched'
)

want=("$@")
backup=$(mktemp -d)
# Restore changed files with a fresh mtime, so the build recompiles them.
FILES=(tensor/cuda/*.cu tensor/cuda/*.cuh tensor/cuda/*.cpp tensor/cuda/*.h parallel/comm_nccl.cpp)
restore() {
  local f
  for f in "${FILES[@]}"; do cmp -s "$backup/$f" "$f" || cp "$backup/$f" "$f"; done
}
trap 'restore; rm -rf "$backup"' EXIT
for f in "${FILES[@]}"; do mkdir -p "$backup/$(dirname "$f")" && cp -p "$f" "$backup/$f"; done

[ -f "$BUILD/CMakeCache.txt" ] || cmake -S . -B "$BUILD" -G Ninja -DMPITRON_CUDA_SIM=ON >/dev/null
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=0:abort_on_error=0:detect_stack_use_after_return=0}
export MPITRON_TEST_DEVICE=cuda MPITRON_TEST_LAYOUTS=${MPITRON_TEST_LAYOUTS:-1,3,8}  # TP+SP, 1F1B, DP ZeRO-2
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
  diff -u "$backup/$file" "$file" | sed -n '3,$p'
  t0=$(date +%s)
  targets=$(sed -E 's/[\^$()]//g; s/\|/ /g' <<<"$regex")
  targets=$(for t in $targets; do t=${t%_np[0-9]}; case $t in *_test_*) echo "$t";; *) echo "tensor_test_$t";; esac; done | sort -u)
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
  how=$(grep -m3 -E "stream race|cuda-sim|AddressSanitizer|ERROR: |CHECK\(|REQUIRE|mismatch|max abs" /tmp/mutate_test_$id.log | cut -c1-240 | tr '\n' ' ')
  summary+=("$id $verdict in $(( $(date +%s) - t0 )) s: $what — ${how:-see /tmp/mutate_test_$id.log}")
done
restore
echo "=== restoring the kernels and rebuilding"
cmake --build "$BUILD" -j "$JOBS" --target $(sort -u <<<"$all_targets") >/dev/null 2>&1 || true
printf '%s\n' "${summary[@]}"
printf '%s\n' "${summary[@]}" | grep -q "MISSED\|NOT APPLIED\|BUILD FAILED" && exit 1
exit 0
