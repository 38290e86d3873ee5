#!/usr/bin/python3
"""Known answers for mpitron's Hugging Face BERT import/export (model/inference/hf_bert.h):
a small random BertForPreTraining built and saved by Hugging Face transformers itself, and its
MLM logits, next-sentence logits, pre-training loss and parameter gradients computed by
transformers in float64.

Run from the repository root with Debian's interpreter (python3-torch) and transformers 4.40:
    apt-get install -y python3-torch
    /usr/bin/python3 -m pip install --break-system-packages "transformers==4.40.*"
    /usr/bin/python3 tests/reference/hf_bert_ref.py [--out tests/apps/ref/hf_bert]

Writes (deterministic; the C++ test is tests/apps/test_hf_bert.cpp):
  config.json, model.safetensors   BertForPreTraining.save_pretrained, float32
  ref.json                         reference numbers (below)

Model: vocab 120, hidden 48, 4 heads (head dim 12), intermediate 80, 2 layers,
max_position_embeddings 32, type_vocab_size 2, layer_norm_eps 1e-12, hidden_act "gelu" (HF's
exact erf GELU: mpitron's GPTConfig::gelu_exact). Weights: every parameter ~ N(0, 0.1) (LayerNorm
weights 1 + N(0, 0.1), so that a wrong norm mapping shows), stored as float32. The references are
computed by transformers (attn_implementation="eager") after model.double(): float64 on exactly
the stored float32 weights.

ref.json:
  batches: for each batch:
    "ids", "types" (B, T): input_ids and token_type_ids ([CLS] A [SEP] B [SEP]-like: types 0 then 1,
        padding type 0);
    "lengths" (B): tokens before the padding; attention_mask = 1 for t < length, else 0 (the
        padding ids are 0, [PAD]);
    "labels" (B, T): MLM labels, the original id at the labelled positions, -1 elsewhere (HF is
        given -100 there; mpitron's BertBatch::labels uses -1);
    "next_sentence_label" (B): HF's convention, 0 = "B follows A", 1 = "B is random"; the same
        number is mpitron's is_random (model/inference/hf_bert.h);
    "mlm_logits" (B, T, V) and "nsp_logits" (B, 2) float64 (every position, padding included);
    "loss" = HF's BertForPreTraining loss = mean MLM cross-entropy over labelled positions + mean
        NSP cross-entropy; "mlm_loss", "nsp_loss" its two parts.
  Batch 0 also has "grads": for every HF parameter name (tied: word_embeddings once, carrying the
  decoder's gradient; cls.predictions.bias once): "norm" (Frobenius norm of d loss / d param),
  "rms", and "sample" = [[flat index, value], ...] at SAMPLES evenly spaced indices.
Floats are written with 10 significant digits (1e-10 relative, far below the C++ tolerances).

--check-export DIR: loads an mpitron export (convert_checkpoint --direction mpitron-to-hf) from DIR
with BertForPreTraining.from_pretrained in float64 and compares its MLM and NSP logits on the
batches with ref.json; prints "max |logit - reference| = X" and exits 1 above 1e-4.
"""
import argparse
import json
import os
import sys

import torch

SEED = 2718
CFG = dict(vocab_size=120, hidden_size=48, num_hidden_layers=2, num_attention_heads=4, intermediate_size=80,
           max_position_embeddings=32, type_vocab_size=2, hidden_act="gelu", layer_norm_eps=1e-12, pad_token_id=0)
# (B, T, lengths, first-segment lengths, next_sentence_label)
BATCHES = [(2, 16, [16, 11], [7, 5], [0, 1]), (1, 9, [9], [4], [1])]
SAMPLES = 12
ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))


def build():
    from transformers import BertConfig, BertForPreTraining
    torch.manual_seed(SEED)
    model = BertForPreTraining(BertConfig(**CFG, attn_implementation="eager"))
    g = torch.Generator().manual_seed(SEED)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=g, dtype=torch.float32) * 0.1
            p.copy_(noise + 1.0 if name.endswith("LayerNorm.weight") else noise)
    return model.float().eval()


