#!/usr/bin/env bash
# tools/gpu_check.sh — every test and benchmark on the lent GPU machine in ONE
# call (docs/gpu.md). Prepared here by tools/prepare_gpu_bundle.sh; on the GPU
# machine, from the repository root, with build-gpu-bundle/, .debs/ and build-llmc/ carried:
#
#   bash tools/gpu_check.sh
#
# Steps (each under a timeout, all inside DEADLINE seconds, default 570, so the
# device tool's 600 s limit is never hit; a step that no longer fits is skipped
# and says so), most needed first:
#   setup       system facts, nvidia-smi; unpack the build tarball and .debs (files the image lacks are
#               added to /, nothing of the image is overwritten), mpiexec links,
#               LD_LIBRARY_PATH to the machine's own cuDNN / NCCL / cuBLAS / NVRTC
#   ctest_cuda  every test with a CUDA path (tensor ops, core, bf16 GPT reference, trainer, comm/grid/ZeRO)
#   bench_train 124M / llama-124M / moe-124M / mla-moe-124M (DeepSeek-style, with its KV bytes per token) / 1.3B / llama-1B, bf16, B=8, T=1024, no recompute
#   bench_muon  bench_train 124M / llama-124M with --optimizer muon: Muon's step time beside AdamW's rows above
#   llmc        llm.c's train_gpt2cu on 124M, B=8 and 16, T=1024 (bench/peers/llmc_gpt.py; build-llmc carried)
#   torch       the PyTorch peer (torch.compile + SDPA flash attention + bf16 autocast) on 124M
#   bench_mfu   GPT-2 124M/350M/774M/1.5B, bf16, seq 1024, with the GEMM ceiling
#   profile     ncu times every kernel of two 124M steps: launches, kernel time, gaps (bench/kernel_profile.py)
#   mp_cuda     the parallel-layout equivalence tests (GPT, BERT, ZeRO-3, MoE with EP) and the EP dispatchers on the GPU, 2 and 4 ranks
#   zero3       bench/zero_states.sh on the GPU: per-rank peak memory vs the estimate, ZeRO 0-3 at dp 1, 2, 4 (bf16)
#   dp_overlap  bench_comm --dp-step: the data-parallel step (dp and ZeRO-2) with and without overlap, dp 2 and 4
#   cp          context parallelism on the GPU: the CP trainer equivalence (2 and 4 ranks, quick set),
#               then bench_cp (bf16, T = 16384, CP 1/2/4 x p2p/all_gather/a2a: per-rank activation
#               memory and step time; the table goes into summary.txt)
#   cublas      the tensor tests again with MPITRON_ATTENTION=cublas (the fallback attention)
#   bench_ops   per-op throughput on CUDA vs the measured ceilings
#   bench_more  bench_train tiny/124M/350M/1.3B with recompute (folded into bench_train.json)
#   torch_more  the PyTorch peer eager on 124M, compiled on llama-124M
#   ctest_rest  the tests without a CUDA path (CI runs them on every submission too)
#   bench_serve text_generation_server on the GPU: generated tokens/s, p50/p99 at 1, 8, 32 clients,
#               dynamic batching vs one request at a time vs transformers' generate (bench/bench_serve.py;
#               its table goes into summary.txt)
# Everything goes under $OUT (at most 8 files come back): gpu_check.log (all
# output), ctest.log, bench_ops.json, bench_train.json, bench_mfu.json,
# torch_peer.json, llmc.json, summary.txt. The summary table is printed last.
# Environment: OUT, RUN (build-gpu-run), BUNDLE (build-gpu-bundle), DEADLINE (570), PARTS (all | tests | bench),
# STEPS (only these steps), CUDA_RERUN (ctest_cuda's regex), MP_TESTS (mp_cuda's test binaries).
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
RUN=${RUN:-build-gpu-run}
OUT=${OUT:-$ROOT/out/gpu_check}
DEADLINE=${DEADLINE:-570}
PARTS=${PARTS:-all}
mkdir -p "$OUT"
LOG=$OUT/gpu_check.log
SUMMARY=$OUT/summary.txt
: >"$SUMMARY"
exec > >(tee -a "$LOG") 2>&1
START=$(date +%s)
export PYTHONUNBUFFERED=1

