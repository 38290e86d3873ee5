#!/usr/bin/env python3
"""Hugging Face transformers' RoPE scaling (ROPE_INIT_FUNCTIONS), as the reference for tensor/rope.h's
RopeScaling (tests/tensor/test_rope_scaling.cpp reads tests/tensor/ref/rope_scaling_ref.json).

Runs transformers' OWN _compute_*_parameters functions (modeling_rope_utils.py, transformers 4.55.4)
without PyTorch: the few torch calls they make (arange, where, clamp, .to, .float) are served by a
numpy stand-in that computes in float64, so the inverse frequencies are the transformers formulas
evaluated in double (torch itself would round them to float32). Needs only:

    python3 -m venv /tmp/ropeenv && /tmp/ropeenv/bin/pip install "transformers==4.55.4" numpy
    /tmp/ropeenv/bin/python tests/reference/rope_scaling_ref.py [--out tests/tensor/ref/rope_scaling_ref.json]

Each case: the config fields (rope_theta, head_dim, partial_rotary_factor, max_position_embeddings,
rope_scaling) and what transformers returns: inv_freq (R/2 values, R = int(head_dim·partial)) and
attention_factor (YaRN multiplies cos and sin by it). "seq_len" is what the dynamic NTK update passes.
"factor" is the factor transformers USES (YaRN with original_max_position_embeddings in rope_scaling
replaces the config's factor by max_position_embeddings / original_max_position_embeddings).
"""
import argparse
import json
import sys
import types

import numpy as np
import transformers
import transformers.modeling_rope_utils as ru


# ---- the numpy stand-in for the torch calls of modeling_rope_utils.py (float64 throughout) ----------
class _T(np.ndarray):
    def to(self, device=None, dtype=None):
        return np.asarray(self, dtype=np.float64).view(_T)

    def float(self):
        return np.asarray(self, dtype=np.float64).view(_T)


def _arange(*args, dtype=None, device=None):
    a = np.arange(*args)
    return (a.astype(np.int64) if dtype == "int64" else a.astype(np.float64)).view(_T)


_torch = types.SimpleNamespace(
    Tensor=_T, int64="int64", float="float64", float32="float64",
    arange=_arange,
    where=lambda c, a, b: np.where(c, a, b).view(_T),
    clamp=lambda x, lo, hi: np.clip(x, lo, hi).view(_T),
)
ru.torch = _torch


def config(base, head_dim, max_pos, scaling, partial=None):
    c = types.SimpleNamespace(rope_theta=base, head_dim=head_dim, hidden_size=head_dim * 8, num_attention_heads=8,
                              max_position_embeddings=max_pos, rope_scaling=scaling)
    if partial is not None:
        c.partial_rotary_factor = partial
    return c


def case(name, base, head_dim, max_pos, scaling, partial=None, seq_len=None):
    c = config(base, head_dim, max_pos, scaling, partial)
    rope_type = scaling["rope_type"]
    inv_freq, attention_factor = ru.ROPE_INIT_FUNCTIONS[rope_type](c, None, seq_len)
    s = dict(scaling)
    factor = s["factor"]
    if rope_type == "yarn" and "original_max_position_embeddings" in s:
        factor = max_pos / s["original_max_position_embeddings"]
    orig = s.get("original_max_position_embeddings", max_pos)
    return dict(name=name, rope_type=rope_type, base=base, head_dim=head_dim, percent=partial or 1.0,
                factor=factor, original_max_position_embeddings=orig,
                low_freq_factor=s.get("low_freq_factor", 0.0), high_freq_factor=s.get("high_freq_factor", 0.0),
                beta_fast=s.get("beta_fast") or 32.0, beta_slow=s.get("beta_slow") or 1.0,
                truncate=s.get("truncate", True), attention_factor_given=s.get("attention_factor") or 0.0,
                mscale=s.get("mscale") or 0.0, mscale_all_dim=s.get("mscale_all_dim") or 0.0,
                seq_len=seq_len or 0, inv_freq=[float(v) for v in np.asarray(inv_freq)],
                attention_factor=float(attention_factor))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="tests/tensor/ref/rope_scaling_ref.json")
    a = ap.parse_args()
    cases = [
        case("linear x4", 10000.0, 64, 8192, {"rope_type": "linear", "factor": 4.0}),
        case("linear x2, partial 0.5", 10000.0, 48, 4096, {"rope_type": "linear", "factor": 2.0}, partial=0.5),
        case("dynamic x2, L = 5000 > 2048", 10000.0, 64, 2048, {"rope_type": "dynamic", "factor": 2.0}, seq_len=5000),
        case("dynamic x4, L = 1000 <= 2048 (unscaled)", 10000.0, 64, 2048, {"rope_type": "dynamic", "factor": 4.0},
             seq_len=1000),
        case("dynamic x2, partial 0.25 (NeoX-like), L = 3000", 10000.0, 128, 2048,
             {"rope_type": "dynamic", "factor": 2.0}, partial=0.25, seq_len=3000),
        case("llama3 (Llama 3.1 8B)", 500000.0, 128, 131072,
             {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
              "original_max_position_embeddings": 8192}),
        case("llama3 (Llama 3.2 1B, x32)", 500000.0, 64, 131072,
             {"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
              "original_max_position_embeddings": 8192}),
        case("yarn (Qwen2.5 x4, 32k -> 128k)", 1000000.0, 128, 131072,
             {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768}),
        case("yarn (DeepSeek-V3: mscale = mscale_all_dim = 1)", 10000.0, 64, 163840,
             {"rope_type": "yarn", "factor": 40.0, "mscale": 1.0, "mscale_all_dim": 1.0, "beta_fast": 32,
              "beta_slow": 1, "original_max_position_embeddings": 4096}),
        case("yarn (mscale 1, mscale_all_dim 0.5)", 10000.0, 64, 40960,
             {"rope_type": "yarn", "factor": 10.0, "mscale": 1.0, "mscale_all_dim": 0.5,
              "original_max_position_embeddings": 4096}),
        case("yarn (gpt-oss: truncate false)", 150000.0, 64, 131072,
             {"rope_type": "yarn", "factor": 32.0, "beta_fast": 32.0, "beta_slow": 1.0, "truncate": False,
              "original_max_position_embeddings": 4096}),
        case("yarn (attention_factor given, no original in rope_scaling)", 10000.0, 32, 2048,
             {"rope_type": "yarn", "factor": 8.0, "attention_factor": 1.5, "beta_fast": 16, "beta_slow": 2}),
        case("yarn partial 0.5", 10000.0, 64, 16384,
             {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 4096}, partial=0.5),
    ]
    with open(a.out, "w") as f:
        json.dump({"transformers": transformers.__version__, "cases": cases}, f, indent=1)
        f.write("\n")
    print(f"wrote {len(cases)} cases to {a.out} (transformers {transformers.__version__})", file=sys.stderr)


if __name__ == "__main__":
    main()
