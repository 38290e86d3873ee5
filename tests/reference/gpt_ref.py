#!/usr/bin/python3
"""PyTorch float32 CPU reference for the mpitron GPT model (pre-LN GPT-2).

How to run (from the repository root; needs Debian's CPU torch, `apt-get install -y python3-torch`):

    /usr/bin/python3 tests/reference/gpt_ref.py [--out tests/model/ref]

It is deterministic (fixed seeds, 1 thread, deterministic algorithms) and rewrites every file
below, then reloads them and checks they are self-consistent (exits non-zero if not).

Model: tied-embedding pre-LN GPT-2, no dropout, LayerNorm eps 1e-5, gelu with tanh approximation,
explicit causal softmax attention with scale 1/sqrt(HD). Every matrix is stored (out, in), as in
torch.nn.Linear, so y = x @ W^T + b.

Parameter order (= the order of every flat .bin of parameters or gradients):
    wte (V,C), wpe (P,C),
    for l in 0..L-1:
        layers.{l}.ln1.weight (C), layers.{l}.ln1.bias (C),
        layers.{l}.attn.qkv.weight (3C,C), layers.{l}.attn.qkv.bias (3C),
        layers.{l}.attn.proj.weight (C,C), layers.{l}.attn.proj.bias (C),
        layers.{l}.ln2.weight (C), layers.{l}.ln2.bias (C),
        layers.{l}.mlp.fc.weight (F,C), layers.{l}.mlp.fc.bias (F),
        layers.{l}.mlp.proj.weight (C,F), layers.{l}.mlp.proj.bias (C),
    lnf.weight (C), lnf.bias (C)
Each tensor is row-major (C order); config.json lists every name with its shape and element offset.
qkv rows: [0,C) = q, [C,2C) = k, [2C,3C) = v; head h of q/k/v uses columns [h*HD, (h+1)*HD).

Outputs (all little-endian, no headers):
  config.json             model/batch/optimizer config, parameter layout, file list, losses, grad norms
  weights.bin             f32, initial parameters concatenated in the order above
  tokens.bin              int32 (B, T+1); inputs = [:, :-1], targets = [:, 1:]
  logits.bin              f32 (B, T, V), forward of weights.bin on tokens.bin
  loss.txt                the float32 mean cross-entropy loss, printed as repr(float) (float64 of the f32)
  grads.bin               f32, d(loss)/d(param) for every parameter, same order/layout as weights.bin
  adamw_tokens.bin        int32 (10, B, T+1); batch k generated from seed 1000+k
  adamw_losses.json       10 AdamW steps from weights.bin, one batch per step: loss (before the update)
                          and the total grad L2 norm before clipping, per step
  weights_after10.bin     f32, parameters after those 10 steps
  accum_tokens.bin        int32 (2, B, T+1); micro-batch m generated from seed 2000+m
  accum.json              gradient-accumulation case: loss = mean of the 2 micro-batch mean losses,
                          grad norm before clipping
  grads_accum.bin         f32, gradient of that averaged loss (= mean of the 2 micro-batch grads)
  weights_after_accum.bin f32, parameters after one AdamW step (with clipping) on grads_accum

Optimizer: torch.optim.AdamW(lr=1e-3, betas=(0.9, 0.95), eps=1e-8), two param groups:
weight_decay=0.1 on 2-D params (wte, wpe, every .weight of qkv/attn.proj/fc/mlp.proj), 0.0 on
biases and LayerNorm weights/biases. Each step: zero grads, loss.backward(),
clip_grad_norm_(all params, 1.0) (returns the pre-clip norm), opt.step(). torch's AdamW update:
p *= 1 - lr*wd; m = b1 m + (1-b1) g; v = b2 v + (1-b2) g^2;
p -= lr/(1-b1^t) * m / (sqrt(v)/sqrt(1-b2^t) + eps).
"""
import argparse
import json
import math
import os
import sys

import numpy as np
import torch
import torch.nn.functional as F

