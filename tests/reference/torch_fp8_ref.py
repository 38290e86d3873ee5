#!/usr/bin/env python3
"""PyTorch's float8 casts, the reference for tensor/fp8_format.h (issue 45).

For each format (torch.float8_e4m3fn, torch.float8_e5m2), writes to tests/tensor/ref/torch_fp8.json:
  decode:     the f32 bits of every one of the 256 codes (torch: uint8 tensor .view(fp8).float())
  inputs:     f32 bit patterns the quantiser can meet: every finite code's value, every midpoint
              between neighbours (and between the largest value and the next step, where overflow
              starts) and the f32 values one ulp either side of each, both signs; zeros, Inf, NaN,
              f32 subnormals, huge values, and 2,000 random floats over every exponent that rounds
              to something other than 0 or overflow
  cast:       tensor.to(fp8).view(uint8)                 (PyTorch 2.x's cast: saturating to e4m3fn, ±Inf for e5m2)
  cast_sat:   tensor.clamp(-max, max).to(fp8)            (the saturating cast a quantiser uses)
Run with the reference venv (scripts/setup-reference-venv.sh): PyPI torch 2.x.
"""
import json
import os
import sys

import numpy as np
import torch

OUT = os.path.join(os.path.dirname(__file__), "..", "tensor", "ref", "torch_fp8.json")


def f32_bits(a):
    return np.asarray(a, dtype=np.float32).view(np.uint32)


def inputs_for(dtype):
    codes = torch.arange(256, dtype=torch.uint8).view(dtype).float().numpy()
    finite = np.unique(np.abs(codes[np.isfinite(codes)]).astype(np.float64))
    fmax = float(torch.finfo(dtype).max)
    step_at_max = finite[-1] - finite[-2]
    edges = np.concatenate([finite, [fmax + step_at_max, fmax + 2 * step_at_max]])
    mids = (edges[:-1] + edges[1:]) / 2
    vals = np.concatenate([finite, mids]).astype(np.float32)
    near = np.concatenate([np.nextafter(vals, np.float32(np.inf)), np.nextafter(vals, np.float32(-np.inf)), vals])
    rng = np.random.default_rng(45)
    tiny = float(finite[1])  # the smallest subnormal
    expo = rng.uniform(np.log2(tiny) - 3, np.log2(fmax) + 2, 2000)
    rand = (2.0 ** expo * rng.uniform(1, 2, 2000)).astype(np.float32)
    special = np.array([0.0, np.inf, np.nan, 1e-45, 1e-40, 1.17549435e-38, 3.4028235e38, 1e10, 2.0 ** 31, 2.0 ** 30],
                       dtype=np.float32)
    pos = np.concatenate([near, rand, special]).astype(np.float32)
    allv = np.concatenate([pos, -pos]).astype(np.float32)
    bits = np.unique(f32_bits(allv))
    return bits


def main():
    out = {"torch": torch.__version__, "formats": {}}
    for name, dtype in (("e4m3", torch.float8_e4m3fn), ("e5m2", torch.float8_e5m2)):
        decode = f32_bits(torch.arange(256, dtype=torch.uint8).view(dtype).float().numpy())
        bits = inputs_for(dtype)
        x = torch.from_numpy(bits.view(np.float32).copy())
        fmax = float(torch.finfo(dtype).max)
        cast = x.to(dtype).view(torch.uint8).numpy()
        cast_sat = x.clamp(-fmax, fmax).to(dtype).view(torch.uint8).numpy()
        out["formats"][name] = {
            "decode": [int(b) for b in decode],
            "inputs": [int(b) for b in bits],
            "cast": [int(b) for b in cast],
            "cast_sat": [int(b) for b in cast_sat],
        }
        print(f"{name}: {len(bits)} inputs", file=sys.stderr)
    with open(OUT, "w") as f:
        json.dump(out, f, separators=(",", ":"))
        f.write("\n")


if __name__ == "__main__":
    main()
