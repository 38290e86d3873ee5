#!/usr/bin/env python3
"""The PyTorch peer of bench_train: the same GPT-2, Llama or MoE training step, timed the same way.

GPT-2 model (--family gpt2, as model/gpt.h): pre-LN GPT-2, token + learned position embeddings, a fused QKV
linear (3C, C) whose rows are Q, K, V with heads contiguous, causal attention with scale
1/sqrt(HD), GELU (tanh), LayerNorm eps 1e-5, final LayerNorm and an LM head tied to wte,
padded vocabulary. Dropout p after the embeddings, the attention projection and the MLP
(default 0, as bench_train).

Llama model (--family llama, or a llama-* preset; the same model/gpt.h with the Llama choices,
docs/model-families.md): token embeddings only, RMSNorm (eps --norm-eps, 1e-5) before attention,
MLP and the head; a fused QKV linear without bias ((NH + 2G)·HD, C) whose rows are the NH query
heads, then G key and G value heads; rope on q and k in the rotate_half convention (HF Llama's:
dims i and i + HD/2 pair, theta_i = base^(-2i/HD)); grouped-query attention (query head h reads
kv group h // (NH/G): SDPA's enable_gqa where the torch has it, else repeat_interleave, HF's
repeat_kv); SwiGLU MLP silu(x·Wgate^T)·(x·Wup^T) with fc = [gate; up] (2F, C); no linear
biases; an untied LM head (V, C). Init as GPT-2's (norm weights 1, matrices N(0, 0.02), the
two output projections N(0, 0.02/sqrt(2L))); weight decay on matrices and embeddings only.

Mixture-of-Experts model (--family moe, or a moe-* preset; mpitron's mixtral family,
docs/model-families.md "Mixture of Experts"): the Llama model with every MLP a router over
--experts E SwiGLU experts of width --expert-ffn Fe (default --ffn), top --topk k, dropless.
Router: a bias-free linear (E, C) in float32 (autocast off), the k largest logits, their
softmax as the weights (Mixtral's). Dispatch, the usual eager PyTorch way: the N·k choices
sorted by expert (stable), the tokens gathered in that order, one F.linear pair per expert on
its contiguous slice (sizes read on the host), the outputs put back in choice order and summed
over the k choices weighted by the probabilities. Experts are stacked parameters gate|up
(E, 2Fe, C) and down (E, C, Fe), init as fc and proj; the router N(0, 0.02). Load-balancing
loss (Megatron's, per layer, summed over the layers): --aux-loss-coeff c (0.01) ·
E / (N²·k) · Σ_e count_e · Σ_n softmax(logits)[n, e], N the micro-batch's tokens; it is added to
the loss for the backward (its gradient at the loss's scale, as mpitron's MoeRun) but, as
mpitron's, not to the logged loss (loss_first/loss_last): the JSON has it as
aux_loss_first/aux_loss_last. With --compile the dispatch (data-dependent sizes) runs eagerly
(torch.compiler.disable), the rest compiled. --check compares the MoE MLP (values, the
load-balancing loss and every gradient) with a naive per-token loop in float64 and exits.

Step (as model/training/trainer.cpp): zero grads; for each micro-batch: forward, loss.item(),
(loss / micro_batches).backward() (MoE: ((loss + aux) / micro_batches)); clip_grad_norm_(1.0); AdamW(lr 1e-4, betas (0.9, 0.999),
eps 1e-8, weight decay 0.01 on matrices and embeddings, none on biases and LayerNorm).

Device choices:
  --device cpu   f32 (or --dtype bf16: CPU autocast), torch.set_num_threads(--threads)
  --device cuda  bf16 autocast over f32 parameters (the usual PyTorch mixed precision;
                 mpitron keeps bf16 values and an f32 master copy), attention through
                 F.scaled_dot_product_attention(is_causal=True) (flash attention), fused AdamW,
                 --compile for torch.compile.
Columns and JSON keys match bench_train (bench/train_step_bench.h); FLOPs per token are
GPTConfig::flops_per_token: 6 * N_matmul + 6 * L * T * C (docs/flops.md), N_matmul of an MoE
layer active (the router and k of the E experts); params counts every expert. Peak memory:
CUDA torch.cuda.max_memory_allocated (peak_bytes); CPU the peak RSS (VmHWM, reset through
/proc/self/clear_refs) minus the RSS before the model was built (rss_peak_bytes).

    python3 bench/peers/torch_gpt.py --preset 124M --batch 4 --seq 256 --device cpu --threads 2
    python3 bench/peers/torch_gpt.py --preset llama-124M --batch 4 --seq 256 --device cpu --threads 2
    python3 bench/peers/torch_gpt.py --preset moe-tiny --batch 2 --seq 64 --device cpu --threads 2 --steps 2
    python3 bench/peers/torch_gpt.py --check --device cpu
"""
import argparse
import json
import math
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gpt_flops import flops_per_token, num_parameters  # noqa: E402

