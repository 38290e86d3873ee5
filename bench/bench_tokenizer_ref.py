#!/usr/bin/env python3
"""Single-thread GPT-2 tokenizer throughput of the references, for bench_data.

Tokenises every line of the bundled texts (tinyshakespeare, WikiText-2 test,
LAMBADA test; the "line" of tests/reference/tokenize_ref.py) with Hugging Face
`tokenizers` (parallelism off) and, when installed, tiktoken (one thread),
both built from assets/gpt2. Best of --repeats runs, each with a fresh
tokenizer (cold caches). tiktoken is also timed on the three files as whole strings (its best case,
no per-call overhead; token count differs from the per-line total).
Prints one line per tokenizer:
  REF <name> <MB/s> <tokens>
Run: python3 bench/bench_tokenizer_ref.py [--repeats 3]
"""
import argparse
import json
import os
import sys
import time

os.environ["TOKENIZERS_PARALLELISM"] = "false"
os.environ["RAYON_NUM_THREADS"] = "1"
ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
sys.path.insert(0, os.path.join(ROOT, "tests", "reference"))
import tokenize_ref  # noqa: E402


def load_lines():
    lines = []
    for _, fname in tokenize_ref.TEXTS:
        lines += tokenize_ref.read_lines(os.path.join(ROOT, "assets", "text", fname))[0]
    return lines


def bench(make, encode_all, lines, repeats):
    nbytes = sum(len(l.encode("utf-8")) for l in lines)
    best, ntok = 1e30, 0
    for _ in range(repeats):
        tok = make()
        t = time.perf_counter()
        ntok = encode_all(tok, lines)
        best = min(best, time.perf_counter() - t)
    return nbytes / best / 1e6, ntok


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    lines = load_lines()
    mbs, n = bench(tokenize_ref.hf_tokenizer,
                   lambda tok, ls: sum(len(e.ids) for e in tok.encode_batch(ls, add_special_tokens=False)),
                   lines, args.repeats)
    print(f"REF hf_tokenizers_encode_batch {mbs:.2f} {n}")
    mbs, n = bench(tokenize_ref.hf_tokenizer,
                   lambda tok, ls: sum(len(tok.encode(l, add_special_tokens=False).ids) for l in ls),
                   lines, args.repeats)
    print(f"REF hf_tokenizers_encode_loop {mbs:.2f} {n}")
    if tokenize_ref.tiktoken_encoding() is not None:
        mbs, n = bench(tokenize_ref.tiktoken_encoding,
                       lambda enc, ls: sum(map(len, enc.encode_ordinary_batch(ls, num_threads=1))),
                       lines, args.repeats)
        print(f"REF tiktoken_one_thread {mbs:.2f} {n}")
        # Whole files as three strings: no per-call overhead (different token count).
        mbs, n = bench(tokenize_ref.tiktoken_encoding,
                       lambda enc, ts: sum(len(enc.encode_ordinary(t)) for t in ts), whole_files(), args.repeats)
        print(f"REF tiktoken_whole_files {mbs:.2f} {n}")


def whole_files():
    return [tokenize_ref.read_lines(os.path.join(ROOT, "assets", "text", f))[1] for _, f in tokenize_ref.TEXTS]


if __name__ == "__main__":
    main()