CFG = dict(V=96, P=32, L=2, C=48, NH=4, F=192, B=3, T=17, eps=1e-5)
INIT_SEED = 1234
TOKENS_SEED = 42
ADAMW = dict(lr=1e-3, betas=[0.9, 0.95], eps=1e-8, weight_decay=0.1, clip_grad_norm=1.0)
ADAMW_STEPS = 10
ADAMW_SEED0 = 1000
ACCUM_SEED0 = 2000
ACCUM_MICRO = 2


def param_specs(c):
    V, P, L, C, Fd = c["V"], c["P"], c["L"], c["C"], c["F"]
    specs = [("wte", (V, C)), ("wpe", (P, C))]
    for l in range(L):
        p = f"layers.{l}."
        specs += [
            (p + "ln1.weight", (C,)), (p + "ln1.bias", (C,)),
            (p + "attn.qkv.weight", (3 * C, C)), (p + "attn.qkv.bias", (3 * C,)),
            (p + "attn.proj.weight", (C, C)), (p + "attn.proj.bias", (C,)),
            (p + "ln2.weight", (C,)), (p + "ln2.bias", (C,)),
            (p + "mlp.fc.weight", (Fd, C)), (p + "mlp.fc.bias", (Fd,)),
            (p + "mlp.proj.weight", (C, Fd)), (p + "mlp.proj.bias", (C,)),
        ]
    specs += [("lnf.weight", (C,)), ("lnf.bias", (C,))]
    return specs


def init_params(c, seed):
    g = torch.Generator().manual_seed(seed)
    params = {}
    for name, shape in param_specs(c):
        t = torch.empty(shape, dtype=torch.float32)
        is_ln = ".ln" in name or name.startswith("lnf")
        if is_ln and name.endswith(".weight"):
            t.normal_(0.0, 0.1, generator=g).add_(1.0)
        else:  # matrices, embeddings, linear biases, LN biases: N(0, 0.02)
            t.normal_(0.0, 0.02, generator=g)
        params[name] = t.requires_grad_(True)
    return params


def layer_norm(x, w, b, eps):
    mu = x.mean(-1, keepdim=True)
    var = ((x - mu) ** 2).mean(-1, keepdim=True)  # biased variance
    return (x - mu) / torch.sqrt(var + eps) * w + b


def forward(params, c, tokens):
    """tokens (B,T) int64 -> logits (B,T,V) f32."""
    B, T = tokens.shape
    C, NH, eps = c["C"], c["NH"], c["eps"]
    HD = C // NH
    x = params["wte"][tokens] + params["wpe"][torch.arange(T)]
    mask = torch.triu(torch.ones(T, T, dtype=torch.bool), diagonal=1)  # True above diagonal = future
    for l in range(c["L"]):
        p = lambda n: params[f"layers.{l}.{n}"]
        h = layer_norm(x, p("ln1.weight"), p("ln1.bias"), eps)
        qkv = h @ p("attn.qkv.weight").t() + p("attn.qkv.bias")  # (B,T,3C)
        q, k, v = qkv[..., :C], qkv[..., C:2 * C], qkv[..., 2 * C:]
        q = q.reshape(B, T, NH, HD).transpose(1, 2)  # (B,NH,T,HD)
        k = k.reshape(B, T, NH, HD).transpose(1, 2)
        v = v.reshape(B, T, NH, HD).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(HD))  # (B,NH,T,T)
        att = att.masked_fill(mask, float("-inf"))
        att = torch.softmax(att, dim=-1)
        y = (att @ v).transpose(1, 2).reshape(B, T, C)
        x = x + y @ p("attn.proj.weight").t() + p("attn.proj.bias")
        h = layer_norm(x, p("ln2.weight"), p("ln2.bias"), eps)
        h = F.gelu(h @ p("mlp.fc.weight").t() + p("mlp.fc.bias"), approximate="tanh")
        x = x + h @ p("mlp.proj.weight").t() + p("mlp.proj.bias")
    x = layer_norm(x, params["lnf.weight"], params["lnf.bias"], eps)
    return x @ params["wte"].t()


def loss_fn(logits, targets):
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


def make_tokens(c, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, c["V"], (c["B"], c["T"] + 1), generator=g, dtype=torch.int64)


