#!/usr/bin/python3
"""Trains the small test tokenizers and writes their reference ids (tests/data/ref/).

Reference for tests/data/test_hf_tokenizer.cpp and test_sp_tokenizer.cpp. Needs PyPI
`tokenizers` and `sentencepiece` (test-time only). Run from the repo root:
    /usr/bin/python3 tests/reference/llama_tokenizers_ref.py
Writes:
  tests/data/ref/llama3_style/tokenizer.json  byte-level BPE, Llama-3 Split regex,
      special tokens <|begin_of_text|> <|end_of_text|>, TemplateProcessing adds BOS
  tests/data/ref/llama3_style/tokenizer_config.json  (bos/eos names, as AutoTokenizer reads them)
  tests/data/ref/neox_style/tokenizer.json    the same BPE with a GPT-NeoX-style ByteLevel pre-tokenizer
  tests/data/ref/sp_bpe.model                 SentencePiece BPE (Llama-2 style options)
  tests/data/ref/llama_tokenizers_ref.json    {cases: [{name, text, hf, hf_special, sp, sp_megatron, sp_llama2}]}
"""
import json, os, io
from tokenizers import Tokenizer, Regex, models, pre_tokenizers, decoders, processors, trainers
import sentencepiece as spm

REF = "tests/data/ref"
TEXTS = ["assets/text/tinyshakespeare.txt", "assets/text/wikitext-2.valid.txt", "assets/text/lambada_test.jsonl"]
LLAMA3_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                  r"|\s*[\r\n]+|\s+(?!\S)|\s+")


def corpus(nbytes):
    out = []
    for p in TEXTS:
        with open(p, "rb") as f:
            out.append(f.read(nbytes).decode("utf-8", errors="ignore"))
    return out


