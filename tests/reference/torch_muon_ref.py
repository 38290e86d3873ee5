#!/usr/bin/env python3
"""torch.optim.Muon (weight matrices) chained with torch.optim.AdamW (the rest) over a few steps, float64,
for mpitron's --optimizer muon (parallel/muon_rule.cpp; tests/parallel/test_muon.cpp).

Run from the repository root with the reference venv (PyPI torch >= 2.9; scripts/setup-reference-venv.sh):
    /work/.venv-ref/bin/python tests/reference/torch_muon_ref.py
Writes tests/parallel/ref/torch_muon.json:
  {"torch": VERSION, "params": [{"name", "shape", "decay", "matrix", "row_parts"}], "cases": [{"name",
   "momentum", "nesterov", "weight_decay", "scale_mode", "extra_scale", "split_qkv", "adam": {beta1, beta2, eps},
   "clip_grad", "loss_scale", "lrs", "init": [N], "grads": [[N] per step, multiplied by loss_scale],
   "grad_norms", "values": [[N] after each step]}]}

Megatron-Core's Muon is TensorParallelMuon (emerging_optimizers) on the 2-D weights that are not embeddings or
the output layer, Adam on the rest, one learning rate, gradients clipped over all of them first. torch.optim.Muon
computes the same update for the "simple" coefficients (3.4445, -4.7750, 2.0315): buf.lerp_(g, 1 - momentum),
Nesterov g.lerp(buf, momentum), Newton-Schulz on the wide orientation after dividing by the Frobenius norm,
p *= 1 - lr·wd, p -= lr·ratio·O. Its adjust_lr_fn ratios are Megatron's scale modes: None (sqrt(max(1, A/B)))
is shape_scaling, "spectral_unclamped" (sqrt(A/B)) is unit_rms_norm, and "match_rms_adamw" (0.2·sqrt(max(A, B)))
is spectral with --muon-extra-scale-factor 0.2. A fused qkv split into q, k, v (Megatron's split_qkv) is three
torch parameters here.

torch.optim.Muon rounds the matrix to bfloat16 before its Newton-Schulz loop (torch/optim/_muon.py:
grad.to(dtype=torch.bfloat16)); for a float64 reference this script runs torch's own code with torch.bfloat16
bound to torch.float64 during the steps (nothing else in torch is used meanwhile), so the loop is torch's,
the arithmetic float64.
"""
import contextlib
import json
import os
import sys

import numpy as np
import torch

# name, shape, decay, a matrix for Muon, row parts of a fused weight (local rows of q | k | v)
PARAMS = [
    ("emb", [6, 8], True, False, []),
    ("w_wide", [8, 12], True, True, []),
    ("w_tall", [12, 8], True, True, []),
    ("bias", [12], False, False, []),
    ("qkv", [16, 8], True, True, [8, 4, 4]),
    ("norm", [8], False, False, []),
]
ADAM = dict(beta1=0.9, beta2=0.95, eps=1e-8)
CASES = [
    ("shape_scaling_nesterov_wd_clip", dict(momentum=0.95, nesterov=True, weight_decay=0.1, scale_mode="shape_scaling",
                                            extra_scale=1.0, split_qkv=True, adjust=None, clip_grad=1.0,
                                            loss_scale=8.0, lrs=[0.02, 0.05, 0.05, 0.03])),
    ("spectral_0.2_plain_momentum", dict(momentum=0.9, nesterov=False, weight_decay=0.0, scale_mode="spectral",
                                         extra_scale=0.2, split_qkv=True, adjust="match_rms_adamw", clip_grad=0.0,
                                         loss_scale=1.0, lrs=[0.01, 0.02, 0.02])),
    ("unit_rms_norm_whole_qkv", dict(momentum=0.95, nesterov=True, weight_decay=0.05, scale_mode="unit_rms_norm",
                                     extra_scale=1.0, split_qkv=False, adjust="spectral_unclamped", clip_grad=1.0,
                                     loss_scale=2.0, lrs=[0.03, 0.03, 0.01])),
]


