#!/usr/bin/python3
"""PyTorch / Hugging Face references for the Llama tensor ops (RoPE, grouped-query attention).

Run from the repository root with Debian's CPU torch (`apt-get install -y python3-torch`) and
transformers 4.40 (`/usr/bin/python3 -m pip install --break-system-packages "transformers==4.40.*"`):

    /usr/bin/python3 tests/reference/llama_ops_ref.py [--out tests/tensor/ref/llama_ops_ref.json]

Writes one JSON file (deterministic, torch.manual_seed(1234)) read by tests/tensor/test_rope.cpp
and tests/tensor/test_attention.cpp. Every tensor is stored flat, row-major, in mpitron's layout;
inputs are float32 values, everything else is computed in float64 on them.

  rope: cases of x (B, T, H, D) = a fused QKV viewed as (B, T, NH + 2G, HD): the NH query heads,
        the G key heads, the G value heads. Hugging Face's LlamaRotaryEmbedding(dim=R, base)
        gives cos/sin for position_ids = offset + arange(T), apply_rotary_pos_emb rotates
        q[..., :R] and k[..., :R] (the rest of each head passes through, as Megatron's
        --rotary-percent and GPT-NeoX's rotary_pct do; HF Llama itself has R = D), V is copied.
        out = that result; dx = d(Σ out·dout)/dx by torch autograd.
  attention: causal grouped-query attention over qkv (B, T, NH + 2G, HD): HF's repeat_kv expands
        the G key/value heads to NH (head h uses group h // (NH/G)), then softmax(q·kᵀ·scale,
        causal)·v. With "rope" set, q and k are first rotated as above (HF LlamaAttention's
        order). out (B, T, NH, HD), lse (B, NH, T) = logsumexp of the scaled masked scores,
        dqkv = d(Σ out·dout)/dqkv by torch autograd (through repeat_kv: dk/dv sum over a group's heads).
"""
import argparse
import json
import math
import os

import torch
from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding, apply_rotary_pos_emb, repeat_kv

torch.manual_seed(1234)


def f32(shape, lo=-2.0, hi=2.0):
    return (torch.rand(shape, dtype=torch.float32) * (hi - lo) + lo).double()


def flat(t):
    return [float(v) for v in t.detach().contiguous().view(-1).tolist()]


def rope_qk(x, nh, g, base, percent, offset):
    """x (B, T, NH+2G, D) float64 -> same with the q and k heads rotated (HF convention)."""
    b, t, h, d = x.shape
    r = int(d * percent)
    rot = LlamaRotaryEmbedding(r, max_position_embeddings=4096, base=base)
    pos = (offset + torch.arange(t)).unsqueeze(0).expand(b, t)
    cos, sin = rot(x, pos)  # (B, T, R), angles in float32 as HF computes them
    q, k, v = x[:, :, :nh], x[:, :, nh:nh + g], x[:, :, nh + g:]
    # (B, T, heads, D) -> (B, heads, T, D) for apply_rotary_pos_emb(unsqueeze_dim=1)
    qt, kt = q.transpose(1, 2), k.transpose(1, 2)
    qr, kr = apply_rotary_pos_emb(qt[..., :r], kt[..., :r], cos, sin)
    qt = torch.cat([qr, qt[..., r:]], dim=-1)
    kt = torch.cat([kr, kt[..., r:]], dim=-1)
    return torch.cat([qt.transpose(1, 2), kt.transpose(1, 2), v], dim=2)


def rope_case(name, b, t, nh, g, d, base, percent, offset):
    x = f32((b, t, nh + 2 * g, d)).requires_grad_(True)
    out = rope_qk(x, nh, g, base, percent, offset)
    dout = f32(out.shape, -1, 1)
    (out * dout).sum().backward()
    return dict(name=name, B=b, T=t, H=nh + 2 * g, D=d, rotate_heads=nh + g, base=base, percent=percent,
                offset=offset, x=flat(x), out=flat(out), dout=flat(dout), dx=flat(x.grad))


def attention_case(name, b, t, nh, g, hd, rope=None):
    qkv = f32((b, t, nh + 2 * g, hd), -1.5, 1.5).requires_grad_(True)
    x = rope_qk(qkv, nh, g, rope["base"], rope["percent"], 0) if rope else qkv
    q = x[:, :, :nh].transpose(1, 2)                         # (B, NH, T, HD)
    k = repeat_kv(x[:, :, nh:nh + g].transpose(1, 2), nh // g)  # (B, NH, T, HD)
    v = repeat_kv(x[:, :, nh + g:].transpose(1, 2), nh // g)
    scale = 1.0 / math.sqrt(hd)
    s = (q @ k.transpose(-1, -2)) * scale
    mask = torch.triu(torch.ones(t, t, dtype=torch.bool), diagonal=1)
    s = s.masked_fill(mask, float("-inf"))
    lse = torch.logsumexp(s, dim=-1)                          # (B, NH, T)
    out = (torch.softmax(s, dim=-1) @ v).transpose(1, 2)      # (B, T, NH, HD)
    dout = f32(out.shape, -1, 1)
    (out * dout).sum().backward()
    c = dict(name=name, B=b, T=t, NH=nh, G=g, HD=hd, scale=scale, qkv=flat(qkv), out=flat(out), lse=flat(lse),
             dout=flat(dout), dqkv=flat(qkv.grad))
    if rope:
        c["rope"] = rope
    return c


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="tests/tensor/ref/llama_ops_ref.json")
    out = ap.parse_args().out
    ref = {
        "generator": "tests/reference/llama_ops_ref.py (torch %s, transformers LlamaRotaryEmbedding, "
                     "apply_rotary_pos_emb, repeat_kv)" % torch.__version__,
        "rope": [
            rope_case("llama NH=4 G=2", 1, 6, 4, 2, 16, 10000.0, 1.0, 0),
            rope_case("partial R=6 of 12, base 5e5, decode offset 17", 1, 3, 2, 1, 12, 500000.0, 0.5, 17),
            rope_case("MHA NH=G=3", 1, 5, 3, 3, 8, 10000.0, 1.0, 0),
        ],
        "attention": [
            attention_case("GQA NH=6 G=2", 2, 5, 6, 2, 8),
            attention_case("MQA NH=4 G=1", 1, 7, 4, 1, 8),
            attention_case("GQA NH=4 G=2 after RoPE", 1, 6, 4, 2, 8, rope=dict(base=10000.0, percent=1.0)),
        ],
    }
    os.makedirs(os.path.dirname(out), exist_ok=True)
    with open(out, "w") as f:
        json.dump(ref, f, separators=(",", ":"))
        f.write("\n")
    print("wrote", out, os.path.getsize(out), "bytes")


if __name__ == "__main__":
    main()
