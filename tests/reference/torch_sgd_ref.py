#!/usr/bin/env python3
"""torch.optim.SGD over a few steps, float64, for mpitron's --optimizer sgd
(parallel/update_rule.h; tests/parallel/test_sgd.cpp).

Run from the repository root with the reference venv (PyPI torch; scripts/setup-reference-venv.sh):
    /work/.venv-ref/bin/python tests/reference/torch_sgd_ref.py
Writes tests/parallel/ref/torch_sgd.json:
  {"torch": VERSION, "params": [{"name", "shape", "decay"}], "cases": [{"name", "momentum", "weight_decay",
   "clip_grad", "loss_scale", "lrs": [per step], "init": [N], "grads": [[N] per step, as given to the
   optimizer: multiplied by loss_scale], "grad_norms": [per step, unscaled, before clipping],
   "values": [[N] after each step]}]}
Megatron's SGD: torch.optim.SGD(param_groups, lr, weight_decay, momentum) with two groups (the decaying
weights, and biases / norms with weight decay 0); gradients unscaled and clipped as
torch.nn.utils.clip_grad_norm_ before the step; the learning rate set per step as the scheduler does.
"""
import json
import os
import sys

import numpy as np
import torch

PARAMS = [("w1", [5, 7], True), ("b1", [7], False), ("w2", [7, 3], True), ("ln", [3], False), ("emb", [6, 4], True)]
CASES = [
    ("momentum_wd_clip", dict(momentum=0.9, weight_decay=0.1, clip_grad=1.0, loss_scale=8.0,
                              lrs=[0.05, 0.1, 0.1, 0.08, 0.02, 0.05])),
    ("no_momentum", dict(momentum=0.0, weight_decay=0.05, clip_grad=0.0, loss_scale=1.0,
                         lrs=[0.1, 0.05, 0.02])),
    ("momentum_no_wd", dict(momentum=0.5, weight_decay=0.0, clip_grad=0.0, loss_scale=2.0,
                            lrs=[0.03, 0.03, 0.03, 0.03])),
]


def run(name, c, rng):
    n = sum(int(np.prod(s)) for _, s, _ in PARAMS)
    # float32-representable inputs: mpitron's f32 run starts from exactly these
    init = (rng.uniform(0.5, 1.5, n) * np.where(np.arange(n) % 3 == 0, -1.0, 1.0)).astype(np.float32).astype(np.float64)
    params, at = [], 0
    for _, shape, _ in PARAMS:
        k = int(np.prod(shape))
        params.append(torch.nn.Parameter(torch.tensor(init[at:at + k], dtype=torch.float64).reshape(shape)))
        at += k
    groups = [{"params": [p for p, (_, _, d) in zip(params, PARAMS) if d], "weight_decay": c["weight_decay"]},
              {"params": [p for p, (_, _, d) in zip(params, PARAMS) if not d], "weight_decay": 0.0}]
    opt = torch.optim.SGD(groups, lr=c["lrs"][0], momentum=c["momentum"])
    grads, norms, values = [], [], []
    for s, lr in enumerate(c["lrs"]):
        g = rng.normal(0.0, 0.3 * (1 + s), n).astype(np.float32).astype(np.float64)  # grows: later steps clip
        grads.append((g * c["loss_scale"]).tolist())
        at = 0
        for p, (_, shape, _) in zip(params, PARAMS):
            k = int(np.prod(shape))
            # what the optimizer is handed: scaled by the loss scale, then unscaled (a division in float64)
            p.grad = torch.tensor(g[at:at + k] * c["loss_scale"], dtype=torch.float64).reshape(shape) / c["loss_scale"]
            at += k
        if c["clip_grad"] > 0:
            norms.append(float(torch.nn.utils.clip_grad_norm_(params, c["clip_grad"])))
        else:
            norms.append(float(torch.sqrt(sum((p.grad ** 2).sum() for p in params))))
        for grp in opt.param_groups:
            grp["lr"] = lr
        opt.step()
        values.append(torch.cat([p.detach().reshape(-1) for p in params]).tolist())
    return dict(name=name, init=init.tolist(), grads=grads, grad_norms=norms, values=values, **c)


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else "tests/parallel/ref/torch_sgd.json"
    rng = np.random.default_rng(44)
    cases = [run(n, c, rng) for n, c in CASES]
    os.makedirs(os.path.dirname(out), exist_ok=True)
    with open(out, "w") as f:
        json.dump({"torch": torch.__version__,
                   "params": [{"name": n, "shape": s, "decay": d} for n, s, d in PARAMS], "cases": cases}, f)
        f.write("\n")
    print(f"wrote {out}: {len(cases)} cases")


if __name__ == "__main__":
    main()
