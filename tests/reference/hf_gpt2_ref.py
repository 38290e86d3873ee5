#!/usr/bin/python3
"""Known answers for mpitron's generation/evaluation apps: a small random GPT-2 in
Hugging Face layout, written as safetensors, with its logits, WikiText perplexity
and LAMBADA predictions computed here in PyTorch (float64).

Run from the repository root (Debian's CPU torch, `apt-get install -y python3-torch`;
Hugging Face `tokenizers` for the GPT-2 BPE, `/usr/bin/python3 -m pip install
--break-system-packages tokenizers`; `transformers` and `safetensors` are NOT used):

    /usr/bin/python3 tests/reference/hf_gpt2_ref.py [--out tests/apps/ref]

Writes (deterministic; the C++ test is tests/apps/test_hf_reference.cpp):
  gpt2_tiny.safetensors  the model, GPT2LMHeadModel names ("transformer.h.0.attn.c_attn.weight", ...),
                         F16 (keeps the file under 1 MB with the real 50257-token vocabulary);
                         written by hand: u64 LE header length, JSON header, raw data.
  gpt2_tiny_config.json  HF config.json of the model
  hf_ref.json            reference numbers (below)

Model: V=50257, P=256, L=2, C=8, NH=2, F=32, LayerNorm eps 1e-5, GELU tanh approximation
(HF "gelu_new"), tied LM head; weights drawn from torch.manual_seed(1234), rounded to
float16, and every computation below runs in float64 on those float16 values.
HF Conv1D weights are stored (in, out): y = x @ W + b.

hf_ref.json:
  logits: for each text of LOGIT_TEXTS: "ids" (GPT-2 tokens), and per position
          "lse" (log-sum-exp over the 50257 logits), "argmax", and "sample" = the logits at
          vocabulary ids 0, 997, 1994, ... (every 997th id).
  wikitext: the first WIKI_LINES lines of assets/text/wikitext-2.test.txt (each with its '\n'),
          evaluated as Megatron's tasks/zeroshot_gpt does, for each (seq_length,
          overlapping_eval) in WIKI_RUNS: num_original_tokens = len(raw.strip().split(" ")) of the
          raw text, the text detokenised with the WikiText rules (wikitext_detokenize below),
          tokenised (num_tokenized_tokens), windows of seq_length+1 tokens starting every
          overlapping_eval tokens, each target scored once (the first window all of its
          targets, later ones only their last overlapping_eval targets);
          total_loss (sum of token losses), avg_loss = total_loss / (num_tokenized_tokens - 1),
          ppl = exp(avg_loss), adjusted_ppl = exp(total_loss / (num_original_tokens - 1)).
  lambada: the first LAMBADA_LINES lines of assets/text/lambada_test.jsonl, non-strict (the
          whole text tokenised; the target is its last token) and strict (the target is
          " " + the last whitespace-separated word, the context the text before it, stripped):
          per example the context length, target ids, greedy predictions at the target
          positions, correct (all target tokens predicted); accuracy.
"""
import argparse
import json
import math
import os
import re
import struct
import sys

import torch

CFG = dict(V=50257, P=256, L=2, C=8, NH=2, F=32, eps=1e-5)
SEED = 1234
LOGIT_TEXTS = ["Hello, my dog is cute", " The quick brown fox jumps over the lazy dog.",
               "In 1998, the population of Zürich was 336,821 — roughly."]
SAMPLE_STRIDE = 997
WIKI_LINES = 30
WIKI_RUNS = [(128, 32), (128, 128)]
LAMBADA_LINES = 20
ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))


def tokenizer():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    tok = Tokenizer(models.BPE.from_file(os.path.join(ROOT, "assets/gpt2/gpt2-vocab.json"),
                                         os.path.join(ROOT, "assets/gpt2/gpt2-merges.txt")))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    return lambda s: tok.encode(s, add_special_tokens=False).ids


def make_weights():
    c = CFG
    g = torch.Generator().manual_seed(SEED)
    def n(*shape, std):
        return (torch.randn(*shape, generator=g, dtype=torch.float32) * std).half()
    C, F = c["C"], c["F"]
    w = {"transformer.wte.weight": n(c["V"], C, std=0.3), "transformer.wpe.weight": n(c["P"], C, std=0.1)}
    for l in range(c["L"]):
        p = f"transformer.h.{l}."
        w[p + "ln_1.weight"] = (1 + n(C, std=0.1).float()).half()
        w[p + "ln_1.bias"] = n(C, std=0.05)
        w[p + "attn.c_attn.weight"] = n(C, 3 * C, std=0.3)
        w[p + "attn.c_attn.bias"] = n(3 * C, std=0.05)
        w[p + "attn.c_proj.weight"] = n(C, C, std=0.3)
        w[p + "attn.c_proj.bias"] = n(C, std=0.05)
        w[p + "ln_2.weight"] = (1 + n(C, std=0.1).float()).half()
        w[p + "ln_2.bias"] = n(C, std=0.05)
        w[p + "mlp.c_fc.weight"] = n(C, F, std=0.3)
        w[p + "mlp.c_fc.bias"] = n(F, std=0.05)
        w[p + "mlp.c_proj.weight"] = n(F, C, std=0.3)
        w[p + "mlp.c_proj.bias"] = n(C, std=0.05)
    w["transformer.ln_f.weight"] = (1 + n(C, std=0.1).float()).half()
    w["transformer.ln_f.bias"] = n(C, std=0.05)
    return w