left() { echo $((DEADLINE - ($(date +%s) - START))); }
# step NAME MAX_SECONDS NEED_SECONDS command…: runs under min(MAX, time left - 10);
# skipped if less than NEED seconds are left. Records status and seconds in the summary.
step() {
  local name=$1 max=$2 need=$3
  shift 3
  if [ -n "${STEPS:-}" ] && ! [[ " $STEPS " == *" $name "* ]]; then return 0; fi  # STEPS="a b": only those
  local l
  l=$(left)
  if [ "$l" -lt "$need" ]; then
    printf '%-12s %-28s %5s s\n' "$name" "SKIPPED (time: ${l}s left)" 0 >>"$SUMMARY"
    echo "=== $name: SKIPPED, only ${l}s of the ${DEADLINE}s budget left"
    return 0
  fi
  local t=$((l - 10 < max ? l - 10 : max))
  echo
  echo "=== $name (timeout ${t}s): $*"
  local t0 rc
  t0=$(date +%s)
  timeout --kill-after=5 "$t" "$@"
  rc=$?
  local status=ok
  [ $rc -eq 0 ] || status="FAILED (exit $rc)"
  [ $rc -eq 124 ] || [ $rc -eq 137 ] && status="TIMEOUT after ${t}s"
  printf '%-12s %-28s %5s s\n' "$name" "$status" $(($(date +%s) - t0)) >>"$SUMMARY"
  return 0
}

# ---- setup ------------------------------------------------------------------------------
echo "=== gpu_check $(date -u +%Y-%m-%dT%H:%M:%SZ) in $ROOT, budget ${DEADLINE}s"
echo "--- system"
uname -a
grep -E '^(PRETTY_NAME|VERSION_ID)=' /etc/os-release 2>/dev/null
ldd --version 2>&1 | head -1
nproc
free -g | head -2
nvidia-smi || echo "nvidia-smi failed"
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm,driver_version --format=csv 2>/dev/null
command -v nvcc >/dev/null && nvcc --version | tail -2
python3 -c 'import torch; print("python3", __import__("sys").version.split()[0], "torch", torch.__version__, "cuda", torch.version.cuda, "gpu", torch.cuda.is_available())' 2>&1

# The carried build: build-gpu-bundle/build-gpu-run.tar.xz, unpacked here (a tree
# already unpacked, e.g. on the CPU machine, is used as it is).
BUNDLE=${BUNDLE:-build-gpu-bundle}
if [ ! -d "$RUN" ] && [ -f "$BUNDLE/$RUN.tar.xz" ]; then
  mkdir -p "$RUN" && tar -C "$RUN" -xJf "$BUNDLE/$RUN.tar.xz" && echo "unpacked $BUNDLE/$RUN.tar.xz"
fi
cat "$RUN/BUNDLE_INFO" 2>/dev/null || echo "NO $RUN/BUNDLE_INFO: run tools/prepare_gpu_bundle.sh on the CPU machine and carry $BUNDLE"