def flat(tensors):
    return torch.cat([t.detach().reshape(-1) for t in tensors]).numpy().astype("<f4")


def write_f32(path, arr):
    np.ascontiguousarray(arr, dtype="<f4").tofile(path)


def write_i32(path, t):
    np.ascontiguousarray(t.numpy(), dtype="<i4").tofile(path)


def make_optimizer(params):
    decay = [t for n, t in params.items() if t.dim() == 2]
    no_decay = [t for n, t in params.items() if t.dim() != 2]
    return torch.optim.AdamW(
        [dict(params=decay, weight_decay=ADAMW["weight_decay"]),
         dict(params=no_decay, weight_decay=0.0)],
        lr=ADAMW["lr"], betas=tuple(ADAMW["betas"]), eps=ADAMW["eps"])


def clone_params(params):
    return {n: t.detach().clone().requires_grad_(True) for n, t in params.items()}


# ----------------------------------------------------------------------------------------------
# Independent float64 numpy forward (loops over heads / explicit formulas) used only for checking.
def np_forward(w, c, tokens):
    B, T = tokens.shape
    C, NH, eps = c["C"], c["NH"], c["eps"]
    HD = C // NH

    def ln(x, g, b):
        mu = x.mean(-1, keepdims=True)
        var = x.var(-1, keepdims=True)
        return (x - mu) / np.sqrt(var + eps) * g + b

    def gelu(x):
        return 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x ** 3)))

    x = w["wte"][tokens] + w["wpe"][:T][None]
    for l in range(c["L"]):
        p = lambda n: w[f"layers.{l}.{n}"]
        h = ln(x, p("ln1.weight"), p("ln1.bias"))
        qkv = h @ p("attn.qkv.weight").T + p("attn.qkv.bias")
        y = np.zeros((B, T, C))
        for hh in range(NH):
            q = qkv[..., hh * HD:(hh + 1) * HD]
            k = qkv[..., C + hh * HD:C + (hh + 1) * HD]
            v = qkv[..., 2 * C + hh * HD:2 * C + (hh + 1) * HD]
            for bb in range(B):
                for t in range(T):
                    s = k[bb, :t + 1] @ q[bb, t] / math.sqrt(HD)
                    e = np.exp(s - s.max())
                    y[bb, t, hh * HD:(hh + 1) * HD] = (e / e.sum()) @ v[bb, :t + 1]
        x = x + y @ p("attn.proj.weight").T + p("attn.proj.bias")
        h = ln(x, p("ln2.weight"), p("ln2.bias"))
        x = x + gelu(h @ p("mlp.fc.weight").T + p("mlp.fc.bias")) @ p("mlp.proj.weight").T \
            + p("mlp.proj.bias")
    x = ln(x, w["lnf.weight"], w["lnf.bias"])
    return x @ w["wte"].T


def np_ce(logits, targets):
    z = logits - logits.max(-1, keepdims=True)
    lse = np.log(np.exp(z).sum(-1))
    picked = np.take_along_axis(z, targets[..., None], -1)[..., 0]
    return float((lse - picked).mean())