def batches():
    g = torch.Generator().manual_seed(SEED + 1)
    out = []
    for b, t, lengths, first, nsp in BATCHES:
        ids = torch.randint(1, CFG["vocab_size"], (b, t), generator=g)
        types = torch.zeros(b, t, dtype=torch.long)
        mask = torch.zeros(b, t, dtype=torch.long)
        labels = torch.full((b, t), -100, dtype=torch.long)
        for i in range(b):
            n = lengths[i]
            ids[i, n:] = 0
            types[i, first[i]:n] = 1
            mask[i, :n] = 1
            # about 20% of the real tokens labelled, never [CLS] (position 0)
            pos = torch.randperm(n - 1, generator=g)[: max(1, n // 5)] + 1
            labels[i, pos] = torch.randint(0, CFG["vocab_size"], (len(pos),), generator=g)
        out.append(dict(ids=ids, types=types, mask=mask, lengths=lengths, labels=labels,
                        nsp=torch.tensor(nsp, dtype=torch.long)))
    return out


def run(model, bt):
    o = model(input_ids=bt["ids"], token_type_ids=bt["types"], attention_mask=bt["mask"], labels=bt["labels"],
              next_sentence_label=bt["nsp"])
    ce = torch.nn.functional.cross_entropy
    mlm = ce(o.prediction_logits.reshape(-1, CFG["vocab_size"]), bt["labels"].reshape(-1), ignore_index=-100)
    nsp = ce(o.seq_relationship_logits, bt["nsp"])
    assert abs((mlm + nsp).item() - o.loss.item()) <= 1e-12 * abs(o.loss.item())
    return o, mlm, nsp


def rounded(x):
    if isinstance(x, list):
        return [rounded(v) for v in x]
    return float(f"{x:.10g}")


def write(out):
    model = build()
    os.makedirs(out, exist_ok=True)
    for f in os.listdir(out):
        if f.endswith(".safetensors") or f.endswith(".json"):
            os.remove(os.path.join(out, f))
    model.save_pretrained(out, safe_serialization=True)
    model = model.double()
    ref = {"batches": []}
    for i, bt in enumerate(batches()):
        model.zero_grad()
        o, mlm, nsp = run(model, bt)
        labels = bt["labels"].clone()
        labels[labels == -100] = -1
        r = {"ids": bt["ids"].tolist(), "types": bt["types"].tolist(), "lengths": bt["lengths"],
             "labels": labels.tolist(), "next_sentence_label": bt["nsp"].tolist(),
             "mlm_logits": rounded(o.prediction_logits.tolist()), "nsp_logits": rounded(o.seq_relationship_logits.tolist()),
             "loss": o.loss.item(), "mlm_loss": mlm.item(), "nsp_loss": nsp.item()}
        if i == 0:
            o.loss.backward()
            grads = {}
            for name, p in model.named_parameters():
                gr = p.grad.reshape(-1)
                idx = torch.linspace(0, gr.numel() - 1, SAMPLES).round().long().unique()
                grads[name] = {"norm": gr.norm().item(), "rms": (gr.norm() / gr.numel() ** 0.5).item(),
                               "sample": [[int(k), rounded(gr[k].item())] for k in idx]}
            r["grads"] = grads
        ref["batches"].append(r)
    with open(os.path.join(out, "ref.json"), "w") as f:
        json.dump(ref, f, separators=(",", ":"))
    total = sum(os.path.getsize(os.path.join(out, f)) for f in os.listdir(out))
    print(f"wrote {out}: {sorted(os.listdir(out))}, {total} bytes; losses",
          [(b["loss"], b["mlm_loss"], b["nsp_loss"]) for b in ref["batches"]])


def check_export(d, out):
    from transformers import BertForPreTraining
    with open(os.path.join(out, "ref.json")) as f:
        ref = json.load(f)
    model = BertForPreTraining.from_pretrained(d, attn_implementation="eager", torch_dtype=torch.float64).eval()
    worst = 0.0
    with torch.no_grad():
        for b in ref["batches"]:
            ids = torch.tensor(b["ids"])
            mask = (torch.arange(ids.shape[1])[None, :] < torch.tensor(b["lengths"])[:, None]).long()
            o = model(input_ids=ids, token_type_ids=torch.tensor(b["types"]), attention_mask=mask)
            worst = max(worst, (o.prediction_logits - torch.tensor(b["mlm_logits"], dtype=torch.float64)).abs().max().item(),
                        (o.seq_relationship_logits - torch.tensor(b["nsp_logits"], dtype=torch.float64)).abs().max().item())
    print(f"{d}: transformers loaded the export; max |logit - reference| = {worst:.3g}")
    return 0 if worst <= 1e-4 else 1


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.path.join(ROOT, "tests/apps/ref/hf_bert"))
    ap.add_argument("--check-export", metavar="DIR")
    a = ap.parse_args()
    if a.check_export:
        sys.exit(check_export(a.check_export, a.out))
    write(a.out)


if __name__ == "__main__":
    main()
