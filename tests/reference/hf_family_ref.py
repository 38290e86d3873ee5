#!/usr/bin/python3
"""Known answers for mpitron's Hugging Face import/export of the families built on Llama's
names (model/families.h): Qwen2, Mistral and Gemma. For each, a small random model built and
saved by Hugging Face transformers itself, and its logits, loss and parameter gradients
computed by transformers in float64.

Run from the repository root with Debian's interpreter (python3-torch) and transformers 4.40:
    MPITRON_DEPS_REFERENCE=1 ./scripts/install-deps.sh    # or: apt-get install -y python3-torch;
    /usr/bin/python3 -m pip install --break-system-packages "transformers==4.40.*"
    /usr/bin/python3 tests/reference/hf_family_ref.py --family qwen2|mistral|gemma [--out DIR]

Writes tests/apps/ref/hf_<family>/ (deterministic; the C++ test is tests/apps/test_hf_families.cpp):
  config.json, model.safetensors   save_pretrained, float32, one file.
  ref.json                         as tests/reference/hf_llama_ref.py's: for two token batches
      "ids", "targets" (the next tokens), "logits" (B, T, 100) float64 and "loss" (mean
      cross-entropy over all B·T positions); batch 0 also "grads": per HF parameter the norm,
      rms and 12 sampled entries of d loss / d param.

The models (vocab 100, hidden 48, intermediate 80, 2 layers, 4 query heads, 2 key/value heads):
  qwen2    Qwen2ForCausalLM: biases on q/k/v only, tied embeddings, rms_norm_eps 1e-6
  mistral  MistralForCausalLM: sliding_window 5, shorter than the 16-token batch, so the band
           mask matters (query i sees keys i-5 … i, transformers 4.40's eager mask and its flash path)
  gemma    GemmaForCausalLM: head_dim 16 (not 48 / 4), GeGLU with the tanh GELU
           (hidden_activation gelu_pytorch_tanh), RMSNorm with weights 1 + w, embeddings × √48, tied
Weights: every parameter ~ N(0, 0.1) (norm weights 1 + N(0, 0.1), Gemma's N(0, 0.1) around its
implicit 1), float32. References: attn_implementation="eager", model.double() on exactly the
stored weights (rope's cos/sin stay float32 in transformers), with torch's default dtype
float64 (Debian's torch 1.13 cannot build 4.40's Qwen2/Mistral masks in float64 otherwise).

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
FAMILIES = {
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM",
              dict(BASE, rms_norm_eps=1e-6, tie_word_embeddings=True, hidden_act="silu", use_sliding_window=False,
                   sliding_window=64, max_window_layers=2)),
    "mistral": ("MistralConfig", "MistralForCausalLM",
                dict(BASE, rms_norm_eps=1e-5, tie_word_embeddings=False, hidden_act="silu", sliding_window=5)),
    "gemma": ("GemmaConfig", "GemmaForCausalLM",
              dict(BASE, rms_norm_eps=1e-6, head_dim=16, hidden_act="gelu_pytorch_tanh",
                   hidden_activation="gelu_pytorch_tanh", tie_word_embeddings=True)),
}
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


def write(family, out):
    model = build(family)
    os.makedirs(out, exist_ok=True)
    for f in os.listdir(out):
        if f.endswith(".safetensors") or f.endswith(".json"):
            os.remove(os.path.join(out, f))
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
        if i == 0:
            loss.backward()
            grads = {}
            for name, p in model.named_parameters():
                g = p.grad.reshape(-1)
                idx = torch.linspace(0, g.numel() - 1, SAMPLES).round().long().unique()
                grads[name] = {"norm": g.norm().item(), "rms": (g.norm() / g.numel() ** 0.5).item(),
                               "sample": [[int(k), g[k].item()] for k in idx]}
            r["grads"] = grads
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