def write_safetensors(path, tensors):
    names = sorted(tensors)
    header, blobs, off = {}, [], 0
    for k in names:
        t = tensors[k].contiguous()
        b = t.numpy().tobytes()
        header[k] = {"dtype": "F16", "shape": list(t.shape), "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    header["__metadata__"] = {"format": "pt"}
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for b in blobs:
            f.write(b)


def read_safetensors(path):
    with open(path, "rb") as f:
        data = f.read()
    n = struct.unpack("<Q", data[:8])[0]
    header = json.loads(data[8:8 + n])
    out = {}
    for k, v in header.items():
        if k == "__metadata__":
            continue
        assert v["dtype"] == "F16"
        b, e = v["data_offsets"]
        out[k] = torch.frombuffer(bytearray(data[8 + n + b:8 + n + e]), dtype=torch.float16).reshape(v["shape"])
    return out


def gpt2_logits(W, ids):
    """GPT-2 forward in float64 (HF layout). ids: list of ints -> (T, V) logits."""
    c = CFG
    C, NH = c["C"], c["NH"]
    HD = C // NH
    w = {k: v.double() for k, v in W.items()}
    T = len(ids)
    ln = lambda x, p: torch.nn.functional.layer_norm(x, (C,), w[p + ".weight"], w[p + ".bias"], c["eps"])
    x = w["transformer.wte.weight"][torch.tensor(ids)] + w["transformer.wpe.weight"][:T]
    mask = torch.triu(torch.ones(T, T, dtype=torch.bool), 1)
    for l in range(c["L"]):
        p = f"transformer.h.{l}."
        h = ln(x, p + "ln_1")
        qkv = h @ w[p + "attn.c_attn.weight"] + w[p + "attn.c_attn.bias"]
        q, k, v = (t.view(T, NH, HD).transpose(0, 1) for t in qkv.split(C, dim=1))
        s = (q @ k.transpose(1, 2)) / math.sqrt(HD)
        s = s.masked_fill(mask, float("-inf"))
        a = (torch.softmax(s, dim=-1) @ v).transpose(0, 1).reshape(T, C)
        x = x + a @ w[p + "attn.c_proj.weight"] + w[p + "attn.c_proj.bias"]
        h = ln(x, p + "ln_2")
        m = torch.nn.functional.gelu(h @ w[p + "mlp.c_fc.weight"] + w[p + "mlp.c_fc.bias"], approximate="tanh")
        x = x + m @ w[p + "mlp.c_proj.weight"] + w[p + "mlp.c_proj.bias"]
    x = ln(x, "transformer.ln_f")
    return x @ w["transformer.wte.weight"].T


def wikitext_detokenize(s):
    """The WikiText detokeniser of Megatron's tasks/zeroshot_gpt (rules written out again here)."""
    s = s.replace("s '", "s'")
    s = re.sub(r"/' [0-9]/", r"/'[0-9]/", s)
    s = s.replace(" @-@ ", "-").replace(" @,@ ", ",").replace(" @.@ ", ".")
    for p in [":", ";", ".", "!", "?", ","]:
        s = s.replace(" " + p + " ", p + " ")
    s = re.sub(r"\(\s*([^\)]*?)\s*\)", r"(\1)", s)
    s = re.sub(r"\[\s*([^\]]*?)\s*\]", r"[\1]", s)
    s = re.sub(r"{\s*([^}]*?)\s*}", r"{\1}", s)
    s = re.sub(r"\"\s*([^\"]*?)\s*\"", r'"\1"', s)
    s = re.sub(r"'\s*([^']*?)\s*'", r"'\1'", s)
    s = s.replace("= = = =", "====").replace("= = =", "===").replace("= =", "==")
    s = s.replace(" " + chr(176) + " ", chr(176))
    s = s.replace(" \n", "\n").replace("\n ", "\n")
    s = s.replace(" N ", " 1 ")
    s = s.replace(" 's", "'s")
    return s


def token_losses(W, ids):
    """Cross-entropy of ids[1:] given ids[:-1] (float64, over the 50257 logits)."""
    lg = gpt2_logits(W, ids[:-1])
    return torch.logsumexp(lg, dim=1) - lg[torch.arange(len(ids) - 1), torch.tensor(ids[1:])]


def wikitext(W, enc, raw, seq_len, overlap):
    num_original = len(raw.strip().split(" "))
    ids = enc(wikitext_detokenize(raw))
    total_targets = len(ids) - 1
    nseq = max(math.ceil(max(total_targets - overlap, 0) / overlap) + 1, 1)
    total = 0.0
    scored = 0
    for i in range(nseq):
        start = i * overlap
        win = ids[start:start + seq_len + 1]
        if len(win) < 2:
            continue
        losses = token_losses(W, win)
        keep = torch.ones(len(losses), dtype=torch.bool)
        if overlap != seq_len and i != 0:
            # Megatron zeroes pad_mask[:-overlap] of the (seq_len)-long mask, padding included.
            keep_full = torch.zeros(seq_len, dtype=torch.bool)
            keep_full[seq_len - overlap:] = True
            keep = keep_full[:len(losses)]
        total += float(losses[keep].sum())
        scored += int(keep.sum())
    avg = total / (len(ids) - 1)
    return dict(seq_length=seq_len, overlapping_eval=overlap, num_original_tokens=num_original,
                num_tokenized_tokens=len(ids), windows=nseq, scored_targets=scored, total_loss=total,
                avg_loss=avg, ppl=math.exp(min(20, avg)),
                adjusted_ppl=math.exp(min(20, total / (num_original - 1))))


def lambada(W, enc, texts, strict):
    out = []
    for text in texts:
        if strict:
            last = text.split()[-1]
            start = text.rfind(last)
            ctx, tgt = enc(text[:start].strip()), enc(" " + last)
        else:
            ids = enc(text)
            ctx, tgt = ids[:-1], ids[-1:]
        seq = ctx + tgt
        lg = gpt2_logits(W, seq[:-1])
        pred = lg[len(ctx) - 1:].argmax(dim=1).tolist()
        out.append(dict(context_len=len(ctx), target=tgt, pred=pred, correct=pred == tgt))
    acc = sum(e["correct"] for e in out) / len(out)
    return dict(strict=strict, accuracy=acc, examples=out)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.path.join(ROOT, "tests/apps/ref"))
    args = ap.parse_args()
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    os.makedirs(args.out, exist_ok=True)
    c = CFG
    st_path = os.path.join(args.out, "gpt2_tiny.safetensors")
    write_safetensors(st_path, make_weights())
    W = read_safetensors(st_path)  # compute from exactly what the file holds
    with open(os.path.join(args.out, "gpt2_tiny_config.json"), "w") as f:
        json.dump(dict(architectures=["GPT2LMHeadModel"], model_type="gpt2", activation_function="gelu_new",
                       n_embd=c["C"], n_head=c["NH"], n_layer=c["L"], n_positions=c["P"], n_ctx=c["P"],
                       n_inner=c["F"], vocab_size=c["V"], layer_norm_epsilon=c["eps"], bos_token_id=50256,
                       eos_token_id=50256, tie_word_embeddings=True, torch_dtype="float16"), f, indent=2)
    enc = tokenizer()
    ref = dict(config=c, sample_stride=SAMPLE_STRIDE, logits=[])
    for text in LOGIT_TEXTS:
        ids = enc(text)
        lg = gpt2_logits(W, ids)
        ref["logits"].append(dict(text=text, ids=ids, lse=torch.logsumexp(lg, 1).tolist(),
                                  argmax=lg.argmax(1).tolist(), sample=lg[:, ::SAMPLE_STRIDE].tolist()))
    with open(os.path.join(ROOT, "assets/text/wikitext-2.test.txt"), "rb") as f:
        lines = f.read().decode("utf-8").split("\n")
    raw = "".join(l + "\n" for l in lines[:WIKI_LINES])
    ref["wikitext"] = dict(lines=WIKI_LINES, runs=[wikitext(W, enc, raw, s, o) for s, o in WIKI_RUNS])
    with open(os.path.join(ROOT, "assets/text/lambada_test.jsonl"), encoding="utf-8") as f:
        texts = [json.loads(l)["text"] for l in f.read().split("\n")[:LAMBADA_LINES]]
    ref["lambada"] = dict(lines=LAMBADA_LINES, seq_length=c["P"],
                          nonstrict=lambada(W, enc, texts, False), strict=lambada(W, enc, texts, True))
    with open(os.path.join(args.out, "hf_ref.json"), "w") as f:
        json.dump(ref, f)
    for r in ref["wikitext"]["runs"]:
        print("wikitext seq %d overlap %d: tokens %d words %d avg loss %.6f ppl %.4f adjusted ppl %.4f" % (
            r["seq_length"], r["overlapping_eval"], r["num_tokenized_tokens"], r["num_original_tokens"],
            r["avg_loss"], r["ppl"], r["adjusted_ppl"]))
    for k in ("nonstrict", "strict"):
        print("lambada %s accuracy %.4f" % (k, ref["lambada"][k]["accuracy"]))
    total = sum(os.path.getsize(os.path.join(args.out, f)) for f in os.listdir(args.out))
    print("wrote %s (%d bytes in all)" % (args.out, total))


if __name__ == "__main__":
    main()