import torch
import torch.nn as nn
import torch.nn.functional as F

# name: (layers, hidden, heads) or, Llama, (layers, hidden, heads, query groups, ffn, vocab,
# rotary base) or, MoE, the Llama tuple + (experts, topk, expert ffn) — the same table as
# bench/train_step_bench.h (vocab 0: GPT-2's 50257). moe-*: k·Fe = the llama row's F (same active size).
PRESETS = {
    "tiny": (4, 256, 4),
    "124M": (12, 768, 12),
    "350M": (24, 1024, 16),
    "774M": (36, 1280, 20),
    "1.3B": (24, 2048, 16),
    "1.5B": (48, 1600, 25),
    "llama-tiny": (4, 256, 4, 2, 704, 0, 10000.0),
    "llama-124M": (12, 768, 12, 4, 2048, 0, 10000.0),
    "moe-tiny": (4, 256, 4, 2, 704, 0, 10000.0, 8, 2, 352),
    "moe-124M": (12, 768, 12, 4, 2048, 0, 10000.0, 8, 2, 1024),
    "llama-1B": (16, 2048, 32, 8, 8192, 128256, 500000.0),
}

HAS_SDPA = hasattr(F, "scaled_dot_product_attention")


def sdpa_has_gqa():
    """True where F.scaled_dot_product_attention takes enable_gqa (torch >= 2.5)."""
    if not HAS_SDPA:
        return False
    try:
        q = torch.zeros(1, 2, 1, 2)
        F.scaled_dot_product_attention(q, torch.zeros(1, 1, 1, 2), torch.zeros(1, 1, 1, 2), enable_gqa=True)
        return True
    except (TypeError, RuntimeError):
        return False


HAS_SDPA_GQA = sdpa_has_gqa()


def causal_attention(q, k, v):
    """q (B, NH, T, HD), k and v (B, G, T, HD) -> (B, NH, T, HD); query head h reads group h // (NH/G)."""
    NH, G, T, HD = q.shape[1], k.shape[1], q.shape[2], q.shape[3]
    if G != NH and HAS_SDPA_GQA:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    if G != NH:  # HF's repeat_kv
        k, v = k.repeat_interleave(NH // G, dim=1), v.repeat_interleave(NH // G, dim=1)
    if HAS_SDPA:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)
    # torch < 2.0 (Debian's 1.13): explicit causal softmax
    s = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(HD))
    mask = torch.ones(T, T, dtype=torch.bool, device=q.device).triu(1)
    return torch.softmax(s.masked_fill(mask, float("-inf")), dim=-1) @ v


