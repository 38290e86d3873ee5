#!/usr/bin/env bash
# tests/cuda_sim/kernel_report.sh COUNTS [SRC_DIR] — after the simulated suite:
# one line `kernel <name> launches <n>` per __global__ kernel of tensor/cuda
# (found by scanning the sources), summing the per-process counts the simulated
# device appended to COUNTS. Fails if any kernel was never launched, or if a
# launched name is not a __global__ of tensor/cuda (the scan missed one).
set -euo pipefail
counts=$1
src=${2:-$(cd "$(dirname "$0")/../.." && pwd)/tensor/cuda}
[ -f "$counts" ] || { echo "kernel_report: no launch counts in $counts (did the simulated suite run?)" >&2; exit 1; }
# Kernel names: the identifier before the first '(' after __global__ (launch bounds skipped).
mapfile -t kernels < <(cat "$src"/*.cu "$src"/*.cuh | tr '\n' ' ' |
  grep -oP '__global__\s+(void\s+)?(__launch_bounds__\s*\([^)]*\)\s*)?(void\s+)?\K[A-Za-z_][A-Za-z0-9_]*(?=\s*\()' |
  sort -u)
[ "${#kernels[@]}" -gt 0 ] || { echo "kernel_report: no __global__ kernels found under $src" >&2; exit 1; }
declare -A n
while read -r name c; do n[$name]=$(( ${n[$name]:-0} + c )); done <"$counts"
fail=0
for k in "${kernels[@]}"; do
  echo "kernel $k launches ${n[$k]:-0}"
  [ "${n[$k]:-0}" -gt 0 ] || { echo "kernel_report: kernel $k was never launched by the simulated suite" >&2; fail=1; }
done
for name in "${!n[@]}"; do
  printf '%s\n' "${kernels[@]}" | grep -qx "$name" ||
    { echo "kernel_report: launched kernel $name is not a __global__ of $src" >&2; fail=1; }
done
exit $fail