def unflatten(arr, specs):
    out, off = {}, 0
    for n, s in specs:
        k = int(np.prod(s))
        out[n] = arr[off:off + k].reshape(s)
        off += k
    assert off == arr.size, (off, arr.size)
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="tests/model/ref")
    args = ap.parse_args()
    out = args.out
    os.makedirs(out, exist_ok=True)

    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    c = dict(CFG)
    specs = param_specs(c)
    names = [n for n, _ in specs]

    params = init_params(c, INIT_SEED)
    layout, off = [], 0
    for n, s in specs:
        k = int(np.prod(s))
        layout.append(dict(name=n, shape=list(s), offset=off, numel=k, weight_decay=len(s) == 2))
        off += k
    n_params = off

    # ---- case 1: forward + backward on one batch ------------------------------------------
    tokens = make_tokens(c, TOKENS_SEED)
    logits = forward(params, c, tokens[:, :-1])
    loss = loss_fn(logits, tokens[:, 1:])
    loss.backward()
    loss_value = loss.item()
    write_f32(f"{out}/weights.bin", flat(params[n] for n in names))
    write_i32(f"{out}/tokens.bin", tokens)
    write_f32(f"{out}/logits.bin", logits.detach().numpy())
    with open(f"{out}/loss.txt", "w") as f:
        f.write(repr(loss_value) + "\n")
    write_f32(f"{out}/grads.bin", flat(params[n].grad for n in names))

    # ---- case 2: 10 AdamW steps, a different batch each step -----------------------------
    p2 = clone_params(params)
    opt = make_optimizer(p2)
    all_p = [p2[n] for n in names]
    batches = torch.stack([make_tokens(c, ADAMW_SEED0 + k) for k in range(ADAMW_STEPS)])
    steps = []
    for k in range(ADAMW_STEPS):
        opt.zero_grad(set_to_none=True)
        l = loss_fn(forward(p2, c, batches[k, :, :-1]), batches[k, :, 1:])
        l.backward()
        gn = torch.nn.utils.clip_grad_norm_(all_p, ADAMW["clip_grad_norm"])
        opt.step()
        steps.append(dict(step=k, seed=ADAMW_SEED0 + k, loss=l.item(), grad_norm=gn.item()))
    write_i32(f"{out}/adamw_tokens.bin", batches)
    write_f32(f"{out}/weights_after10.bin", flat(p2[n] for n in names))
    with open(f"{out}/adamw_losses.json", "w") as f:
        json.dump(dict(losses=[s["loss"] for s in steps],
                       grad_norms_before_clip=[s["grad_norm"] for s in steps], steps=steps),
                  f, indent=1)

    # ---- case 3: gradient accumulation, 2 micro-batches, one AdamW step ----------------------
    p3 = clone_params(params)
    opt3 = make_optimizer(p3)
    all_p3 = [p3[n] for n in names]
    micro = torch.stack([make_tokens(c, ACCUM_SEED0 + m) for m in range(ACCUM_MICRO)])
    opt3.zero_grad(set_to_none=True)
    micro_losses = []
    for m in range(ACCUM_MICRO):
        l = loss_fn(forward(p3, c, micro[m, :, :-1]), micro[m, :, 1:]) / ACCUM_MICRO
        l.backward()  # grads accumulate: sum of (micro loss / 2)
        micro_losses.append(l.item() * ACCUM_MICRO)
    accum_loss = float(np.float32(sum(np.float32(v) for v in micro_losses) / np.float32(ACCUM_MICRO)))
    write_f32(f"{out}/grads_accum.bin", flat(p3[n].grad for n in names))
    gn3 = torch.nn.utils.clip_grad_norm_(all_p3, ADAMW["clip_grad_norm"]).item()
    opt3.step()
    write_i32(f"{out}/accum_tokens.bin", micro)
    write_f32(f"{out}/weights_after_accum.bin", flat(p3[n] for n in names))
    with open(f"{out}/accum.json", "w") as f:
        json.dump(dict(micro_batches=ACCUM_MICRO, seeds=[ACCUM_SEED0 + m for m in range(ACCUM_MICRO)],
                       micro_losses=micro_losses, loss=accum_loss, grad_norm_before_clip=gn3,
                       note="loss = mean of micro-batch mean losses; grads_accum.bin = its gradient "
                            "(before clipping); weights_after_accum.bin = weights.bin after one "
                            "clipped AdamW step"), f, indent=1)

    files = {
        "weights.bin": "f32 initial params, flat, order = params",
        "tokens.bin": "int32 (B, T+1); inputs [:, :-1], targets [:, 1:]",
        "logits.bin": "f32 (B, T, V)",
        "loss.txt": "repr of the f32 mean cross-entropy loss",
        "grads.bin": "f32 grads of loss, flat, order = params",
        "adamw_tokens.bin": "int32 (10, B, T+1), batch k from seed 1000+k",
        "adamw_losses.json": "per-step loss (before update) and grad norm before clipping",
        "weights_after10.bin": "f32 params after 10 AdamW steps",
        "accum_tokens.bin": "int32 (2, B, T+1), micro-batch m from seed 2000+m",
        "accum.json": "grad-accumulation case: loss, micro losses, grad norm before clipping",
        "grads_accum.bin": "f32 grads of mean-of-2-micro-batch loss (before clipping)",
        "weights_after_accum.bin": "f32 params after one AdamW step on grads_accum",
    }
    config = dict(
        model=dict(vocab_size=c["V"], max_positions=c["P"], n_layers=c["L"], hidden=c["C"],
                   n_heads=c["NH"], head_dim=c["C"] // c["NH"], ffn=c["F"], ln_eps=c["eps"],
                   activation="gelu_tanh", tied_embedding=True, pre_ln=True, dropout=0.0,
                   matrix_layout="(out_features, in_features), row-major; y = x @ W^T + b",
                   qkv_split="rows [0,C)=q, [C,2C)=k, [2C,3C)=v; head h = [h*HD,(h+1)*HD)"),
        batch=dict(B=c["B"], T=c["T"], tokens_seed=TOKENS_SEED),
        init=dict(seed=INIT_SEED, matrices_embeddings_std=0.02, linear_bias_std=0.02,
                  ln_weight="1 + N(0, 0.1)", ln_bias_std=0.02),
        loss=loss_value,
        optimizer=dict(type="torch.optim.AdamW", lr=ADAMW["lr"], betas=ADAMW["betas"],
                       eps=ADAMW["eps"], weight_decay=ADAMW["weight_decay"],
                       weight_decay_applies_to="2-D params only (wte, wpe, *.weight of linears)",
                       clip_grad_norm=ADAMW["clip_grad_norm"], steps=ADAMW_STEPS,
                       batch_seeds=[ADAMW_SEED0 + k for k in range(ADAMW_STEPS)]),
        accum=dict(micro_batches=ACCUM_MICRO, micro_batch_size=c["B"],
                   seeds=[ACCUM_SEED0 + m for m in range(ACCUM_MICRO)], loss=accum_loss),
        n_params=n_params,
        params=layout,
        files=files,
        dtype_note="all .bin little-endian, no header; f32 = float32, int32 tokens",
        torch_version=torch.__version__,
    )
    with open(f"{out}/config.json", "w") as f:
        json.dump(config, f, indent=1)

    check(out, c, specs)
    print(f"loss={loss_value!r} n_params={n_params} accum_loss={accum_loss!r}")
    print("adamw losses:", [s["loss"] for s in steps])


