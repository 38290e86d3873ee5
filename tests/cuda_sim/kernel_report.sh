#!/usr/bin/env bash
# tests/cuda_sim/kernel_report.sh COUNTS [SRC_DIR] — after the simulated suite:
# one line `kernel <name> launches <n>` per __global__ kernel of tensor/cuda
# (found by scanning the sources), summing the per-process counts the simulated
# device appended to COUNTS, then one line `nccl <call> calls <n>` per call of
# the NCCL stand-in (what parallel/comm_nccl.cpp issued). Fails if any kernel was
# never launched, if a launched name is not a __global__ of tensor/cuda (the scan
# missed one), or if one of the NCCL calls mpitron makes was never made.
set -euo pipefail
counts=$1
src=${2:-$(cd "$(dirname "$0")/../.." && pwd)/tensor/cuda}
[ -f "$counts" ] || { echo "kernel_report: no launch counts in $counts (did the simulated suite run?)" >&2; exit 1; }
# Kernel names: the identifier before the first '(' after __global__ (launch bounds skipped).
mapfile -t kernels < <(cat "$src"/*.cu "$src"/*.cuh | tr '\n' ' ' |
  grep -oP '__global__\s+(void\s+)?(__launch_bounds__\s*\([^)]*\)\s*)?(void\s+)?\K[A-Za-z_][A-Za-z0-9_]*(?=\s*\()' |
  sort -u)
[ "${#kernels[@]}" -gt 0 ] || { echo "kernel_report: no __global__ kernels found under $src" >&2; exit 1; }
declare -A n nccl
while read -r name c; do
  case $name in
    nccl:*) nccl[${name#nccl:}]=$(( ${nccl[${name#nccl:}]:-0} + c )) ;;
    *) n[$name]=$(( ${n[$name]:-0} + c )) ;;
  esac
done <"$counts"
fail=0
for k in "${kernels[@]}"; do
  echo "kernel $k launches ${n[$k]:-0}"
  [ "${n[$k]:-0}" -gt 0 ] || { echo "kernel_report: kernel $k was never launched by the simulated suite" >&2; fail=1; }
done
for name in "${!n[@]}"; do
  printf '%s\n' "${kernels[@]}" | grep -qx "$name" ||
    { echo "kernel_report: launched kernel $name is not a __global__ of $src" >&2; fail=1; }
done
# What comm_nccl.cpp calls: init from an MPI-broadcast id, the collectives (even
# and, grouped, the uneven ncclReduce / ncclBroadcast ones), point-to-point batches.
for call in ncclGetUniqueId ncclCommInitRank ncclAllReduce ncclReduceScatter ncclAllGather ncclBroadcast ncclReduce \
            ncclSend ncclRecv ncclGroupEnd; do
  echo "nccl $call calls ${nccl[$call]:-0}"
  [ "${nccl[$call]:-0}" -gt 0 ] || { echo "kernel_report: $call was never called by the simulated suite" >&2; fail=1; }
done
exit $fail
