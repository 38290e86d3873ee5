#!/usr/bin/python3
"""Known answers for mpitron's Hugging Face import/export of the families built on Llama's
names (model/families.h): Qwen2, Mistral and Gemma, and the Mixture-of-Experts families Mixtral
and Qwen2-MoE. For each, a small random model built and saved by Hugging Face transformers
itself, and its logits, loss and parameter gradients (and for the MoE families the router's
logits, choices, load-balancing losses and their gradients) computed by transformers in float64.

Run from the repository root with Debian's interpreter (python3-torch) and transformers 4.40:
    MPITRON_DEPS_REFERENCE=1 ./scripts/install-deps.sh    # or: apt-get install -y python3-torch;
    /usr/bin/python3 -m pip install --break-system-packages "transformers==4.40.*"
    /usr/bin/python3 tests/reference/hf_family_ref.py --family qwen2|mistral|gemma|mixtral|qwen2_moe [--out DIR]

Writes tests/apps/ref/hf_<family>/ (deterministic; the C++ test of the dense families is
tests/apps/test_hf_families.cpp):
  config.json, model.safetensors   save_pretrained, float32, one file (qwen2, mistral, gemma);
  config.json, model.safetensors.index.json, model-0000k-of-0000n.safetensors
                                   SHARDED (max_shard_size 60KB for mixtral, 100KB for qwen2_moe).
  ref.json                         as tests/reference/hf_llama_ref.py's: for two token batches
      "ids", "targets" (the next tokens), "logits" (B, T, 100) float64 and "loss" (mean
      cross-entropy over all B·T positions, the language-model loss only: no aux loss); batch 0
      also "grads": per HF parameter the norm, rms and 12 sampled entries of d loss / d param
      (exact zeros where autograd reaches no parameter).
    MoE families, every batch also (L = 2 layers, E = 4 experts, k = 2, N = B·T tokens):
      "router_logits"  [L][N][E] float64, each layer's gate output (row n = token b·T + t);
      "topk"           [L][N][k] the experts transformers routes each token to, in its order:
                       top-k of softmax(router logits) computed in float32 (as the sparse block does);
      "aux_loss_hf"    the model's own aux_loss (output_router_logits=True): transformers'
                       load_balancing_loss_func over all layers' router logits TOGETHER (one
                       concatenation of the L·N rows, not a sum or mean of per-layer losses),
                       without router_aux_loss_coef;
      "aux_per_layer"  [L]: load_balancing_loss_func((router_logits[l],), E, k) for each layer alone.
                       HF's loss is E · Σ_e f_e · P_e with f_e = (choices of e) / N (not / N·k:
                       k at perfect balance) and P_e = the mean softmax probability of e; f_e is
                       a constant (one_hot(...).float(), float32: N = 7 gives ~1e-7 relative);
    and batch 0 "aux_grads": as "grads", for d (Σ_l aux_per_layer[l]) / d param (the gates, and
      everything under the routers' inputs; zeros for the last layer's experts, norm, lm_head).

The models (vocab 100, hidden 48, intermediate 80, 2 layers, 4 query heads, 2 key/value heads):
  qwen2    Qwen2ForCausalLM: biases on q/k/v only, tied embeddings, rms_norm_eps 1e-6
  mistral  MistralForCausalLM: sliding_window 5, shorter than the 16-token batch, so the band
           mask matters (query i sees keys i-5 … i, transformers 4.40's eager mask and its flash path)
  gemma    GemmaForCausalLM: head_dim 16 (not 48 / 4), GeGLU with the tanh GELU
           (hidden_activation gelu_pytorch_tanh), RMSNorm with weights 1 + w, embeddings × √48, tied
  mixtral  MixtralForCausalLM: every layer's MLP is 4 SwiGLU experts of width 40
           (block_sparse_moe.experts.e.w1 gate / w3 up / w2 down) and a router block_sparse_moe.gate
           (E, 48) without bias; top-2 with the two probabilities RENORMALISED to sum 1; no
           sliding window, untied lm_head, rms_norm_eps 1e-5, router_aux_loss_coef 0.02
  qwen2_moe Qwen2MoeForCausalLM: q/k/v biases as Qwen2; every layer (decoder_sparse_step 1,
           mlp_only_layers []) has mlp.gate (E, 48), 4 experts of width 40 (mlp.experts.e.
           gate_proj/up_proj/down_proj), top-2 with the raw softmax probabilities (norm_topk_prob
           false: they do not sum to 1), plus an always-on shared expert of width 56
           (mlp.shared_expert.*) scaled per token by sigmoid(mlp.shared_expert_gate (1, 48) · x),
           x the same post-attention-norm input as the router's. intermediate_size 80 is unused
           (no dense layer); untied lm_head, rms_norm_eps 1e-6, no sliding window (use_sliding_window
           false with sliding_window 64, as qwen2), router_aux_loss_coef 0.02.
Weights: every parameter ~ N(0, 0.1) (norm weights 1 + N(0, 0.1), Gemma's N(0, 0.1) around its
implicit 1), float32. References: attn_implementation="eager", model.double() on exactly the
stored weights, with torch's default dtype float64 (Debian's torch 1.13 cannot build 4.40's
Qwen2/Mistral masks in float64 otherwise). transformers 4.40 keeps a few steps in float32 even
on a float64 model, each ~1e-7 relative, far inside the C++ tolerances: rope's cos/sin, the
eager attention softmax, the MoE router softmax (softmax(..., dtype=torch.float): the routing
weights, and so the experts' mixture, are float32-rounded) and the lm_head output
(logits.float(): "logits" are float32 values and "loss" a float32 cross-entropy).

--check-export DIR: loads an mpitron export (convert_checkpoint --direction mpitron-to-hf) from
DIR with the family's class and compares its logits on the batches with ref.json (prints the max
abs difference; exit status 1 above 1e-4).
--compare-logits DIR OURS_JSON: loads an export of a model mpitron trained and compares
transformers' logits on OURS_JSON's "ids" (B, T) with its "logits" (B·T, V), mpitron's (exit
status 1 above 1e-4). tests/apps/test_hf_families.cpp runs it.
"""
import argparse
import json
import os
import sys