echo "--- runtime packages (.debs)"
PREFIX=/opt/mpitron-rt
mkdir -p "$PREFIX"
n=0
for f in .debs/*.deb; do
  [ -e "$f" ] || continue
  if command -v dpkg-deb >/dev/null; then
    dpkg-deb -x "$f" "$PREFIX"
  else  # a non-Debian image: unpack the data member by hand
    (d=$(mktemp -d) && cd "$d" && ar x "$ROOT/$f" && tar -xf data.tar.* -C "$PREFIX"; rm -rf "$d")
  fi
  n=$((n + 1))
done
added=0
kept=0
if [ -w / ]; then
  # Add what the image lacks; never overwrite the image's own files (its libs may be newer).
  while IFS= read -r p; do
    if [ -e "/$p" ] || [ -L "/$p" ]; then
      kept=$((kept + 1))
    else
      mkdir -p "/$(dirname "$p")" && cp -a "$PREFIX/$p" "/$p" && added=$((added + 1))
    fi
  done < <(cd "$PREFIX" && find . \( -type f -o -type l \) | sed 's#^\./##')
  ldconfig
  echo "$n packages unpacked: $added files added to /, $kept already on the image (left as they are)"
  RT_LIBS=""
else
  echo "/ is not writable: using $PREFIX through LD_LIBRARY_PATH (for our binaries only)"
  RT_LIBS="$PREFIX/usr/lib/x86_64-linux-gnu:$PREFIX/usr/lib/x86_64-linux-gnu/openblas-openmp:$PREFIX/lib/x86_64-linux-gnu"
  export PATH="$PATH:$PREFIX/usr/bin"
  export OPAL_PREFIX="$PREFIX/usr"
fi
for tool in mpiexec mpirun; do  # Debian names them through update-alternatives, which dpkg -x does not run
  if ! command -v $tool >/dev/null && [ -x /usr/bin/orterun ]; then ln -sf orterun /usr/bin/$tool; fi
done
command -v mpiexec >/dev/null && mpiexec --version 2>&1 | head -1
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_pml=ob1 OMPI_MCA_btl=self,vader,tcp OMPI_MCA_btl_vader_single_copy_mechanism=none
export OMPI_MCA_mca_base_component_show_load_errors=0  # plugins for InfiniBand/OFI/UCX were not carried

echo "--- CUDA libraries of this machine"
# cuDNN, NCCL, cuBLAS, NVRTC, cudart come from the machine (the CUDA toolkit or
# PyTorch's pip packages), never carried.
SEARCH=$(python3 -c 'import site, sys; print(" ".join(site.getsitepackages()))' 2>/dev/null)
CUDA_DIRS=""
for lib in libcudnn.so.9 libnccl.so.2 libcublas.so.13 libcublasLt.so.13 libnvrtc.so.13 libcudart.so.13; do
  p=$(find /usr/local/cuda/lib64 /usr/local/cuda/lib /usr/local/cuda/targets/x86_64-linux/lib $SEARCH \
        /usr/lib/x86_64-linux-gnu -name "$lib" 2>/dev/null | head -1)
  [ -n "$p" ] || p=$(find / -xdev -name "$lib" -not -path '/proc/*' 2>/dev/null | head -1)
  if [ -n "$p" ]; then
    echo "$lib: $p"
    d=$(dirname "$p")
    case ":$CUDA_DIRS:" in *":$d:"*) ;; *) CUDA_DIRS="$CUDA_DIRS:$d" ;; esac
  else
    echo "$lib: NOT FOUND"
  fi
done
MPT_LIBS=$(find "$ROOT/$RUN" -name 'libmpitron_*.so' -printf '%h\n' 2>/dev/null | sort -u | tr '\n' ':')
export LD_LIBRARY_PATH="${MPT_LIBS}${CUDA_DIRS#:}${RT_LIBS:+:$RT_LIBS}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
echo "LD_LIBRARY_PATH=$LD_LIBRARY_PATH"

# The carried ctest files and the test binaries name the source root of the build machine.
BUILT_AT=$(cat "$RUN/BUNDLE_ROOT" 2>/dev/null || echo "$ROOT")
if [ "$BUILT_AT" != "$ROOT" ]; then
  find "$RUN" -name CTestTestfile.cmake -exec sed -i "s#$BUILT_AT/#$ROOT/#g" {} +
  if [ ! -e "$BUILT_AT" ]; then mkdir -p "$(dirname "$BUILT_AT")" && ln -s "$ROOT" "$BUILT_AT"; fi
  echo "source root: built at $BUILT_AT, here $ROOT (ctest files rewritten, $BUILT_AT -> $ROOT)"
fi
echo "--- missing shared libraries (should be none)"
ldd "$RUN/bench/bench_train" "$RUN"/tests/tensor_test_gemm 2>&1 | grep "not found" | sort -u || true
printf '%-12s %-28s %5s s\n' setup ok $(($(date +%s) - START)) >>"$SUMMARY"

# ---- the steps, most needed first ----------------------------------------------------------------
# A session's whole device time is 15 minutes, the machine's start included, so ONE call has to bring
# back what issue #14 needs, in this order: the CUDA tests; our 124M / Llama / 1.3B rows with llm.c and
# the compiled PyTorch peer beside them (the ratios); the MFU table with its GEMM ceiling (1.5B); the
# parallel equivalence tests on the device; the cuBLAS attention fallback; per-op rates; the remaining
# rows (recompute, eager and Llama PyTorch); last the tests that have no CUDA path (CI runs them too).
# A step that no longer fits is skipped and says so; what ran is in the summary either way.
want() { [ "$PARTS" = all ] || [ "$PARTS" = "$1" ]; }
# Every test with a CUDA path: the tensor ops (cuDNN attention, vector kernels), core, the bf16 GPT
# reference against PyTorch, the trainer on the device (MPITRON_TEST_DEVICE=cuda), comm/grid/ZeRO
# with device buffers, the inference engine and runner (the paged KV cache on the device; TP/PP at 2 and 4 ranks),
# context parallelism's attention (new tensor_test_* join by the regex: e.g. attention_bias, T5's biased,
# padded blocks on the fallback, and relu; attention_softcap (Gemma 2's capped scores, always the fallback),
# softcap, head_norm (QK-norm on packed-qkv views) and rope_scaling (linear/dynamic/llama3/yarn); issue 42's
# MLA blocks (Dqk 192 != Dv 128: cuDNN or the fallback; a cuDNN refusal of d_qk != d_v is logged as "attention:
# cuDNN ... unavailable ... Dv=", and bench_ops has "attention MLA" rows) and group-limited moe_router); the 2026
# families against transformers (model_test_families2_cuda).
CUDA_TESTS='^(tensor_|core_|model_test_gpt_reference$|model_test_t5$|model_test_families2_cuda$|model_test_trainer$|model_test_inference_|parallel_test_(comm|grid|zero|context_parallel|muon))'
# CUDA_RERUN (a ctest -R regex) reruns only those tests, e.g. what failed in the first call.
want tests && step ctest_cuda 120 60 bash -c "set -o pipefail; MPITRON_TEST_DEVICE=cuda ctest --test-dir '$RUN' -R '${CUDA_RERUN:-$CUDA_TESTS}' --output-on-failure -j 12 --timeout 90 2>&1 | tee -a '$OUT/ctest.log'"
want bench && step bench_train 110 45 "$RUN/bench/bench_train" --device cuda --config "${BENCH_TRAIN_CONFIGS:-124M,llama-124M,moe-124M,mla-moe-124M,1.3B,llama-1B}" \
  --batch 8 --seq 1024 --warmup 2 --steps 6 --recompute off --json "$OUT/bench_train.json"
# Muon's step beside AdamW's (issue 44): the same 124M and llama-124M steps with --optimizer muon (Newton-Schulz on
# every weight matrix, bf16 operands: Megatron's medium precision) — the overhead is ms/step against the rows above.
want bench && step bench_muon 50 20 "$RUN/bench/bench_train" --device cuda --config 124M,llama-124M --optimizer muon \
  --batch 8 --seq 1024 --warmup 2 --steps 6 --recompute off --json "$OUT/bench_train_muon.json"
# llm.c (tools/prepare_llmc.sh built it into build-llmc, carried): 124M at T=1024 with B=8 (bench_train's
# row) and B=16 (bench_mfu's), -r 0: no recompute, as our rows (its default -r 1 recomputes GELU).
want bench && step llmc 70 25 python3 bench/peers/llmc_gpt.py --llmc build-llmc --batch 8,16 --seq 1024 --steps 12 \
  --warmup 3 --recompute 0 --json "$OUT/llmc.json"
# The PyTorch peer on the 124M row (same B, T, steps): torch.compile + SDPA flash attention + bf16 autocast.
want bench && step torch 110 50 python3 bench/peers/torch_gpt.py --preset 124M --device cuda --batch 8 --seq 1024 \
  --warmup 3 --steps 6 --compile --json "$OUT/torch_compile.json"
# compute-sanitizer over the op tests: memcheck on every tensor_test_* (8 at a time), racecheck on the
# kernels with shared-memory reductions. Each test under its own timeout; the ERROR SUMMARY per test.
SAN=$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer /opt/nvidia/*/compute-sanitizer 2>/dev/null | head -1)
SAN_TESTS=${SAN_TESTS:-$(cd "$RUN/tests" 2>/dev/null && ls tensor_test_* | sed 's/^tensor_test_//' | tr '\n' ' ')}
want tests && step sanitizer 150 30 bash -c "[ -n '$SAN' ] || { echo 'no compute-sanitizer on this machine'; exit 3; }; cd '$RUN'; \
  run1() { case \$2 in attention*) t=${SAN_TIMEOUT:-110};; *) t=${SAN_TIMEOUT:-55};; esac; timeout \$t '$SAN' --tool \$1 --error-exitcode 9 --print-limit 3 tests/tensor_test_\$2 >/tmp/san_\$1_\$2.log 2>&1; rc=\$?; \
    echo \"sanitizer \$1 \$2 rc=\$rc \$(grep -m1 'ERROR SUMMARY' /tmp/san_\$1_\$2.log)\"; [ \$rc -eq 0 ] || grep -m 8 -E '=====.*(Invalid|Race|Uninit|Error|error)' /tmp/san_\$1_\$2.log; [ \$rc -eq 0 ]; }; \
  export -f run1; fail=0; { for t in $SAN_TESTS; do echo memcheck \$t; done; for t in ${SAN_RACE-layernorm rmsnorm head_norm softmax cross_entropy norm}; do echo racecheck \$t; done; } | \
  xargs -P 8 -n 2 bash -c 'run1 \$0 \$1' || fail=1; exit \$fail" 2>&1 | tee -a "$OUT/ctest.log"
