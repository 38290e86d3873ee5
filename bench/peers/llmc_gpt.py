#!/usr/bin/env python3
"""The llm.c peer of bench_train: karpathy/llm.c's train_gpt2cu on GPT-2 124M, as bench_train's rows.

llm.c is a separate public project; it is never part of mpitron. tools/prepare_llmc.sh builds it on the
CPU machine (sm_90, bf16, cuDNN flash attention) into build-llmc/ with GPT-2 tokens of the bundled
Shakespeare in llm.c's data format, and records its commit in build-llmc/LLMC_INFO; tools/gpu_check.sh
runs this script on the GPU machine.

The run: `train_gpt2cu -e d12` (GPT-2 124M from random init: 12 layers, 768 wide, 12 heads, vocabulary
padded to 50304, as bench_train's 124M), micro-batch B and sequence T as given, total batch B*T (no
gradient accumulation), `-r` recompute (llm.c's 0 = none, like bench_train's recompute off; its default
1 recomputes GELU), no sampling, the validation pass only at step 0 and the last step (outside the
timed steps). llm.c times each step with CUDA events around forward, backward and AdamW; bench_train
synchronises the device and reads the host clock: the same span.

Columns and JSON keys match bench_train (bench/train_step_bench.h): ms_per_step is the median of the
steps after `--warmup` (the first steps build cuDNN graphs), tokens/s = B*T / median, TFLOP/s by
GPTConfig::flops_per_token (gpt_flops.py). peak_bytes is llm.c's own "device memory usage" line
(cudaMemGetInfo after its allocations, CUDA context included), so it is not bench_train's peak.

    python3 bench/peers/llmc_gpt.py --llmc build-llmc --batch 8,16 --seq 1024 --steps 12 --warmup 3 \\
        --recompute 0 --json out/llmc.json
    python3 bench/peers/llmc_gpt.py --parse LOG --batch 8 --seq 1024    (rows from a saved llm.c log)
"""
import argparse
import json
import os
import re
import statistics
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gpt_flops import flops_per_token  # noqa: E402

# "step    4/12 | loss 10.123456 (+0.00z)| norm 1.2345 (+0.00z)| lr 3.00e-04 | 61.23 ms | 45.1% bf16 MFU | 133000 tok/s"
STEP = re.compile(r"^step\s+(\d+)/(\d+) \| loss ([-+0-9.eEnaif]+) .*?\| ([0-9.]+) ms \|")
MEM = re.compile(r"^device memory usage: (\d+) MiB / (\d+) MiB")
L, C, NH, V = 12, 768, 12, 50304  # GPT-2 124M as `-e d12` builds it


def parse(text, B, T, warmup, recompute, info):
    """Rows (one) from an llm.c log. Raises ValueError naming what is missing."""
    steps, losses, mem = [], [], 0
    for line in text.splitlines():
        m = STEP.match(line)
        if m:
            steps.append(float(m.group(4)))
            losses.append(float(m.group(3)))
        m = MEM.match(line)
        if m:
            mem = int(m.group(1)) * 2**20
    if len(steps) <= warmup:
        raise ValueError(f"llm.c printed {len(steps)} step lines, need more than --warmup {warmup}")
    timed = steps[warmup:]
    ms = statistics.median(timed)
    tps = B * T / (ms / 1e3)
    fpt = flops_per_token(L, C, T, V)
    return {
        "impl": f"llm.c r{recompute}", "config": "124M", "family": "gpt2", "device": "cuda", "dtype": "bf16",
        "micro_batch": B, "seq": T, "micro_batches": 1, "recompute": recompute > 0, "llmc_recompute": recompute,
        "steps": len(timed), "warmup": warmup, "threads": 0,
        "ms_per_step": ms, "ms_per_step_mean": sum(timed) / len(timed), "tokens_per_s": tps,
        "tflops": tps * fpt / 1e12, "peak_bytes": mem,
        "peak_what": "llm.c 'device memory usage' (cudaMemGetInfo after allocation, CUDA context included)",
        "loss_first": losses[0], "loss_last": losses[-1], "llmc": info,
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--llmc", default="build-llmc", help="folder made by tools/prepare_llmc.sh")
    ap.add_argument("--batch", default="8", help="micro-batch sizes B, comma-separated (one run each)")
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--steps", type=int, default=12, help="steps in all, warm-up included")
    ap.add_argument("--warmup", type=int, default=3, help="first steps left out of the median")
    ap.add_argument("--recompute", default="0", help="llm.c -r values, comma-separated (0 none, 1 GELU)")
    ap.add_argument("--json", help="write {'rows': [...]} here")
    ap.add_argument("--parse", help="parse this saved llm.c log instead of running")
    a = ap.parse_args()
    if a.steps <= a.warmup:
        sys.exit(f"llmc_gpt: --steps {a.steps} must exceed --warmup {a.warmup}")

    info_path = os.path.join(a.llmc, "LLMC_INFO")
    info = open(info_path).read().strip() if os.path.exists(info_path) else "unknown (no LLMC_INFO)"
    rows, failed = [], False
    batches = [int(x) for x in a.batch.split(",")]
    if a.parse:
        rows.append(parse(open(a.parse).read(), batches[0], a.seq, a.warmup, 0, info))
    else:
        exe = os.path.join(a.llmc, "train_gpt2cu")
        if not os.access(exe, os.X_OK):
            sys.exit(f"llmc_gpt: {exe} not found: run tools/prepare_llmc.sh on the CPU machine and carry {a.llmc}")
        for B, r in [(B, int(x)) for B in batches for x in a.recompute.split(",")]:
            cmd = [exe, "-i", os.path.join(a.llmc, "tinyshakespeare_train.bin"),
                   "-j", os.path.join(a.llmc, "tinyshakespeare_val.bin"), "-e", "d12",
                   "-b", str(B), "-t", str(a.seq), "-x", str(a.steps), "-r", str(r),
                   "-v", str(10 * a.steps), "-m", "2", "-s", "0", "-h", "0"]
            print("llmc_gpt:", " ".join(cmd), flush=True)
            p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            print(p.stdout, flush=True)
            if p.returncode != 0:
                failed = True
                print(f"llmc_gpt: train_gpt2cu -b {B} -r {r} exited with {p.returncode}", file=sys.stderr)
                continue
            rows.append(parse(p.stdout, B, a.seq, a.warmup, r, info))
    for r in rows:
        print(f"{r['impl']:10s} 124M B={r['micro_batch']} T={r['seq']}: {r['ms_per_step']:.2f} ms/step, "
              f"{r['tokens_per_s']:.0f} tokens/s, {r['tflops']:.1f} TFLOP/s, loss {r['loss_first']:.3f}->"
              f"{r['loss_last']:.3f}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"rows": rows}, f, indent=2)
    if failed:
        sys.exit(1)


if __name__ == "__main__":
    main()