class Block(nn.Module):
    def __init__(self, C, NH, Fd, p):
        super().__init__()
        self.NH, self.p = NH, p
        self.ln1 = nn.LayerNorm(C, eps=1e-5)
        self.qkv = nn.Linear(C, 3 * C)    # weight (3C, C): rows Q, K, V
        self.proj = nn.Linear(C, C)
        self.ln2 = nn.LayerNorm(C, eps=1e-5)
        self.fc = nn.Linear(C, Fd)
        self.mproj = nn.Linear(Fd, C)

    def attention(self, x):  # x (B, T, C) -> (B, T, C)
        B, T, C = x.shape
        HD = C // self.NH
        q, k, v = self.qkv(x).view(B, T, 3, self.NH, HD).permute(2, 0, 3, 1, 4)  # each (B, NH, T, HD)
        y = causal_attention(q, k, v)
        return self.proj(y.transpose(1, 2).reshape(B, T, C))

    def forward(self, x):
        x = x + F.dropout(self.attention(self.ln1(x)), self.p, self.training)
        h = F.gelu(self.fc(self.ln2(x)), approximate="tanh")
        return x + F.dropout(self.mproj(h), self.p, self.training)


class GPT(nn.Module):
    def __init__(self, L, C, NH, V, P, p):
        super().__init__()
        self.p = p
        self.wte = nn.Embedding(V, C)   # (V, C), also the LM head
        self.wpe = nn.Embedding(P, C)   # (P, C)
        self.blocks = nn.ModuleList(Block(C, NH, 4 * C, p) for _ in range(L))
        self.lnf = nn.LayerNorm(C, eps=1e-5)
        std, std_out = 0.02, 0.02 / math.sqrt(2 * L)
        for name, t in self.named_parameters():
            if name.endswith("bias"):
                nn.init.zeros_(t)
            elif ".ln" in name or name.startswith("lnf"):
                nn.init.ones_(t)
            else:
                nn.init.normal_(t, 0.0, std_out if name.endswith("proj.weight") else std)

    def forward(self, idx, targets):  # idx, targets (B, T) int64 -> mean loss
        B, T = idx.shape
        pos = torch.arange(T, device=idx.device)
        x = F.dropout(self.wte(idx) + self.wpe(pos), self.p, self.training)
        for b in self.blocks:
            x = b(x)
        logits = self.lnf(x) @ self.wte.weight.t()  # tied head (B, T, V)
        return F.cross_entropy(logits.view(B * T, -1).float(), targets.reshape(-1))


class RMSNorm(nn.Module):
    """x / sqrt(mean(x^2) + eps) * weight, in f32 (as tensor/cpu/rmsnorm.cpp)."""

    def __init__(self, C, eps):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(C))

    def forward(self, x):
        xf = x.float()
        y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return (y * self.weight.float()).to(x.dtype)


def rotate_half(x):
    h = x.shape[-1] // 2
    return torch.cat((-x[..., h:], x[..., :h]), dim=-1)


def compiler_disable(fn):
    """torch.compiler.disable (torch >= 2.1; torch._dynamo.disable in 2.0); the function itself before."""
    d = getattr(getattr(torch, "compiler", None), "disable", None)
    if d is None and hasattr(torch, "_dynamo"):
        d = getattr(torch._dynamo, "disable", None)
    return d(fn) if d else fn