def train_hf(lines):
    tok = Tokenizer(models.BPE(ignore_merges=True))
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(LLAMA3_PATTERN), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=2000, special_tokens=["<|begin_of_text|>", "<|end_of_text|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(lines, trainer)
    tok.add_special_tokens(["<|eot_id|>"])
    bos = tok.token_to_id("<|begin_of_text|>")
    tok.post_processor = processors.TemplateProcessing(
        single="<|begin_of_text|> $A", pair="<|begin_of_text|> $A <|begin_of_text|> $B",
        special_tokens=[("<|begin_of_text|>", bos)])
    return tok


def fnv1a_ids(ids):
    """FNV-1a 64 over the ids as little-endian uint32 (tests/data/data_test_util.h)."""
    h = 0xcbf29ce484222325
    for i in ids:
        for b in (i & 0xFFFFFFFF).to_bytes(4, "little"):
            h = ((h ^ b) * 1099511628211) & 0xFFFFFFFFFFFFFFFF
    return h


def neox_variant(path_in, path_out):
    """Same vocab/merges, GPT-NeoX-style: ByteLevel(use_regex, add_prefix_space) pre-tokenizer,
    ByteLevel post-processor, no tokenizer_config.json (eos found by name)."""
    with open(path_in) as f:
        j = json.load(f)
    j["pre_tokenizer"] = {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True}
    j["post_processor"] = {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": False, "use_regex": True}
    j["model"]["ignore_merges"] = False
    with open(path_out, "w") as f:
        json.dump(j, f, ensure_ascii=False)
    return Tokenizer.from_file(path_out)


def megatron_sp_specials(sp):
    """Megatron's _SentencePieceTokenizer._initalize (vocab_extra_ids=0): token -> id."""
    vocab = {sp.id_to_piece(i): i for i in range(sp.get_piece_size())}
    special = {}
    def add(t):
        if t not in vocab:
            vocab[t] = len(vocab)
        special[t] = vocab[t]
    for t in ["<CLS>", "<SEP>", "<EOD>", "<MASK>"]:
        add(t)
    for i, fallback in [(sp.pad_id(), "<PAD>"), (sp.bos_id(), "<BOS>"), (sp.eos_id(), "<EOS>")]:
        try:
            add(sp.id_to_piece(i))
        except IndexError:
            add(fallback)
    return special


def megatron_sp_tokenize(sp, special, text):
    """Megatron's _SentencePieceTokenizer.tokenize, loop as written there."""
    ids, idx = [], 0
    while True:
        indices = {t: text[idx:].index(t) for t in special if t in text[idx:]}
        if not indices:
            break
        nxt = min(indices, key=indices.get)
        nidx = idx + indices[nxt]
        ids.extend(sp.encode_as_ids(text[idx:nidx]))
        ids.append(special[nxt])
        idx = nidx + len(nxt)
    ids.extend(sp.encode_as_ids(text[idx:]))
    return ids


def main():
    os.makedirs(f"{REF}/llama3_style", exist_ok=True)
    train = corpus(200_000)
    lines = [l for t in train for l in t.splitlines(keepends=True)]
    hf = train_hf(lines)
    hf.save(f"{REF}/llama3_style/tokenizer.json", pretty=False)
    with open(f"{REF}/llama3_style/tokenizer_config.json", "w") as f:
        json.dump({"bos_token": "<|begin_of_text|>", "eos_token": "<|end_of_text|>"}, f)
    with open("/tmp/sp_train.txt", "w") as f:
        f.writelines(lines)
    spm.SentencePieceTrainer.train(
        input="/tmp/sp_train.txt", model_prefix=f"{REF}/sp_bpe", vocab_size=1000, model_type="bpe",
        byte_fallback=True, split_digits=True, character_coverage=0.9995, normalization_rule_name="identity",
        add_dummy_prefix=True, remove_extra_whitespaces=False, allow_whitespace_only_pieces=True,
        bos_id=1, eos_id=2, unk_id=0, pad_id=-1, minloglevel=2)
    os.remove(f"{REF}/sp_bpe.vocab")
    sp = spm.SentencePieceProcessor(model_file=f"{REF}/sp_bpe.model")

    cases = [(os.path.basename(p), t) for p, t in zip(TEXTS, corpus(4096))]
    cases += [
        ("emoji", "I ❤️ emoji 👩‍👩‍👧‍👦 and 🇫🇷 flags 😀😀!"),
        ("cjk", "日本語のテキストと中文文本，还有한국어 텍스트。"),
        ("combining", "e\u0301 vs \u00e9, n\u0303, a\u030a\u0323 Zalgo: Z\u0351\u0357a\u0346l\u035bg\u0344o"),
        ("whitespace", "a" + " " * 40 + "b\n\n\n\t\t  \n" + "\u3000\u00a0 x" + " " * 7 + "\n" + "\t" * 20 + "end   "),
        ("special_in_text", "Hello<|end_of_text|>world <|begin_of_text|> x<|eot_id|>y <|endoftext|>"),
        ("numbers", "Pi is 3.14159265358979, 1234567 and ١٢٣٤ (Arabic-Indic)."),
        ("contractions", "I'M sure you'LL see it's HE'S and they've DON'T"),
        ("empty", ""),
        ("crlf", "line one\r\nline two\r\n\r\n  indented\r\n"),
    ]
    specials = megatron_sp_specials(sp)
    cases.append(("sp_special_in_text", "a<EOD>b</s> <s>c<MASK><CLS>d<SEP>e<PAD>"))
    os.makedirs(f"{REF}/neox_style", exist_ok=True)
    neox = neox_variant(f"{REF}/llama3_style/tokenizer.json", f"{REF}/neox_style/tokenizer.json")
    # Whole bundled files, one string each: id count and FNV-1a of the ids.
    files = []
    for p in TEXTS + ["assets/text/wikitext-2.test.txt"]:
        with open(p, encoding="utf-8") as f:
            text = f.read()
        row = {"path": p}
        for key, ids in [("hf", hf.encode(text, add_special_tokens=False).ids),
                         ("neox", neox.encode(text, add_special_tokens=False).ids), ("sp", sp.encode(text))]:
            row[key] = {"count": len(ids), "fnv1a": str(fnv1a_ids(ids))}
        files.append(row)
    out = []
    for name, text in cases:
        out.append({"name": name, "text": text,
                    "hf": hf.encode(text, add_special_tokens=False).ids,
                    "hf_special": hf.encode(text, add_special_tokens=True).ids,
                    "neox": neox.encode(text, add_special_tokens=True).ids,
                    "sp": sp.encode(text),
                    "sp_megatron": megatron_sp_tokenize(sp, specials, text),
                    "sp_llama2": [sp.bos_id()] + sp.encode(text)})
    with open(f"{REF}/llama_tokenizers_ref.json", "w") as f:
        json.dump({"hf_vocab_size": hf.get_vocab_size(), "sp_vocab_size": sp.get_piece_size(),
                   "sp_megatron_vocab_size": sp.get_piece_size() + sum(v >= sp.get_piece_size() for v in specials.values()),
                   "sp_megatron_eod": specials["<EOD>"], "files": files, "cases": out},
                  f, ensure_ascii=False, separators=(",", ":"))


if __name__ == "__main__":
    main()
