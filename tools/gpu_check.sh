#!/usr/bin/env bash
# tools/gpu_check.sh — every test and benchmark on the lent GPU machine in ONE
# call (docs/gpu.md). Prepared here by tools/prepare_gpu_bundle.sh; on the GPU
# machine, from the repository root, with build-gpu-bundle/ and .debs/ carried:
#
#   bash tools/gpu_check.sh
#
# Steps (each under a timeout, all inside DEADLINE seconds, default 570, so the
# device tool's 600 s limit is never hit; a step that no longer fits is skipped
# and says so):
#   setup     system facts, nvidia-smi; unpack the build tarball and .debs (files the image lacks are
#             added to /, nothing of the image is overwritten), mpiexec links,
#             LD_LIBRARY_PATH to the machine's own cuDNN / NCCL / cuBLAS / NVRTC
#   ctest     every test of the carried CUDA build (CUDA tests included)
#   mp_cuda   the parallel-layout equivalence test on the GPU (ranks share it through MPI)
#   cublas    the tensor tests again with MPITRON_ATTENTION=cublas (the fallback attention)
#   bench_ops per-op throughput on CUDA vs the measured ceilings
#   bench_train  tiny/124M/llama-124M/350M/1.3B/llama-1B, bf16, recompute off and on
#   bench_mfu    GPT-2 124M/350M/774M/1.5B, bf16, seq 1024
#   torch     the PyTorch peer (torch.compile + SDPA flash attention + bf16
#             autocast) on the 124M row of bench_train, eager too
# Everything goes under $OUT (at most 8 files come back): gpu_check.log (all
# output), ctest.log, bench_ops.json, bench_train.json, bench_mfu.json,
# torch_peer.json, summary.txt. The summary table is printed last.
# Environment: OUT, RUN (build-gpu-run), BUNDLE (build-gpu-bundle), DEADLINE (570), PARTS (all | tests | bench).
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

# ---- tests ------------------------------------------------------------------------------
if [ "$PARTS" = all ] || [ "$PARTS" = tests ]; then
  step ctest 240 60 bash -c "ctest --test-dir '$RUN' --output-on-failure -j 8 --timeout 200 2>&1 | tee '$OUT/ctest.log'"
  # Tensor/pipeline/data-parallel equivalence with device tensors: 2 and 4 ranks share the one GPU,
  # communicating through MPI (host-staged, --force-mpi-for-device).
  step mp_cuda 150 60 bash -c "cd '$RUN' && for np in 2 4; do MPITRON_TEST_DEVICE=cuda OMP_NUM_THREADS=2 mpirun --allow-run-as-root --oversubscribe -np \$np tests/model_test_trainer_mp 2>&1 | tail -4; MPITRON_TEST_DEVICE=cuda OMP_NUM_THREADS=2 mpirun --allow-run-as-root --oversubscribe -np \$np tests/model_test_bert_train_mp 2>&1 | tail -4; done | tee -a '$OUT/ctest.log'"
  step cublas 90 30 bash -c "MPITRON_ATTENTION=cublas ctest --test-dir '$RUN' -R '^tensor_' --output-on-failure -j 8 --timeout 80 2>&1 | tee -a '$OUT/ctest.log' | tail -5"
fi

# ---- benchmarks ---------------------------------------------------------------------------
if [ "$PARTS" = all ] || [ "$PARTS" = bench ]; then
  step bench_ops 60 30 "$RUN/bench/bench_ops" --device cuda --min-time 0.05 --json "$OUT/bench_ops.json"
  step bench_train 150 60 "$RUN/bench/bench_train" --device cuda --config tiny,124M,llama-124M,350M,1.3B,llama-1B \
    --batch 8 --seq 1024 --warmup 2 --steps 6 --recompute both --json "$OUT/bench_train.json"
  step bench_mfu 120 45 "$RUN/bench/bench_mfu" --warmup 3 --steps 8 --json "$OUT/bench_mfu.json"
  # The peer on the 124M row of bench_train (same B, T, steps): compiled (its first step compiles), then eager.
  step torch 150 60 bash -c "python3 bench/peers/torch_gpt.py --preset 124M --device cuda --batch 8 --seq 1024 \
      --warmup 3 --steps 6 --compile --json '$OUT/torch_compile.json' && python3 bench/peers/torch_gpt.py \
      --preset 124M --device cuda --batch 8 --seq 1024 --warmup 2 --steps 6 --json '$OUT/torch_eager.json' && \
      python3 bench/peers/torch_gpt.py --preset llama-124M --device cuda --batch 8 --seq 1024 --warmup 3 --steps 6 \
      --compile --json '$OUT/torch_llama.json'"
  python3 - "$OUT" <<'EOF' >/dev/null 2>&1 || true
import json, os, sys
out = sys.argv[1]
rows = []
for n in ("torch_compile.json", "torch_eager.json", "torch_llama.json"):
    p = os.path.join(out, n)
    if os.path.exists(p):
        rows += json.load(open(p))["rows"]
        os.remove(p)
json.dump({"rows": rows}, open(os.path.join(out, "torch_peer.json"), "w"), indent=2)
EOF
fi

# ---- summary (last) -------------------------------------------------------------------------
{
  echo
  echo "=== ctest"
  grep -hE "tests passed|tests failed|SKIPPED cuda" "$OUT/ctest.log" 2>/dev/null | sort | uniq -c | head -8
  grep -hE "^\s+[0-9]+ - .*\((Failed|Timeout|SEGFAULT|Subprocess aborted|Exception|Not Run)\)" "$OUT/ctest.log" 2>/dev/null | head -20
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
print(f"{'bench':12s} {'impl':16s} {'config':6s} {'B':>3s} {'T':>5s} {'rc':>3s} {'ms/step':>9s} {'tokens/s':>10s} "
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
        print(f"{name[:-5]:12s} {r['impl']:16s} {r['config']:6s} {r['micro_batch']:3d} {r['seq']:5d} "
              f"{'on' if r['recompute'] else 'off':>3s} {r['ms_per_step']:9.1f} {r['tokens_per_s']:10.0f} "
              f"{r['tflops']:8.1f} {100 * r['tflops'] / 989:6.1f}% {100 * r['mfu_ceiling']:6.1f}% {r['peak_bytes'] / G:8.2f}")
    for s in j.get("skipped", []):
        print(f"  {s}")
t = load("torch_peer.json")
bt = load("bench_train.json")
ours = None
if bt:
    for r in bt["rows"]:
        if r["config"] == "124M" and not r["recompute"]:
            ours = r
for r in (t or {}).get("rows", []):
    gm = 100 * r["tflops"] / ceil if ceil else 0
    print(f"{'torch_gpt':12s} {r['impl']:16s} {r['config']:6s} {r['micro_batch']:3d} {r['seq']:5d} {'off':>3s} "
          f"{r['ms_per_step']:9.1f} {r['tokens_per_s']:10.0f} {r['tflops']:8.1f} {100 * r['tflops'] / 989:6.1f}% "
          f"{gm:6.1f}% {r['peak_bytes'] / G:8.2f}")
    if ours:
        print(f"  mpitron / {r['impl']} (124M, same B and T): {ours['tokens_per_s'] / r['tokens_per_s']:.2f}x")
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
  echo
  echo "=== steps (total $(($(date +%s) - START)) s of the ${DEADLINE} s budget)"
  cat "$SUMMARY"
} | tee "$OUT/summary.tmp"
mv "$OUT/summary.tmp" "$SUMMARY"
