#!/usr/bin/python3
"""Trains two small BERT WordPiece vocabularies and writes Hugging Face's ids for them.

Reference for tests/data/test_wordpiece_tokenizer.cpp (BertWordPieceLowerCase /
BertWordPieceCase). Needs PyPI `tokenizers` (test-time only). Run from the repo root:
    /usr/bin/python3 tests/reference/bert_tokenizer_ref.py
Writes:
  tests/data/ref/bert_uncased/vocab.txt   WordPiece vocab (2000), lower-cased + accents stripped
  tests/data/ref/bert_cased/vocab.txt     WordPiece vocab (2000), cased
  tests/data/ref/bert_tokenizer_ref.json  {vocab_size, files: [{path, uncased, cased}],
      cases: [{name, text, uncased, cased}]}: ids of BertWordPieceTokenizer(vocab.txt)
      .encode(text, add_special_tokens=False) (Megatron's tokenize() adds no [CLS]/[SEP]);
      for whole files the id count and FNV-1a 64 of the ids.
The tokenizers are re-read from the written vocab.txt, so the ids are those of the files.
"""
import json
import os

from tokenizers import BertWordPieceTokenizer

REF = "tests/data/ref"
TEXTS = ["assets/text/tinyshakespeare.txt", "assets/text/wikitext-2.valid.txt", "assets/text/lambada_test.jsonl"]
SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]


def corpus(nbytes):
    out = []
    for p in TEXTS:
        with open(p, "rb") as f:
            out.append(f.read(nbytes).decode("utf-8", errors="ignore"))
    return out


def fnv1a_ids(ids):
    """FNV-1a 64 over the ids as little-endian uint32 (tests/data/data_test_util.h)."""
    h = 0xcbf29ce484222325
    for i in ids:
        for b in (i & 0xFFFFFFFF).to_bytes(4, "little"):
            h = ((h ^ b) * 1099511628211) & 0xFFFFFFFFFFFFFFFF
    return h


def train(lowercase, lines, extra):
    tok = BertWordPieceTokenizer(lowercase=lowercase)
    tok.train_from_iterator(lines + extra, vocab_size=2000, min_frequency=2, limit_alphabet=500,
                            special_tokens=SPECIALS, show_progress=False)
    d = f"{REF}/bert_{'uncased' if lowercase else 'cased'}"
    os.makedirs(d, exist_ok=True)
    tok.save_model(d)
    return BertWordPieceTokenizer(f"{d}/vocab.txt", lowercase=lowercase)


def main():
    train_text = corpus(200_000)
    lines = [l for t in train_text for l in t.splitlines()]
    cases = [(os.path.basename(p), t) for p, t in zip(TEXTS, corpus(4096))]
    cases += [
        ("emoji", "I ❤️ emoji 👩‍👩‍👧‍👦 and 🇫🇷 flags 😀😀!"),
        ("newer_emoji", "smile 🥲 melt 🫠 done"),
        ("cjk", "日本語のテキストと中文文本，还有한국어 텍스트。"),
        ("cjk_ext", "𠀀𪜀 \u3400 \uf900 \U0002f800 中x文"),
        ("combining", "e\u0301 vs \u00e9, n\u0303, a\u030a\u0323 Zalgo: Z\u0351\u0357a\u0346l\u035bg\u0344o"),
        ("accents_case", "Café NAÏVE Ärger Straße Ωμέγα ΣΟΦΊΑ İstanbul ǅ ﬁne"),
        ("whitespace", "a" + " " * 40 + "b\n\n\n\t\t  \n" + "\u3000\u00a0 x" + " " * 7 + "\n" + "\t" * 20 + "end   "),
        ("unicode_spaces", "a\u1680b\u2000c\u2005d\u200ae\u202ff\u205fg\u2028h\u2029i\u0085j"),
        ("control", "nul\u0000x\u0001y\u001fz\u007f\u0085a\u200bb\ufeffc\u200dd\ufffde\u000bf\u000cg"),
        ("private_use", "pua\ue000x \U000f0000y"),
        ("punctuation", "Hello!!! What?!... \"quoted\" (paren) [bracket] {brace} a-b_c/d\\e $5 + 3 = 8 ^~`|<>@#%&*;:"),
        ("unicode_punct", "«guillemets» „low“ ‘single’ — dash – en ¡hola! ¿qué? § ¶ † ‡ • … ‰ € £ ¥"),
        ("long_word", "short " + "abcdefghij" * 10 + " " + "abcdefghij" * 10 + "x tail"),
        ("long_word_unicode", "é" * 100 + " " + "é" * 101),
        ("unknown_piece", "qzxqzxqzx ☃☃ \u16a0\u16a1"),
        ("special_in_text", "Hello [MASK] world[SEP]x [CLS][PAD] [UNK]! [mask] [Sep] [ MASK ]"),
        ("numbers", "Pi is 3.14159265358979, 1,234,567 and ١٢٣٤ (Arabic-Indic) ½ ²."),
        ("contractions", "I'M sure you'LL see it's HE'S and they've DON'T"),
        ("empty", ""),
        ("only_space", "   \n\t  "),
        ("crlf", "line one\r\nline two\r\n\r\n  indented\r\n"),
    ]
    # The edge cases join the training text (3 times, so their characters and some of their
    # pieces make it into the vocab): otherwise most of them would only test [UNK].
    extra = [t for _, t in cases[len(TEXTS):]] * 3
    uncased = train(True, lines, extra)
    cased = train(False, lines, extra)
    files = []
    for p in TEXTS + ["assets/text/wikitext-2.test.txt"]:
        with open(p, encoding="utf-8") as f:
            text = f.read()
        row = {"path": p}
        for key, tok in [("uncased", uncased), ("cased", cased)]:
            ids = tok.encode(text, add_special_tokens=False).ids
            row[key] = {"count": len(ids), "fnv1a": str(fnv1a_ids(ids))}
        files.append(row)
    out = [{"name": n, "text": t,
            "uncased": uncased.encode(t, add_special_tokens=False).ids,
            "cased": cased.encode(t, add_special_tokens=False).ids,
            "uncased_tokens": uncased.encode(t, add_special_tokens=False).tokens,
            "cased_tokens": cased.encode(t, add_special_tokens=False).tokens} for n, t in cases]
    with open(f"{REF}/bert_tokenizer_ref.json", "w") as f:
        json.dump({"uncased_vocab_size": uncased.get_vocab_size(), "cased_vocab_size": cased.get_vocab_size(),
                   "files": files, "cases": out}, f, ensure_ascii=False, separators=(",", ":"))


if __name__ == "__main__":
    main()