def check(out, c, specs):
    """Reload the written files and verify they agree with each other and with a float64 numpy model."""
    B, T, V = c["B"], c["T"], c["V"]
    cfg = json.load(open(f"{out}/config.json"))
    n = cfg["n_params"]
    w = np.fromfile(f"{out}/weights.bin", dtype="<f4")
    g = np.fromfile(f"{out}/grads.bin", dtype="<f4")
    assert w.size == n and g.size == n
    tok = np.fromfile(f"{out}/tokens.bin", dtype="<i4").reshape(B, T + 1).astype(np.int64)
    logits = np.fromfile(f"{out}/logits.bin", dtype="<f4").reshape(B, T, V)
    loss = float(open(f"{out}/loss.txt").read())
    assert loss == cfg["loss"]

    # loss from stored logits (float64)
    l64 = np_ce(logits.astype(np.float64), tok[:, 1:])
    assert abs(l64 - loss) < 1e-5, (l64, loss)
    # independent float64 forward from stored weights
    wd = {k: v.astype(np.float64) for k, v in unflatten(w, specs).items()}
    ref = np_forward(wd, c, tok[:, :-1])
    err = np.abs(ref - logits).max()
    assert err < 1e-5, err
    # gradient check: float64 torch autograd of the same model vs stored f32 grads, plus a
    # central finite difference on a few entries of the float64 numpy model
    p64 = {k: torch.tensor(v, dtype=torch.float64, requires_grad=True) for k, v in wd.items()}
    lt = loss_fn(forward(p64, c, torch.tensor(tok[:, :-1])), torch.tensor(tok[:, 1:]))
    lt.backward()
    g64 = np.concatenate([p64[k].grad.numpy().reshape(-1) for k, _ in specs])
    gerr = np.abs(g64 - g).max() / np.abs(g64).max()
    assert gerr < 1e-4, gerr
    rng = np.random.default_rng(0)
    flat64 = w.astype(np.float64)
    for idx in rng.choice(n, 8, replace=False).tolist() + [0, n - 1]:
        h = 1e-6
        fp, fm = flat64.copy(), flat64.copy()
        fp[idx] += h
        fm[idx] -= h
        lp = np_ce(np_forward(unflatten(fp, specs), c, tok[:, :-1]), tok[:, 1:])
        lm = np_ce(np_forward(unflatten(fm, specs), c, tok[:, :-1]), tok[:, 1:])
        fd = (lp - lm) / (2 * h)
        assert abs(fd - g64[idx]) < 1e-7 + 1e-4 * abs(fd), (idx, fd, g64[idx])

    # adamw: first-step loss equals forward of weights.bin on batch 0
    ab = np.fromfile(f"{out}/adamw_tokens.bin", dtype="<i4").reshape(10, B, T + 1).astype(np.int64)
    al = json.load(open(f"{out}/adamw_losses.json"))
    l0 = np_ce(np_forward(wd, c, ab[0, :, :-1]), ab[0, :, 1:])
    assert abs(l0 - al["losses"][0]) < 1e-5, (l0, al["losses"][0])
    w10 = np.fromfile(f"{out}/weights_after10.bin", dtype="<f4")
    assert w10.size == n and np.abs(w10 - w).max() > 1e-4

    # accum: loss = mean of micro losses, grads = mean of per-micro grads (float64 autograd)
    mb = np.fromfile(f"{out}/accum_tokens.bin", dtype="<i4").reshape(2, B, T + 1).astype(np.int64)
    acc = json.load(open(f"{out}/accum.json"))
    ga = np.fromfile(f"{out}/grads_accum.bin", dtype="<f4")
    ls = [np_ce(np_forward(wd, c, mb[m, :, :-1]), mb[m, :, 1:]) for m in range(2)]
    assert abs(np.mean(ls) - acc["loss"]) < 1e-5, (ls, acc["loss"])
    p64 = {k: torch.tensor(v, dtype=torch.float64, requires_grad=True) for k, v in wd.items()}
    tot = sum(loss_fn(forward(p64, c, torch.tensor(mb[m, :, :-1])), torch.tensor(mb[m, :, 1:]))
              for m in range(2)) / 2
    tot.backward()
    ga64 = np.concatenate([p64[k].grad.numpy().reshape(-1) for k, _ in specs])
    assert np.abs(ga64 - ga).max() / np.abs(ga64).max() < 1e-4
    assert abs(np.linalg.norm(ga64) - acc["grad_norm_before_clip"]) < 1e-5 * np.linalg.norm(ga64)
    # one AdamW step recomputed by hand (float64) from grads_accum.bin
    wa = np.fromfile(f"{out}/weights_after_accum.bin", dtype="<f4").astype(np.float64)
    gg = ga.astype(np.float64)
    gg = gg * min(1.0, 1.0 / (np.linalg.norm(gg) + 1e-6))
    lr, (b1, b2), eps = ADAMW["lr"], ADAMW["betas"], ADAMW["eps"]
    decay = np.concatenate([np.full(int(np.prod(s)), ADAMW["weight_decay"] if len(s) == 2 else 0.0)
                            for _, s in specs])
    p = flat64 * (1 - lr * decay)
    m_, v_ = (1 - b1) * gg, (1 - b2) * gg * gg
    p = p - lr / (1 - b1) * m_ / (np.sqrt(v_) / math.sqrt(1 - b2) + eps)
    assert np.abs(p - wa).max() < 1e-6, np.abs(p - wa).max()

    total = sum(os.path.getsize(os.path.join(out, f)) for f in cfg["files"])
    print(f"self-check OK: logits err vs f64 numpy {err:.2e}, grad rel err vs f64 {gerr:.2e}, "
          f"total size {total} bytes")


if __name__ == "__main__":
    sys.exit(main())