import torch

SEED = 2468
BASE = dict(vocab_size=100, hidden_size=48, intermediate_size=80, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, rope_theta=10000.0, max_position_embeddings=64, bos_token_id=1, eos_token_id=2)
MOE = dict(BASE, num_experts_per_tok=2, router_aux_loss_coef=0.02, hidden_act="silu", tie_word_embeddings=False)
FAMILIES = {
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM",
              dict(BASE, rms_norm_eps=1e-6, tie_word_embeddings=True, hidden_act="silu", use_sliding_window=False,
                   sliding_window=64, max_window_layers=2)),
    "mistral": ("MistralConfig", "MistralForCausalLM",
                dict(BASE, rms_norm_eps=1e-5, tie_word_embeddings=False, hidden_act="silu", sliding_window=5)),
    "gemma": ("GemmaConfig", "GemmaForCausalLM",
              dict(BASE, rms_norm_eps=1e-6, head_dim=16, hidden_act="gelu_pytorch_tanh",
                   hidden_activation="gelu_pytorch_tanh", tie_word_embeddings=True)),
    "mixtral": ("MixtralConfig", "MixtralForCausalLM",
                dict(MOE, intermediate_size=40, num_local_experts=4, rms_norm_eps=1e-5, sliding_window=None)),
    # intermediate_size (80, the dense MLP's width) is unused: every layer is sparse. mlp_only_layers is
    # not a 4.40 field (4.40 only looks at decoder_sparse_step); it is stored in config.json as given.
    "qwen2_moe": ("Qwen2MoeConfig", "Qwen2MoeForCausalLM",
                  dict(MOE, num_experts=4, moe_intermediate_size=40, shared_expert_intermediate_size=56,
                       norm_topk_prob=False, decoder_sparse_step=1, mlp_only_layers=[], rms_norm_eps=1e-6,
                       use_sliding_window=False, sliding_window=64, max_window_layers=2)),
}
MOE_FAMILIES = ("mixtral", "qwen2_moe")
SHARD = {"mixtral": "60KB", "qwen2_moe": "100KB"}  # save_pretrained's max_shard_size; the others: one file
BATCHES = [(2, 16), (1, 7)]
SAMPLES = 12
ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))


