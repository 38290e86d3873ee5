#!/usr/bin/python3
"""Known answers for mpitron's Hugging Face Llama import/export (model/inference/hf_llama.h):
a small random LlamaForCausalLM built and saved by Hugging Face transformers itself, and
its logits, loss and parameter gradients computed by transformers in float64.

Run from the repository root with Debian's interpreter (python3-torch) and transformers 4.40:
    MPITRON_DEPS_REFERENCE=1 ./scripts/install-deps.sh    # or: apt-get install -y python3-torch;
    /usr/bin/python3 -m pip install --break-system-packages "transformers==4.40.*"
    /usr/bin/python3 tests/reference/hf_llama_ref.py [--out tests/apps/ref/hf_llama]

Writes (deterministic; the C++ test is tests/apps/test_hf_llama.cpp):
  config.json, model.safetensors.index.json, model-0000k-of-0000n.safetensors
      LlamaForCausalLM.save_pretrained(max_shard_size="60KB"): SHARDED, float32.
  ref.json   reference numbers (below).

Model: vocab 100, hidden 48, 4 query heads (head dim 12), 2 key/value heads (GQA), intermediate
80, 2 layers, rope_theta 10000, rms_norm_eps 1e-5, max_position_embeddings 64, untied lm_head,
no biases, SiLU. Weights: torch.manual_seed(SEED) then every parameter ~ N(0, 0.1) (norm weights
1 + N(0, 0.1), so that a wrong norm weight mapping shows), stored as float32. The references
are computed by transformers (attn_implementation="eager") after model.double(): float64 on
exactly the stored float32 weights (HF computes rope's cos/sin in float32 even then, which
moves the logits by ~1e-7 relative, far under the C++ tolerances).

ref.json:
  batches: for each token batch: "ids" (B, T) inputs, "targets" (B, T) = the next tokens
      (the ids shifted by one), "logits" (B, T, 100) float64, "loss" = mean cross-entropy of
      logits vs targets over all B·T positions (mpitron's GPT::forward loss: it takes inputs and
      targets separately; this equals HF's labels= loss on the unshifted sequence).
      Batch 0 also has "grads": for every HF parameter name: "norm" (Frobenius norm of d loss /
      d param), "rms", and "sample" = [[flat index, value], ...] at SAMPLES evenly spaced indices.

--check-export DIR: loads an mpitron export (convert_checkpoint --direction mpitron-to-hf) from
DIR with LlamaForCausalLM.from_pretrained and compares its logits on the batches with ref.json
(max abs difference printed; exit status 1 above 1e-4). Not run by CI.
"""
import argparse
import json
import os
import sys

import torch

SEED = 4321
CFG = dict(vocab_size=100, hidden_size=48, intermediate_size=80, num_hidden_layers=2, num_attention_heads=4,
           num_key_value_heads=2, rope_theta=10000.0, rms_norm_eps=1e-5, max_position_embeddings=64,
           tie_word_embeddings=False, hidden_act="silu", attention_bias=False, bos_token_id=1, eos_token_id=2)
BATCHES = [(2, 16), (1, 7)]
SAMPLES = 12
ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))


def build():
    from transformers import LlamaConfig, LlamaForCausalLM
    torch.manual_seed(SEED)
    model = LlamaForCausalLM(LlamaConfig(**CFG, attn_implementation="eager"))
    g = torch.Generator().manual_seed(SEED)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=g, dtype=torch.float32) * 0.1
            p.copy_(noise + 1.0 if name.endswith("norm.weight") else noise)
    return model.float().eval()


def batches():
    g = torch.Generator().manual_seed(SEED + 1)
    return [torch.randint(0, CFG["vocab_size"], (b, t + 1), generator=g) for b, t in BATCHES]


def logits_loss(model, seq):
    ids, tgt = seq[:, :-1], seq[:, 1:]
    logits = model(input_ids=ids).logits
    loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), tgt.reshape(-1))
    return ids, tgt, logits, loss


def write(out):
    model = build()
    os.makedirs(out, exist_ok=True)
    for f in os.listdir(out):
        if f.endswith(".safetensors") or f.endswith(".json"):
            os.remove(os.path.join(out, f))
    model.save_pretrained(out, max_shard_size="60KB", safe_serialization=True)
    assert os.path.exists(os.path.join(out, "model.safetensors.index.json")), "expected a sharded save"
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


def check_export(d, out):
    from transformers import LlamaForCausalLM
    with open(os.path.join(out, "ref.json")) as f:
        ref = json.load(f)
    model = LlamaForCausalLM.from_pretrained(d, attn_implementation="eager", torch_dtype=torch.float64).eval()
    worst = 0.0
    with torch.no_grad():
        for b in ref["batches"]:
            logits = model(input_ids=torch.tensor(b["ids"])).logits
            worst = max(worst, (logits - torch.tensor(b["logits"], dtype=torch.float64)).abs().max().item())
    print(f"{d}: transformers loaded the export; max |logit - reference| = {worst:.3g}")
    return 0 if worst <= 1e-4 else 1


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.path.join(ROOT, "tests/apps/ref/hf_llama"))
    ap.add_argument("--check-export", metavar="DIR")
    a = ap.parse_args()
    if a.check_export:
        sys.exit(check_export(a.check_export, a.out))
    write(a.out)


if __name__ == "__main__":
    main()