@contextlib.contextmanager
def float64_newton_schulz():
    saved = torch.bfloat16
    torch.bfloat16 = torch.float64
    try:
        yield
    finally:
        torch.bfloat16 = saved


def run(name, c, rng):
    n = sum(int(np.prod(s)) for _, s, _, _, _ in PARAMS)
    init = rng.normal(0.0, 0.5, n).astype(np.float32).astype(np.float64)  # f32-representable: mpitron starts here
    params, at = [], 0
    for _, shape, _, _, _ in PARAMS:
        k = int(np.prod(shape))
        params.append(torch.nn.Parameter(torch.tensor(init[at:at + k], dtype=torch.float64).reshape(shape)))
        at += k
    # Muon's tensors: views are not leaves, so a fused weight split into parts is held as separate leaves and
    # written back after each step.
    muon_leaves, adam_dec, adam_nodec, parts_of = [], [], [], []
    for p, (_, shape, decay, matrix, parts) in zip(params, PARAMS):
        if matrix:
            rows = parts if (parts and c["split_qkv"]) else [shape[0]]
            leaves = [torch.nn.Parameter(t.clone()) for t in torch.split(p.detach(), rows, dim=0)]
            muon_leaves += leaves
            parts_of.append((p, leaves, rows))
        elif decay:
            adam_dec.append(p)
        else:
            adam_nodec.append(p)
    muon = torch.optim.Muon(muon_leaves, lr=c["lrs"][0], weight_decay=c["weight_decay"], momentum=c["momentum"],
                            nesterov=c["nesterov"], ns_coefficients=(3.4445, -4.7750, 2.0315), eps=1e-7, ns_steps=5,
                            adjust_lr_fn=c["adjust"])
    adam = torch.optim.AdamW([{"params": adam_dec, "weight_decay": c["weight_decay"]},
                              {"params": adam_nodec, "weight_decay": 0.0}],
                             lr=c["lrs"][0], betas=(ADAM["beta1"], ADAM["beta2"]), eps=ADAM["eps"])
    grads, norms, values = [], [], []
    for s, lr in enumerate(c["lrs"]):
        g = rng.normal(0.0, 0.3 * (1 + s), n).astype(np.float32).astype(np.float64)  # grows: later steps clip
        grads.append((g * c["loss_scale"]).tolist())
        at = 0
        for p, (_, shape, _, _, _) in zip(params, PARAMS):
            k = int(np.prod(shape))
            p.grad = torch.tensor(g[at:at + k] * c["loss_scale"], dtype=torch.float64).reshape(shape) / c["loss_scale"]
            at += k
        if c["clip_grad"] > 0:
            norms.append(float(torch.nn.utils.clip_grad_norm_(params, c["clip_grad"])))
        else:
            norms.append(float(torch.sqrt(sum((p.grad ** 2).sum() for p in params))))
        for p, leaves, rows in parts_of:
            for leaf, gpart in zip(leaves, torch.split(p.grad, rows, dim=0)):
                leaf.grad = gpart.clone()
        for opt in (muon, adam):
            for grp in opt.param_groups:
                grp["lr"] = lr
        with float64_newton_schulz():
            muon.step()
        adam.step()
        with torch.no_grad():
            for p, leaves, _ in parts_of:
                p.copy_(torch.cat([leaf.detach() for leaf in leaves], dim=0))
        values.append(torch.cat([p.detach().reshape(-1) for p in params]).tolist())
    out = dict(c)
    out.pop("adjust")
    return dict(name=name, init=init.tolist(), grads=grads, grad_norms=norms, values=values, adam=ADAM, **out)


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else "tests/parallel/ref/torch_muon.json"
    rng = np.random.default_rng(45)
    cases = [run(n, c, rng) for n, c in CASES]
    os.makedirs(os.path.dirname(out), exist_ok=True)
    with open(out, "w") as f:
        json.dump({"torch": torch.__version__,
                   "params": [{"name": n, "shape": s, "decay": d, "matrix": m, "row_parts": r}
                              for n, s, d, m, r in PARAMS], "cases": cases}, f)
        f.write("\n")
    print(f"wrote {out}: {len(cases)} cases")


if __name__ == "__main__":
    main()