def classes(family):
    import transformers
    cfg, model, kw = FAMILIES[family]
    return getattr(transformers, cfg), getattr(transformers, model), kw


def build(family):
    Config, Model, kw = classes(family)
    torch.manual_seed(SEED)
    model = Model(Config(**kw, attn_implementation="eager"))
    g = torch.Generator().manual_seed(SEED)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=g, dtype=torch.float32) * 0.1
            one = name.endswith("norm.weight") and family != "gemma"  # Gemma stores w of 1 + w
            p.copy_(noise + 1.0 if one else noise)
    return model.float().eval()


def batches():
    g = torch.Generator().manual_seed(SEED + 1)
    return [torch.randint(0, BASE["vocab_size"], (b, t + 1), generator=g) for b, t in BATCHES]


def logits_loss(model, seq):
    ids, tgt = seq[:, :-1], seq[:, 1:]
    logits = model(input_ids=ids).logits
    loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), tgt.reshape(-1))
    return ids, tgt, logits, loss


def stats(p, g):
    """norm, rms and SAMPLES evenly spaced entries of a gradient (zeros where autograd gave none)."""
    g = (torch.zeros_like(p) if g is None else g).reshape(-1)
    idx = torch.linspace(0, g.numel() - 1, SAMPLES).round().long().unique()
    return {"norm": g.norm().item(), "rms": (g.norm() / g.numel() ** 0.5).item(),
            "sample": [[int(k), g[k].item()] for k in idx]}


def moe_refs(family, model, ids, r, with_grads):
    """The router's numbers for one batch, added to r; with_grads: also "grads" and "aux_grads"."""
    import importlib
    lbl = importlib.import_module(f"transformers.models.{family}.modeling_{family}").load_balancing_loss_func
    cfg = model.config
    E, k = cfg.num_local_experts if family == "mixtral" else cfg.num_experts, cfg.num_experts_per_tok
    out = model(input_ids=ids, output_router_logits=True)
    router = out.router_logits  # per layer (B·T, E)
    tgt = torch.tensor(r["targets"])
    loss = torch.nn.functional.cross_entropy(out.logits.reshape(-1, out.logits.shape[-1]), tgt.reshape(-1))
    assert (out.logits.detach() - torch.tensor(r["logits"])).abs().max().item() == 0.0
    assert loss.item() == r["loss"]
    per_layer = [lbl((x,), E, k) for x in router]
    # The experts as the sparse block picks them: top-k of a softmax it computes in float32.
    topk = [torch.topk(torch.nn.functional.softmax(x.detach(), dim=1, dtype=torch.float), k, dim=-1)[1] for x in router]
    r["aux_loss_hf"] = out.aux_loss.item()
    r["aux_per_layer"] = [a.item() for a in per_layer]
    r["router_logits"] = [x.detach().tolist() for x in router]
    r["topk"] = [t.tolist() for t in topk]
    if with_grads:
        names, params = zip(*model.named_parameters())
        g_lm = torch.autograd.grad(loss, params, retain_graph=True, allow_unused=True)
        g_aux = torch.autograd.grad(sum(per_layer), params, allow_unused=True)
        r["grads"] = {n: stats(p, g) for n, p, g in zip(names, params, g_lm)}
        r["aux_grads"] = {n: stats(p, g) for n, p, g in zip(names, params, g_aux)}