want bench && step bench_mfu 100 40 "$RUN/bench/bench_mfu" --warmup 3 --steps 8 --json "$OUT/bench_mfu.json"
# Where the 124M step's time goes: Nsight Compute times every kernel of 2 timed steps (bench_train
# --profile marks them; ncu leaves the clocks alone), bench/kernel_profile.py sums them per kernel and
# class and sets them against the unprofiled step of bench_train.json (the rest: launch/host gaps).
PROFILE_CONFIG=${PROFILE_CONFIG:-124M} PROFILE_STEPS=${PROFILE_STEPS:-2}  # the profiled preset (B=8, T=1024) and steps
NCU=$(command -v ncu || ls /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
PROFILE_TXT=${TMPDIR:-/tmp}/mpitron_kernel_profile.txt  # printed in summary.txt (8 files at most come back)
rm -f "$PROFILE_TXT"
want bench && step profile 90 40 bash -c "[ -n '$NCU' ] || { echo 'no ncu on this machine'; exit 3; }; '$NCU' --profile-from-start off \
  --clock-control none --cache-control none --csv --metrics gpu__time_duration.sum --log-file /tmp/ncu_124M.csv \
  '$RUN/bench/bench_train' --device cuda --config $PROFILE_CONFIG --batch 8 --seq 1024 --warmup 2 --steps $PROFILE_STEPS --recompute off \
  --profile >/tmp/ncu_run.log 2>&1; rc=\$?; tail -3 /tmp/ncu_run.log; python3 bench/kernel_profile.py /tmp/ncu_124M.csv \
  --steps $PROFILE_STEPS --bench-json '$OUT/bench_train.json' --config $PROFILE_CONFIG | tee '$PROFILE_TXT'; exit \$rc"
# Tensor/pipeline/data-parallel equivalence with device tensors (ZeRO-3 included): 2 and 4 ranks
# share the one GPU, communicating through MPI (host-staged, --force-mpi-for-device).
want tests && step mp_cuda 120 50 bash -c "set -o pipefail; cd '$RUN' && { fail=0; for np in 2 4; do for t in ${MP_TESTS:-model_test_trainer_mp model_test_bert_train_mp model_test_trainer_zero3 model_test_trainer_moe parallel_test_expert_parallel}; do \
  echo \"--- \$t np \$np\"; MPITRON_TEST_DEVICE=cuda OMP_NUM_THREADS=2 mpirun --allow-run-as-root --oversubscribe -np \$np tests/\$t \
  >/tmp/mp_cuda.log 2>&1 || { fail=1; echo \"FAILED \$t np \$np\"; grep -m 5 -E 'ERROR|error:|hint:' /tmp/mp_cuda.log; }; \
  grep -E '(test cases|assertions):' /tmp/mp_cuda.log | tail -2; done; done; exit \$fail; } 2>&1 | tee -a '$OUT/ctest.log'"
# Per-rank memory of every way of holding the model states on the GPU (ranks sharing it, MPI
# collectives): ZeRO 0-3 at dp 1, 2, 4, the estimate beside the measured peak (its table goes into summary.txt).
ZERO_TABLE=${TMPDIR:-/tmp}/mpitron_zero_states.txt
rm -f "$ZERO_TABLE"
want bench && step zero3 100 40 bash -c "set -o pipefail; BUILD='$RUN' DTYPE=--bf16 OMP_NUM_THREADS=2 bench/zero_states.sh cuda | tee '$ZERO_TABLE'"
# The data-parallel step with and without overlap (bucket reduce during backward, ZeRO-2's
# reduce-scatter and parameter all-gather), dp 2 (bench/dp_step_bench.h). The ranks share the one
# GPU, so the dp communicator is MPI staged through host memory here (4 ranks of 124M took over 90 s,
# 2026-11-27); on a node with a GPU per rank it is NCCL.
want bench && step dp_overlap 90 40 bash -c "OMP_NUM_THREADS=4 mpirun --allow-run-as-root --oversubscribe -np 2 \
  '$RUN/bench/bench_comm' --dp-step 124M --device cuda --dtype bf16 --dp-batch 2 --dp-seq 512 --dp-steps 3"
# Context parallelism on the device (the block attention kernels run in ctest_cuda: tensor_test_attention_block,
# and the cp attention over the group in parallel_test_context_parallel): the trainer at the one-process losses,
# then the long-sequence bench (4 ranks share the GPU through MPI; each rank's activation peak is its own).
CP_TABLE=${TMPDIR:-/tmp}/mpitron_bench_cp.txt
rm -f "$CP_TABLE"
want tests && step cp 100 45 bash -c "set -o pipefail; cd '$RUN' && { fail=0; for np in 2 4; do   echo \"--- model_test_trainer_cp np \$np\"; MPITRON_TEST_DEVICE=cuda MPITRON_TEST_LAYOUTS=0 OMP_NUM_THREADS=2 mpirun --allow-run-as-root \
  --oversubscribe -np \$np tests/model_test_trainer_cp >/tmp/cp_cuda.log 2>&1 || { fail=1; echo \"FAILED model_test_trainer_cp np \$np\"; \
  grep -m 5 -E 'ERROR|error:|hint:' /tmp/cp_cuda.log; }; grep -E '(test cases|assertions):' /tmp/cp_cuda.log | tail -2; done; \
  OMP_NUM_THREADS=2 mpirun --allow-run-as-root --oversubscribe -np 4 bench/bench_cp --device cuda --bf16 --seq ${CP_SEQ:-16384} \
  --steps 3 2>&1 | grep -v '^ iteration\|^ validation\|^---' | tail -12 | tee '$CP_TABLE' || fail=1; exit \$fail; } 2>&1 | tee -a '$OUT/ctest.log'"
want tests && step cublas 60 25 bash -c "set -o pipefail; MPITRON_ATTENTION=cublas ctest --test-dir '$RUN' -R '^tensor_' --output-on-failure -j 8 --timeout 50 2>&1 | tee -a '$OUT/ctest.log' | tail -5"
want bench && step bench_ops 45 20 "$RUN/bench/bench_ops" --device cuda --min-time 0.05 --json "$OUT/bench_ops.json"
want bench && step bench_more 80 30 "$RUN/bench/bench_train" --device cuda --config tiny,124M,350M,1.3B \
  --batch 8 --seq 1024 --warmup 2 --steps 6 --recompute on --json "$OUT/bench_train_more.json"
want bench && step torch_more 90 40 bash -c "python3 bench/peers/torch_gpt.py --preset 124M --device cuda --batch 8 \
  --seq 1024 --warmup 2 --steps 6 --json '$OUT/torch_eager.json' && python3 bench/peers/torch_gpt.py --preset llama-124M \
  --device cuda --batch 8 --seq 1024 --warmup 3 --steps 6 --compile --json '$OUT/torch_llama.json'"
want tests && step ctest_rest 120 30 bash -c "set -o pipefail; ctest --test-dir '$RUN' -E '$CUDA_TESTS' --output-on-failure -j 8 --timeout 110 2>&1 | tee -a '$OUT/ctest.log' | tail -5"
# Serving (issue #30): the dynamic engine and the one-at-a-time server on the GPU, 1/8/32 clients,
# transformers' generate beside them when the image has torch + transformers (else a note). The
# table goes into the summary (8 files at most come back).
SERVE_TXT=${TMPDIR:-/tmp}/mpitron_bench_serve.txt
rm -f "$SERVE_TXT"
want bench && step bench_serve 120 40 bash -c "set -o pipefail; python3 bench/bench_serve.py --build '$RUN' --threads 8 \
  --hf-device cuda --make-device cuda --clients ${SERVE_CLIENTS:-1,8,32} --requests 1 --new-tokens 32 --layers 12 --hidden 768 --heads 12 --positions 1024 \
  | tee '$SERVE_TXT'"
# At most 8 files come back: fold the extra JSON files into bench_train.json and torch_peer.json.
python3 - "$OUT" <<'EOF' >/dev/null 2>&1 || true
import json, os, sys
out = sys.argv[1]
def fold(into, parts):
    base = os.path.join(out, into)
    j = json.load(open(base)) if os.path.exists(base) else None
    for n in parts:
        p = os.path.join(out, n)
        if os.path.exists(p):
            k = json.load(open(p))
            if j is None:
                j = k
            else:
                j["rows"] += k["rows"]
                j.setdefault("skipped", []).extend(k.get("skipped", []))
            os.remove(p)
    if j is not None:
        json.dump(j, open(base, "w"), indent=2)
fold("bench_train.json", ["bench_train_more.json"])
fold("torch_peer.json", ["torch_compile.json", "torch_eager.json", "torch_llama.json"])
EOF

# ---- summary (last) -------------------------------------------------------------------------
{
  echo
  echo "=== ctest"
  grep -hE "tests passed|tests failed|SKIPPED cuda" "$OUT/ctest.log" 2>/dev/null | sort | uniq -c | head -8
  grep -hE "^\s+[0-9]+ - .*\((Failed|Timeout|SEGFAULT|Subprocess aborted|Exception|Not Run)\)" "$OUT/ctest.log" 2>/dev/null | head -20
  grep -hE "^sanitizer " "$OUT/ctest.log" 2>/dev/null | sort | awk '/rc=0 /{ok++; next} {print} END{print "sanitizer: " ok+0 " runs clean"}'
  python3 - "$OUT" <<'EOF'
import json, os, sys
out = sys.argv[1]
def load(n):
    p = os.path.join(out, n)
    try:
        return json.load(open(p))
    except Exception:
        return None
G = 2**30
print(f"\n=== performance (tokens/s; TFLOP/s by 6*N_matmul + 6*L*T*C; MFU vs 989 bf16 / vs the measured GEMM)")
print(f"{'bench':12s} {'impl':16s} {'config':10s} {'B':>3s} {'T':>5s} {'rc':>3s} {'ms/step':>9s} {'tokens/s':>10s} "
      f"{'TFLOP/s':>8s} {'MFU pk':>7s} {'MFU gm':>7s} {'peak GiB':>8s}")
ceil = None
for name in ("bench_train.json", "bench_mfu.json"):
    j = load(name)
    if not j:
        print(f"{name}: missing")
        continue
    ceil = ceil or j.get("gemm_ceiling_tflops")
    print(f"  ({name}: GEMM ceiling {j['gemm_ceiling_tflops']:.1f} TFLOP/s, {j['gemm_ceiling_what']}; skipped: {len(j['skipped'])})")
    for r in j["rows"]:
        print(f"{name[:-5]:12s} {r['impl']:16s} {r['config']:10s} {r['micro_batch']:3d} {r['seq']:5d} "
              f"{'on' if r['recompute'] else 'off':>3s} {r['ms_per_step']:9.1f} {r['tokens_per_s']:10.0f} "
              f"{r['tflops']:8.1f} {100 * r['tflops'] / 989:6.1f}% {100 * r['mfu_ceiling']:6.1f}% {r['peak_bytes'] / G:8.2f}")
    for s in j.get("skipped", []):
        print(f"  {s}")
bt = load("bench_train.json")
ours = {}  # (config, B, T) -> our row without recompute (bench_train B=8; bench_mfu's own B)
for j in (bt, load("bench_mfu.json")):
    for r in (j or {}).get("rows", []):
        if not r["recompute"]:
            ours.setdefault((r["config"], r["micro_batch"], r["seq"]), r)
peers = [("torch_gpt", r) for r in (load("torch_peer.json") or {}).get("rows", [])]
peers += [("llm.c", r) for r in (load("llmc.json") or {}).get("rows", [])]
ratios = []
for bench, r in peers:
    gm = 100 * r["tflops"] / ceil if ceil else 0
    print(f"{bench:12s} {r['impl']:16s} {r['config']:10s} {r['micro_batch']:3d} {r['seq']:5d} "
          f"{'on' if r['recompute'] else 'off':>3s} {r['ms_per_step']:9.1f} {r['tokens_per_s']:10.0f} {r['tflops']:8.1f} "
          f"{100 * r['tflops'] / 989:6.1f}% {gm:6.1f}% {r['peak_bytes'] / G:8.2f}")
    o = ours.get((r["config"], r["micro_batch"], r["seq"]))
    if o:
        ratios.append(f"  mpitron / {r['impl']} ({r['config']}, B={o['micro_batch']}, T={o['seq']}, ours without "
                      f"recompute): {o['tokens_per_s'] / r['tokens_per_s']:.2f}x")
for bench, r in peers:
    if bench == "llm.c":
        print(f"  llm.c: {r['llmc'].splitlines()[0]}")
        break
if ratios:
    print("\n=== ratios (tokens/s, same run)")
    print("\n".join(ratios))
for key in sorted(k for k in ours if k[0] == "124M"):
    o = ours[key]
    print(f"  target 124M >= 500K tokens/s (B={key[1]}, T={key[2]}): {o['tokens_per_s'] / 1e3:.0f}K "
          f"({'met' if o['tokens_per_s'] >= 5e5 else 'SHORT'})")
    for bench, r in peers:
        if (r["config"], r["micro_batch"], r["seq"]) == key:
            x = o["tokens_per_s"] / r["tokens_per_s"]
            need = 1.1 if bench == "llm.c" else 1.0
            print(f"  target >= {need}x {r['impl']} (B={key[1]}): {x:.2f}x ({'met' if x >= need else 'SHORT'})")
m = load("bench_mfu.json")
for r in (m or {}).get("rows", []):
    if r["config"] == "1.5B":
        print(f"  target 1.5B >= 55% MFU of 989: {100 * r['tflops'] / 989:.1f}% "
              f"({'met' if r['tflops'] >= 0.55 * 989 else 'SHORT'}; {100 * r['mfu_ceiling']:.1f}% of the GEMM "
              f"ceiling {m['gemm_ceiling_tflops']:.0f} TFLOP/s measured in the run)")
if bt:
    rows = {(r["config"], r["recompute"]): r for r in bt["rows"]}
    for (c, rc), r in rows.items():
        if rc or (c, True) not in rows:
            continue
        on = rows[(c, True)]
        print(f"  recompute {c}: peak {r['peak_bytes'] / G:.2f} -> {on['peak_bytes'] / G:.2f} GiB "
              f"({100 * (1 - on['peak_bytes'] / r['peak_bytes']):.1f}% saved), tokens/s "
              f"{100 * (on['tokens_per_s'] / r['tokens_per_s'] - 1):+.1f}%")
j = load("bench_ops.json")
if j:
    print("\n=== bench_ops (CUDA rows: fraction of the measured ceiling)")
    for r in j.get("rows", []):
        if r["device"] != "cpu":
            v = f"{r['tflops']:.1f} TFLOP/s" if r["tflops"] > 0 else f"{r['gbps']:.0f} GB/s"
            print(f"  {r['op']:26s} {r['shape']:22s} {r['dtype']:5s} {v:>14s} {100 * r['fraction_of_ceiling']:5.1f}%")
EOF
  if [ -s "$SERVE_TXT" ]; then echo; echo "=== serving (bench_serve step: tokens/s, latency, KV peak of pool)"; cat "$SERVE_TXT"; fi
  if [ -s "$PROFILE_TXT" ]; then echo; echo "=== where the $PROFILE_CONFIG step's time goes (profile step)"; cat "$PROFILE_TXT"; fi
  if [ -s "$CP_TABLE" ]; then echo; echo "=== context parallelism (cp step: bench_cp, per-rank activation memory and step time)"; cat "$CP_TABLE"; fi
  if [ -s "$ZERO_TABLE" ]; then echo; echo "=== model states (zero3 step: bench/zero_states.sh, per-rank memory, ZeRO 0-3)"; cat "$ZERO_TABLE"; fi
  echo
  echo "=== steps (total $(($(date +%s) - START)) s of the ${DEADLINE} s budget)"
  cat "$SUMMARY"
} | tee "$OUT/summary.tmp"
mv "$OUT/summary.tmp" "$SUMMARY"
