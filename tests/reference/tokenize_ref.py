#!/usr/bin/env python3
"""Reference GPT-2 token ids for tests/data/test_tokenizer.cpp.

Tokenises every line of the bundled texts with Hugging Face `tokenizers`
(BPE from assets/gpt2/gpt2-vocab.json + gpt2-merges.txt, ByteLevel
pre-tokeniser without prefix space, no special tokens: a literal
"<|endoftext|>" is ordinary text, as in Megatron), cross-checks every line with
tiktoken built from the same files, and writes tests/data/ref/tokens_<name>.txt.

A "line" (same definition in the C++ test):
  * .txt files: the file's bytes decoded as UTF-8, split on '\n'; the text of a
    line excludes its '\n' (a '\r' is kept); when the file ends with '\n' the
    empty string after it is not a line.
  * .jsonl files: each line as above is parsed as JSON; the line's text is its
    "text" field.
Each file also gets one "whole" record: the entire .txt file as one string (the
concatenation of the "text" fields joined by "\n" for .jsonl).

Output format (text, one record per line):
  tokens <name> lines=<N> full=<K>
  <count> <fnv>           N lines, per line: number of ids and FNV-1a 64 (hex)
                          over the ids as little-endian uint32
  <id> <id> ...           K lines: the full ids of the first K lines
  whole <count> <fnv>

Also writes edge_cases.json (short strings: Unicode spaces, contractions,
digits, emoji, a literal <|endoftext|>) and tokens_edge.txt (their full ids,
one line per case, empty line for "").

Run (pyenv python3; pip install -r tests/reference/requirements.txt):
  python3 tests/reference/tokenize_ref.py
"""
import json
import os
import struct
import sys

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
ASSETS = os.path.join(ROOT, "assets")
OUT = os.path.join(ROOT, "tests", "data", "ref")
TEXTS = [("tinyshakespeare", "tinyshakespeare.txt"),
         ("wikitext2_test", "wikitext-2.test.txt"),
         ("lambada_test", "lambada_test.jsonl")]
FULL_LINES = 200


def fnv1a64(ids):
    h = 0xcbf29ce484222325
    for b in struct.pack("<%dI" % len(ids), *ids):
        h = ((h ^ b) * 0x100000001b3) & 0xFFFFFFFFFFFFFFFF
    return h


def read_lines(path):
    with open(path, "rb") as f:
        data = f.read().decode("utf-8")
    lines = data.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    if path.endswith(".jsonl"):
        texts = [json.loads(l)["text"] for l in lines]
        return texts, "\n".join(texts)
    return lines, data


def hf_tokenizer():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    vocab = os.path.join(ASSETS, "gpt2", "gpt2-vocab.json")
    merges = os.path.join(ASSETS, "gpt2", "gpt2-merges.txt")
    tok = Tokenizer(models.BPE.from_file(vocab, merges))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    return tok


def tiktoken_encoding():
    try:
        import tiktoken
    except ImportError:
        return None
    byte_to_char = {}
    n = 0
    for b in range(256):
        if 33 <= b <= 126 or 161 <= b <= 172 or 174 <= b <= 255:
            byte_to_char[b] = chr(b)
        else:
            byte_to_char[b] = chr(256 + n)
            n += 1
    char_to_byte = {c: b for b, c in byte_to_char.items()}
    with open(os.path.join(ASSETS, "gpt2", "gpt2-vocab.json"), encoding="utf-8") as f:
        vocab = json.load(f)
    ranks = {bytes(char_to_byte[c] for c in tok): i for tok, i in vocab.items() if tok != "<|endoftext|>"}
    pat = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
    return tiktoken.Encoding("gpt2_from_files", pat_str=pat, mergeable_ranks=ranks, special_tokens={})


def main():
    import tokenizers
    tok = hf_tokenizer()
    tik = tiktoken_encoding()
    os.makedirs(OUT, exist_ok=True)
    for name, fname in TEXTS:
        lines, whole = read_lines(os.path.join(ASSETS, "text", fname))
        encs = tok.encode_batch(lines, add_special_tokens=False)
        ids = [e.ids for e in encs]
        whole_ids = tok.encode(whole, add_special_tokens=False).ids
        if tik is not None:
            for i, (l, x) in enumerate(zip(lines, ids)):
                t = tik.encode_ordinary(l)
                if t != x:
                    sys.exit(f"{name} line {i + 1}: tiktoken and tokenizers disagree")
            assert tik.encode_ordinary(whole) == whole_ids, name
        for i in range(min(len(lines), FULL_LINES)):
            assert tok.decode(ids[i]) == lines[i], (name, i)
        path = os.path.join(OUT, f"tokens_{name}.txt")
        with open(path, "w") as f:
            k = min(FULL_LINES, len(lines))
            f.write(f"tokens {name} lines={len(lines)} full={k}\n")
            for x in ids:
                f.write(f"{len(x)} {fnv1a64(x):016x}\n")
            for x in ids[:k]:
                f.write(" ".join(map(str, x)) + "\n")
            f.write(f"whole {len(whole_ids)} {fnv1a64(whole_ids):016x}\n")
        print(f"{name}: {len(lines)} lines, {sum(map(len, ids))} tokens, whole={len(whole_ids)} "
              f"(tokenizers {tokenizers.__version__}, tiktoken check {'on' if tik else 'off'}) -> {path}")
    write_edge(tok, tik)


EDGE_CASES = [
    "", " ", "  ", "\n", "\n\n", " \n ", "\t\tx", "a   b", "a \u00a0b", "x\u3000y", "\u2028\u2029",
    "Hello world", " Hello", "HELLO'S it's we'll I'd they're 'S", "<|endoftext|>", "a<|endoftext|>b",
    "12345 3.14159 ١٢٣ ⅷ", "naïve café Ωμέγα Привет мир", "日本語のテキスト", "emoji 🤗🚀 👩\u200d💻",
    "zero\u200bwidth", "combining e\u0301", "mixed123abc", "!!!???...", "  leading and trailing  ",
    "\x1c\x1d\x1e\x1f\x85", "\u180e\ufeff", "tab\tsep\tvalues\r\n", "x" * 300, " " * 100 + "y",
    "a\u1680b\u2000c\u2005d\u200ae\u202ff\u205fg", " \u1680 x \u3000 ", "\x0b\x0c\r",
    "\U0010fffd", "don't stop", "a'b'c''d", "\u0000nul",
    # long pieces (> 64 bytes, the heap-based merge path)
    "a" * 257, "=-" * 100, "1234567890" * 20, "https://example.com/" + "path/segment_" * 12,
    "".join(chr(97 + (i * 7919) % 26) for i in range(1500)), "Supercalifragilistic" * 9,
    "ünïcödé" * 30, "🤗" * 40,
]


def write_edge(tok, tik):
    with open(os.path.join(OUT, "edge_cases.json"), "w") as f:
        json.dump(EDGE_CASES, f, ensure_ascii=True, indent=0)
        f.write("\n")
    path = os.path.join(OUT, "tokens_edge.txt")
    with open(path, "w") as f:
        f.write(f"tokens edge lines={len(EDGE_CASES)}\n")
        for i, text in enumerate(EDGE_CASES):
            ids = tok.encode(text, add_special_tokens=False).ids
            if tik is not None and tik.encode_ordinary(text) != ids:
                print(f"edge case {i} {text!r}: tiktoken {tik.encode_ordinary(text)} != tokenizers {ids}")
            f.write(" ".join(map(str, ids)) + "\n")
    print(f"edge: {len(EDGE_CASES)} cases -> {path}")


if __name__ == "__main__":
    main()