def write(family, out):
    model = build(family)
    os.makedirs(out, exist_ok=True)
    for f in os.listdir(out):
        if f.endswith(".safetensors") or f.endswith(".json"):
            os.remove(os.path.join(out, f))
    if family in SHARD:
        model.save_pretrained(out, max_shard_size=SHARD[family], safe_serialization=True)
        assert os.path.exists(os.path.join(out, "model.safetensors.index.json")), "expected a sharded save"
    else:
        model.save_pretrained(out, safe_serialization=True)
    # float64 default: the Debian torch (1.13) builds 4.40's Qwen2/Mistral masks with torch.full
    # in the default dtype, which cannot hold float64's min (the mask values are -inf either way).
    torch.set_default_dtype(torch.float64)
    model = model.double()
    ref = {"batches": []}
    for i, seq in enumerate(batches()):
        model.zero_grad()
        ids, tgt, logits, loss = logits_loss(model, seq)
        r = {"ids": ids.tolist(), "targets": tgt.tolist(), "logits": logits.tolist(), "loss": loss.item()}
        if family in MOE_FAMILIES:
            moe_refs(family, model, ids, r, with_grads=i == 0)
        elif i == 0:
            loss.backward()
            r["grads"] = {name: stats(p, p.grad) for name, p in model.named_parameters()}
        ref["batches"].append(r)
    with open(os.path.join(out, "ref.json"), "w") as f:
        json.dump(ref, f, separators=(",", ":"))
    total = sum(os.path.getsize(os.path.join(out, f)) for f in os.listdir(out))
    print(f"wrote {out}: {sorted(os.listdir(out))}, {total} bytes; losses", [b["loss"] for b in ref["batches"]])


def check_export(family, d, out):
    _, Model, _ = classes(family)
    with open(os.path.join(out, "ref.json")) as f:
        ref = json.load(f)
    torch.set_default_dtype(torch.float64)  # as in write()
    model = Model.from_pretrained(d, attn_implementation="eager", torch_dtype=torch.float64).eval()
    worst = 0.0
    with torch.no_grad():
        for b in ref["batches"]:
            logits = model(input_ids=torch.tensor(b["ids"])).logits
            worst = max(worst, (logits - torch.tensor(b["logits"], dtype=torch.float64)).abs().max().item())
    print(f"{d}: transformers loaded the export as {Model.__name__}; max |logit - reference| = {worst:.3g}")
    return 0 if worst <= 1e-4 else 1


def compare_logits(family, d, ours_file):
    """Loads an export (a model mpitron trained) and compares transformers' logits with ours."""
    _, Model, _ = classes(family)
    with open(ours_file) as f:
        ours = json.load(f)
    torch.set_default_dtype(torch.float64)
    model = Model.from_pretrained(d, attn_implementation="eager", torch_dtype=torch.float64).eval()
    with torch.no_grad():
        logits = model(input_ids=torch.tensor(ours["ids"])).logits.reshape(-1, model.config.vocab_size)
    worst = (logits - torch.tensor(ours["logits"], dtype=torch.float64)).abs().max().item()
    print(f"{d}: transformers loaded the trained export as {Model.__name__}; max |logit - mpitron f32| = {worst:.3g}")
    return 0 if worst <= 1e-4 else 1


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--family", required=True, choices=sorted(FAMILIES))
    ap.add_argument("--out")
    ap.add_argument("--check-export", metavar="DIR")
    ap.add_argument("--compare-logits", nargs=2, metavar=("DIR", "OURS_JSON"))
    a = ap.parse_args()
    out = a.out or os.path.join(ROOT, "tests/apps/ref", "hf_" + a.family)
    if a.compare_logits:
        sys.exit(compare_logits(a.family, *a.compare_logits))
    if a.check_export:
        sys.exit(check_export(a.family, a.check_export, out))
    write(a.family, out)


if __name__ == "__main__":
    main()
