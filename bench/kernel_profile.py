#!/usr/bin/env python3
"""Where a training step's GPU time goes: an Nsight Compute kernel list, summarised.

Input: the CSV that `ncu --csv --metrics gpu__time_duration.sum` writes for the timed steps of
`bench_train --profile` (the steps run between cudaProfilerStart/Stop; ncu started with
--profile-from-start off records only them; tools/gpu_check.sh's profile step):

    ncu --profile-from-start off --clock-control none --cache-control none --csv \\
        --metrics gpu__time_duration.sum --log-file ncu.csv \\
        build-gpu-run/bench/bench_train --device cuda --config 124M --recompute off --warmup 2 --steps 2 --profile
    python3 bench/kernel_profile.py ncu.csv --steps 2 --bench-json bench_train.json --config 124M

Prints per step: kernel launches, the sum of kernel durations, and, with the unprofiled row of
the same config from bench_train's JSON, the step's wall time and the part of it no kernel ran
(launch and host gaps, allocator and synchronisation stalls: wall - kernel sum). Then the kernels
by total time (launches per step, ms per step, share, mean microseconds) and the time per class
(GEMM, attention, the rest). ncu runs kernels one at a time, so the sum is the kernels' own time;
--clock-control none leaves the card's clocks as they are.

Both of ncu's CSV layouts are read: --page details (one row per kernel and metric: "Kernel Name",
"Metric Name", "Metric Unit", "Metric Value") and --page raw (one row per kernel, one column per
metric, a units row under the header).
"""
import argparse
import collections
import csv
import io
import json
import sys

UNIT_NS = {"ns": 1.0, "nsecond": 1.0, "nanosecond": 1.0, "us": 1e3, "usecond": 1e3, "microsecond": 1e3,
           "ms": 1e6, "msecond": 1e6, "millisecond": 1e6, "s": 1e9, "second": 1e9}
METRIC = "gpu__time_duration.sum"


def number(s):
    return float(s.replace(",", "").strip())


def read_kernels(text):
    """[(kernel name, duration ns)] in launch order. Raises ValueError when no kernel rows are found."""
    lines = [l for l in text.splitlines() if l.startswith('"')]  # ncu's own ==PROF== lines and the app's output go
    rows = list(csv.reader(io.StringIO("\n".join(lines))))
    if not rows:
        raise ValueError("no CSV rows (did ncu profile any kernel? was --profile passed to bench_train?)")
    head = rows[0]
    out = []
    if "Metric Name" in head:  # details page
        k, n, u, v = (head.index(c) for c in ("Kernel Name", "Metric Name", "Metric Unit", "Metric Value"))
        for r in rows[1:]:
            if len(r) == len(head) and r[n] == METRIC:
                out.append((r[k], number(r[v]) * UNIT_NS.get(r[u].strip(), float("nan"))))
    elif METRIC in head:  # raw page: the row after the header holds the units
        k, m = head.index("Kernel Name"), head.index(METRIC)
        unit = UNIT_NS.get(rows[1][m].strip(), float("nan")) if len(rows) > 1 else float("nan")
        for r in rows[2:]:
            if len(r) == len(head):
                out.append((r[k], number(r[m]) * unit))
    else:
        raise ValueError(f"no '{METRIC}' in the CSV header: {head[:8]}")
    if not out:
        raise ValueError(f"the CSV has a header but no {METRIC} rows")
    if any(d != d for _, d in out):
        raise ValueError("unknown duration unit in the CSV")
    return out


def kernel_class(name):
    n = name.lower()
    if any(s in n for s in ("gemm", "cutlass", "xmma", "nvjet", "cublas", "matmul")):
        return "GEMM (cuBLAS/cuBLASLt)"
    if any(s in n for s in ("cudnn", "fmha", "flash", "sdpa", "attention", "attn")):
        return "attention"
    return "other (norms, activations, softmax/CE, embeddings, AdamW, reductions, copies)"


def summarise(kernels, steps, wall_ms=None, top=15):
    total_ns = sum(d for _, d in kernels)
    lines = []
    per = total_ns / steps / 1e6
    lines.append(f"kernel profile: {len(kernels) / steps:.0f} launches per step, {per:.2f} ms of kernel time per step "
                 f"({steps} profiled steps)")
    if wall_ms:
        gap = wall_ms - per
        lines.append(f"  step wall time {wall_ms:.2f} ms (unprofiled run): {gap:.2f} ms ({100 * gap / wall_ms:.1f}%) "
                     f"with no kernel running (launch/host gaps, allocator, synchronisation)")
    by = collections.defaultdict(lambda: [0, 0.0])
    for name, d in kernels:
        by[name][0] += 1
        by[name][1] += d
    lines.append(f"  {'kernel':60s} {'launch/step':>11s} {'ms/step':>8s} {'share':>6s} {'mean us':>8s}")
    for name, (cnt, d) in sorted(by.items(), key=lambda kv: -kv[1][1])[:top]:
        lines.append(f"  {name[:60]:60s} {cnt / steps:11.1f} {d / steps / 1e6:8.3f} {100 * d / total_ns:5.1f}% "
                     f"{d / cnt / 1e3:8.1f}")
    cls = collections.defaultdict(lambda: [0, 0.0])
    for name, d in kernels:
        c = kernel_class(name)
        cls[c][0] += 1
        cls[c][1] += d
    lines.append("  by class:")
    for c, (cnt, d) in sorted(cls.items(), key=lambda kv: -kv[1][1]):
        lines.append(f"    {c:78s} {cnt / steps:7.0f} launches/step {d / steps / 1e6:8.3f} ms/step "
                     f"{100 * d / total_ns:5.1f}%")
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("csv", help="ncu --csv output (--log-file)")
    ap.add_argument("--steps", type=int, required=True, help="timed steps that ran under the profiler")
    ap.add_argument("--bench-json", help="bench_train JSON with the unprofiled row (wall ms/step)")
    ap.add_argument("--config", default="124M", help="which row of --bench-json (recompute off)")
    ap.add_argument("--top", type=int, default=15)
    a = ap.parse_args()
    try:
        kernels = read_kernels(open(a.csv, errors="replace").read())
    except (OSError, ValueError) as e:
        sys.exit(f"kernel_profile: {a.csv}: {e}")
    wall = None
    if a.bench_json:
        try:
            for r in json.load(open(a.bench_json))["rows"]:
                if r["config"] == a.config and not r["recompute"] and r.get("impl", "mpitron") == "mpitron":
                    wall = r["ms_per_step"]
        except (OSError, ValueError, KeyError) as e:
            print(f"kernel_profile: no wall time from {a.bench_json}: {e}", file=sys.stderr)
    print(summarise(kernels, a.steps, wall, a.top))


if __name__ == "__main__":
    main()