@compiler_disable
def expert_swiglu(x, idx, fc, proj):
    """x (N, C), idx (N, k) chosen experts, fc (E, 2Fe, C) gate|up, proj (E, C, Fe) -> (N, k, C) expert outputs.

    The N·k choices sorted by expert, each expert's contiguous slice through its SwiGLU, put back in choice order."""
    N, k = idx.shape
    E, C = fc.shape[0], x.shape[1]
    flat = idx.reshape(-1)                                    # (N·k,) choice n·k + j
    order = torch.sort(flat, stable=True)[1]                  # choices grouped by expert, tokens in order
    xs = x.index_select(0, order // k)                        # (N·k, C) the tokens in expert order
    counts = torch.zeros(E, dtype=torch.int64, device=x.device).index_add_(0, flat, torch.ones_like(flat))
    outs, start = [], 0
    for e, n in enumerate(counts.tolist()):                   # the sizes on the host: one sync per layer
        if n == 0:
            continue
        gate, up = F.linear(xs[start:start + n], fc[e]).chunk(2, dim=-1)   # (n, Fe) each
        outs.append(F.linear(F.silu(gate) * up, proj[e]))                   # (n, C)
        start += n
    ys = torch.cat(outs)                                      # (N·k, C) in expert order
    inv = torch.empty_like(order)
    inv[order] = torch.arange(order.numel(), device=x.device)
    return ys.index_select(0, inv).view(N, k, C)              # back in choice order


class MoEMLP(nn.Module):
    """E SwiGLU experts of width Fe, top-k, Mixtral's router; forward (B, T, C) -> ((B, T, C), load-balancing loss)."""

    def __init__(self, C, E, k, Fe, aux_coeff):
        super().__init__()
        self.E, self.k, self.Fe, self.aux_coeff = E, k, Fe, aux_coeff
        self.router = nn.Linear(C, E, bias=False)                    # (E, C), run in f32
        self.experts_fc = nn.Parameter(torch.empty(E, 2 * Fe, C))    # expert e: [gate; up] (2Fe, C)
        self.experts_proj = nn.Parameter(torch.empty(E, C, Fe))      # expert e: down (C, Fe)

    def route(self, x):  # x (N, C) -> probs (N, k) f32, idx (N, k), logits (N, E) f32
        dt = torch.promote_types(x.dtype, torch.float32)  # f32 (f64 in check_moe)
        with torch.autocast(device_type=x.device.type, enabled=False):
            logits = F.linear(x.to(dt), self.router.weight.to(dt))
        top, idx = logits.topk(self.k, dim=-1)
        return torch.softmax(top, dim=-1), idx, logits

    def aux_loss(self, idx, logits):  # Megatron's: c · E / (N² · k) · Σ_e count_e · Σ_n softmax(logits)[n, e]
        N = logits.shape[0]
        flat = idx.reshape(-1)
        counts = torch.zeros(self.E, dtype=torch.float32, device=logits.device).index_add_(
            0, flat, torch.ones(flat.shape, dtype=torch.float32, device=logits.device))
        score_sum = torch.softmax(logits, dim=-1).sum(0)            # (E,)
        return self.aux_coeff * self.E / (N * N * self.k) * (counts * score_sum).sum()

    def forward(self, x):
        B, T, C = x.shape
        xf = x.reshape(B * T, C)
        probs, idx, logits = self.route(xf)
        y = expert_swiglu(xf, idx, self.experts_fc, self.experts_proj)  # (N, k, C)
        y = (y * probs.unsqueeze(-1).to(y.dtype)).sum(1)               # weighted by the probabilities
        return y.view(B, T, C), self.aux_loss(idx, logits)


def check_moe(dev):
    """The MoE MLP against a naive per-token loop in float64: output, load-balancing loss, every gradient."""
    torch.manual_seed(0)
    C, E, k, Fe, B, T, coeff = 16, 6, 2, 8, 3, 7, 0.01
    m = MoEMLP(C, E, k, Fe, coeff).to(dev).double()
    for t in m.parameters():
        nn.init.normal_(t, 0.0, 0.3)
    x = torch.randn(B, T, C, dtype=torch.float64, device=dev)
    with torch.no_grad():  # expert E-1 never chosen (logit about -500): the empty slice too
        x[..., 0] = 5.0
        m.router.weight[E - 1, 0] = -100.0
    x.requires_grad_(True)
    w = torch.randn(B, T, C, dtype=torch.float64, device=dev)  # a random projection as the loss
    y, aux = m(x)
    got = [(y * w).sum() + aux]
    wrt = [x, m.router.weight, m.experts_fc, m.experts_proj]
    got += list(torch.autograd.grad(got[0], wrt))

    ref_y, xr, N = [], x.reshape(-1, C), B * T
    logits = xr @ m.router.weight.t()
    counts = [0.0] * E
    for n in range(N):  # the naive loop: each token through its k experts
        order = sorted(range(E), key=lambda e: -float(logits[n, e]))[:k]
        p = torch.softmax(logits[n, order], dim=0)
        out = 0
        for j, e in enumerate(order):
            counts[e] += 1
            h = m.experts_fc[e] @ xr[n]
            out = out + p[j] * (m.experts_proj[e] @ (F.silu(h[:Fe]) * h[Fe:]))
        ref_y.append(out)
    score = torch.softmax(logits, dim=-1).sum(0)
    ref_aux = coeff * E / (N * N * k) * sum(counts[e] * score[e] for e in range(E))
    ref = [(torch.stack(ref_y).view(B, T, C) * w).sum() + ref_aux]
    ref += list(torch.autograd.grad(ref[0], wrt))
    names = ["loss", "d x", "d router", "d experts_fc", "d experts_proj"]
    worst = 0.0
    for name, a, b in zip(names, got, ref):
        err = float((a - b).abs().max() / (b.abs().max() + 1e-30))
        worst = max(worst, err)
        print(f"  check_moe {name:15s} max rel err {err:.2e}")
    print(f"  check_moe choices per expert {counts}")
    assert counts[E - 1] == 0, "the check wants an empty expert"
    assert float(got[3][E - 1].abs().max()) == 0 and float(got[4][E - 1].abs().max()) == 0, "an empty expert's gradient"
    ok = worst < 1e-10
    print(f"check_moe on {dev}: {'OK' if ok else 'FAILED'} (worst {worst:.2e}, aux {float(aux):.6f} = {float(ref_aux):.6f})")
    return 0 if ok else 1


class LlamaBlock(nn.Module):
    def __init__(self, C, NH, G, Fd, eps, p, moe=None):
        super().__init__()
        self.NH, self.G, self.Fd, self.p = NH, G, Fd, p
        HD = C // NH
        self.ln1 = RMSNorm(C, eps)
        self.qkv = nn.Linear(C, (NH + 2 * G) * HD, bias=False)  # rows: NH query, G key, G value heads
        self.proj = nn.Linear(NH * HD, C, bias=False)
        self.ln2 = RMSNorm(C, eps)
        if moe:  # (E, k, Fe, aux coeff): the MLP a Mixture of Experts
            self.moe = MoEMLP(C, *moe)
        else:
            self.moe = None
            self.fc = nn.Linear(C, 2 * Fd, bias=False)  # rows: [gate; up]
            self.mproj = nn.Linear(Fd, C, bias=False)

    def attention(self, x, cos, sin):  # x (B, T, C), cos/sin (T, HD) -> (B, T, C)
        B, T, C = x.shape
        NH, G = self.NH, self.G
        HD = C // NH
        q, k, v = self.qkv(x).split([NH * HD, G * HD, G * HD], dim=-1)
        q = q.view(B, T, NH, HD).transpose(1, 2)  # (B, NH, T, HD)
        k = k.view(B, T, G, HD).transpose(1, 2)   # (B, G, T, HD)
        v = v.view(B, T, G, HD).transpose(1, 2)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        y = causal_attention(q, k, v)
        return self.proj(y.transpose(1, 2).reshape(B, T, NH * HD))

    def forward(self, x, cos, sin):  # -> (x, the MoE load-balancing loss or None)
        x = x + F.dropout(self.attention(self.ln1(x), cos, sin), self.p, self.training)
        if self.moe is not None:
            y, aux = self.moe(self.ln2(x))
            return x + F.dropout(y, self.p, self.training), aux
        gate, up = self.fc(self.ln2(x)).split([self.Fd, self.Fd], dim=-1)
        return x + F.dropout(self.mproj(F.silu(gate) * up), self.p, self.training), None


class Llama(nn.Module):
    def __init__(self, L, C, NH, G, Fd, V, base, eps, p, moe=None):
        super().__init__()
        self.p = p
        HD = C // NH
        self.wte = nn.Embedding(V, C)                 # (V, C)
        self.blocks = nn.ModuleList(LlamaBlock(C, NH, G, Fd, eps, p, moe) for _ in range(L))
        self.lnf = RMSNorm(C, eps)
        self.head = nn.Linear(C, V, bias=False)       # untied (V, C)
        inv_freq = base ** (-torch.arange(0, HD, 2, dtype=torch.float64) / HD)  # theta_i = base^(-2i/HD)
        self.register_buffer("inv_freq", inv_freq.float(), persistent=False)
        std, std_out = 0.02, 0.02 / math.sqrt(2 * L)
        for name, t in self.named_parameters():
            if ".ln" in name or name.startswith("lnf"):
                nn.init.ones_(t)
            else:
                nn.init.normal_(t, 0.0, std_out if name.endswith(("proj.weight", "experts_proj")) else std)

    def forward(self, idx, targets):  # idx, targets (B, T) int64 -> mean loss, summed load-balancing loss (MoE)
        B, T = idx.shape
        ang = torch.arange(T, device=idx.device, dtype=torch.float32)[:, None] * self.inv_freq[None, :]  # (T, HD/2)
        ang = torch.cat((ang, ang), dim=-1)                                                              # (T, HD)
        x = F.dropout(self.wte(idx), self.p, self.training)
        cos, sin = ang.cos().to(x.dtype), ang.sin().to(x.dtype)
        aux = None
        for b in self.blocks:
            x, a = b(x, cos, sin)
            aux = a if aux is None else aux + a
        logits = self.head(self.lnf(x))  # (B, T, V)
        loss = F.cross_entropy(logits.view(B * T, -1).float(), targets.reshape(-1))
        return loss if aux is None else (loss, aux)


def rss_bytes(field):
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return 1024.0 * float(line.split()[1])
    except OSError:
        pass
    return 0.0


def reset_peak_rss():
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        pass


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", choices=sorted(PRESETS),
                    help="sets --layers/--hidden/--heads and --name (llama-*: also the family, groups, ffn, vocab, base; "
                         "moe-*: also experts, topk, expert ffn)")
    ap.add_argument("--family", choices=["gpt2", "llama", "moe"], default="gpt2",
                    help="moe: the llama model with every MLP a Mixture of Experts (mpitron's mixtral family)")
    ap.add_argument("--name", default="")
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--query-groups", type=int, default=0, help="llama: kv heads G; 0: --heads")
    ap.add_argument("--ffn", type=int, default=0, help="llama: SwiGLU width F (fc is 2F); required for llama")
    ap.add_argument("--experts", type=int, default=0, help="moe: routed experts E per layer; required for moe")
    ap.add_argument("--topk", type=int, default=2, help="moe: experts per token k")
    ap.add_argument("--expert-ffn", type=int, default=0, help="moe: each expert's SwiGLU width Fe; 0: --ffn")
    ap.add_argument("--aux-loss-coeff", type=float, default=0.01, help="moe: load-balancing loss coefficient")
    ap.add_argument("--rotary-base", type=float, default=10000.0, help="llama: rope theta base")
    ap.add_argument("--norm-eps", type=float, default=1e-5, help="llama: RMSNorm epsilon")
    ap.add_argument("--vocab", type=int, default=50257)
    ap.add_argument("--padded-vocab", type=int, default=50304)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--micro-batches", type=int, default=1)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--dropout", type=float, default=0.0)
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    ap.add_argument("--dtype", choices=["f32", "bf16"], default=None, help="default f32 on cpu, bf16 on cuda")
    ap.add_argument("--threads", type=int, default=0, help="torch.set_num_threads (cpu); 0: OMP_NUM_THREADS or all")
    ap.add_argument("--compile", action="store_true", help="torch.compile the model")
    ap.add_argument("--json", default="")
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--check", action="store_true",
                    help="check the MoE MLP against a naive per-token loop (float64, --device) and exit")
    a = ap.parse_args()
    if a.check:
        if a.device == "cuda" and not torch.cuda.is_available():
            print("SKIPPED torch_gpt --check --device cuda: torch.cuda.is_available() is False")
            return 0
        if a.device == "cuda":
            torch.backends.cuda.matmul.allow_tf32 = False
        return check_moe(torch.device(a.device))
    if a.preset:
        p = PRESETS[a.preset]
        a.layers, a.hidden, a.heads = p[:3]
        if len(p) > 3:
            a.family, a.query_groups, a.ffn, vocab, a.rotary_base = "llama", p[3], p[4], p[5], p[6]
            if vocab:
                a.vocab, a.padded_vocab = vocab, (vocab + 127) // 128 * 128
        if len(p) > 7:
            a.family, a.experts, a.topk, a.expert_ffn = "moe", p[7], p[8], p[9]
        a.name = a.name or a.preset
    if a.family == "moe":
        a.expert_ffn = a.expert_ffn or a.ffn
        a.ffn = a.ffn or a.topk * a.expert_ffn  # unused: every MLP is an MoE
        if a.experts <= 0 or a.expert_ffn <= 0 or not 1 <= a.topk <= a.experts:
            ap.error(f"--family moe needs --experts E >= 1, --expert-ffn Fe (or --ffn) and 1 <= --topk <= E "
                     f"(got E {a.experts}, Fe {a.expert_ffn}, k {a.topk})")
    if a.family in ("llama", "moe"):
        a.query_groups = a.query_groups or a.heads
        if a.ffn <= 0:
            ap.error("--family llama needs --ffn F (the SwiGLU width)")
        if a.heads % a.query_groups or a.hidden % a.heads or (a.hidden // a.heads) % 2:
            ap.error(f"--heads {a.heads} must divide by --query-groups {a.query_groups}, --hidden by --heads, "
                     "and the head dim must be even (rope)")
    a.name = a.name or f"L{a.layers}C{a.hidden}"
    dtype = a.dtype or ("bf16" if a.device == "cuda" else "f32")
    if a.device == "cuda" and not torch.cuda.is_available():
        print("SKIPPED torch_gpt --device cuda: torch.cuda.is_available() is False")
        return 0
    threads = a.threads or int(os.environ.get("OMP_NUM_THREADS", "0") or 0) or os.cpu_count()
    if a.device == "cpu":
        torch.set_num_threads(threads)
    else:
        torch.backends.cuda.matmul.allow_tf32 = False  # f32 matmuls exact, as mpitron's default
    torch.manual_seed(a.seed)
    dev = torch.device(a.device)
    L, C, NH, T, B, K = a.layers, a.hidden, a.heads, a.seq, a.batch, a.micro_batches
    V, P = a.padded_vocab, max(1024, T)

    if a.device == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    else:
        reset_peak_rss()
    rss_base = rss_bytes("VmRSS")

    G, Fd = a.query_groups, a.ffn
    E, topk, Fe = (a.experts, a.topk, a.expert_ffn) if a.family == "moe" else (0, 0, 0)
    if a.family in ("llama", "moe"):
        moe = (E, topk, Fe, a.aux_loss_coeff) if a.family == "moe" else None
        model = Llama(L, C, NH, G, Fd, V, a.rotary_base, a.norm_eps, a.dropout, moe).to(dev)
    else:
        model = GPT(L, C, NH, V, P, a.dropout).to(dev)
    model.train()
    decay = [t for n, t in model.named_parameters() if t.dim() >= 2]
    no_decay = [t for n, t in model.named_parameters() if t.dim() < 2]
    groups = [{"params": decay, "weight_decay": 0.01}, {"params": no_decay, "weight_decay": 0.0}]
    extra = {"fused": True} if a.device == "cuda" and "fused" in torch.optim.AdamW.__init__.__code__.co_varnames else {}
    opt = torch.optim.AdamW(groups, lr=1e-4, betas=(0.9, 0.999), eps=1e-8, **extra)
    fwd = model
    if a.compile:
        if not hasattr(torch, "compile"):
            print(f"torch_gpt: --compile needs torch >= 2.0 (this is {torch.__version__})", file=sys.stderr)
            return 2
        fwd = torch.compile(model)

    g = torch.Generator().manual_seed(a.seed)
    pool = [torch.randint(0, a.vocab, (B, T + 1), generator=g) for _ in range(4)]
    pool = [(s[:, :-1].contiguous().to(dev), s[:, 1:].contiguous().to(dev)) for s in pool]
    autocast = torch.autocast(device_type=a.device, dtype=torch.bfloat16, enabled=(dtype == "bf16"))

    times, loss_first, loss_last, aux_first, aux_last, mb = [], 0.0, 0.0, 0.0, 0.0, 0
    for it in range(a.warmup + a.steps):
        if a.device == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        loss_sum, aux_sum = 0.0, 0.0
        for _ in range(K):
            x, y = pool[mb % 4]
            mb += 1
            with autocast:
                loss = fwd(x, y)
            if isinstance(loss, tuple):  # MoE: the load-balancing loss joins the backward, not the logged loss
                loss, aux = loss
                aux_sum += aux.item()
                loss_sum += loss.item()  # the trainer reads every micro-batch's loss too
                ((loss + aux) / K).backward()
            else:
                loss_sum += loss.item()
                (loss / K).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if a.device == "cuda":
            torch.cuda.synchronize()
        ms = 1e3 * (time.perf_counter() - t0)
        loss, aux = loss_sum / K, aux_sum / K
        loss_first, aux_first = (loss, aux) if it == 0 else (loss_first, aux_first)
        loss_last, aux_last = loss, aux
        if it >= a.warmup:
            times.append(ms)
        print(f"  torch {a.name} step {it + 1}/{a.warmup + a.steps}: {ms:.1f} ms, loss {loss:.4f}"
              + (f", load-balancing loss {aux:.5f}" if a.family == "moe" else "")
              + (" (warm-up)" if it < a.warmup else ""), file=sys.stderr, flush=True)

    # CUDA: the allocator's peak of live tensor bytes (what bench_train's peak_bytes is);
    # CPU: torch keeps no such count, so only the peak RSS above the pre-model RSS.
    rss_peak = max(0.0, rss_bytes("VmHWM") - rss_base) if a.device == "cpu" else 0.0
    if a.device == "cuda":
        peak, kind = float(torch.cuda.max_memory_allocated()), "torch.cuda.max_memory_allocated"
    else:
        peak, kind = 0.0, "peak RSS above baseline (rss_peak_bytes)"
    times.sort()
    ms = times[len(times) // 2]
    tps = K * B * T / (ms / 1e3)
    fpt = flops_per_token(L, C, T, V, a.family, NH, G, Fd, E, topk, Fe)
    params = num_parameters(L, C, V, P, a.family, NH, G, Fd, E, topk, Fe)
    assert params == sum(t.numel() for t in model.parameters()), "num_parameters() disagrees with the model"
    row = {
        "impl": "pytorch" + ("+compile" if a.compile else ""), "config": a.name,
        "family": "mixtral" if a.family == "moe" else a.family, "device": a.device, "dtype": dtype,
        "layers": L, "hidden": C, "heads": NH, "seq": T, "micro_batch": B, "micro_batches": K,
        "params": params, "recompute": False, "steps": a.steps, "warmup": a.warmup,
        "threads": threads if a.device == "cpu" else 0, "ms_per_step": ms,
        "ms_per_step_mean": sum(times) / len(times), "tokens_per_s": tps, "tflops": tps * fpt / 1e12,
        "peak_bytes": peak, "rss_peak_bytes": rss_peak, "memory_kind": kind, "loss_first": loss_first, "loss_last": loss_last,
        "flops_per_token": fpt, "torch": torch.__version__, "sdpa": HAS_SDPA, "sdpa_gqa": HAS_SDPA_GQA, "compile": a.compile,
    }
    if a.family == "moe":  # GPTConfig::family() is "mixtral"; the load-balancing loss summed over the layers
        row.update({"experts": E, "topk": topk, "expert_ffn": Fe, "aux_loss_coeff": a.aux_loss_coeff,
                    "aux_loss_first": aux_first, "aux_loss_last": aux_last})
    print(f"{row['impl']:8s} {a.name:10s} {a.device:5s} {dtype:5s} B={B} T={T} K={K}: {ms:.1f} ms/step, "
          f"{tps:.1f} tokens/s, {row['tflops']:.4f} TFLOP/s, peak {max(peak, rss_peak) / 2**30:.2f} GiB ({kind}), "
          f"loss {loss_first:.3f}->{loss_last:.3f}, torch {torch.__version__}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"rows": [row]}, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
