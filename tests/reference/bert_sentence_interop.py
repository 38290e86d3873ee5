#!/usr/bin/python3
"""Sentence-level BERT data (preprocess_data --split-sentences) against megatron-core.

1. Builds, with megatron-core's IndexedDatasetBuilder, the dataset Megatron's
   tools/preprocess_data.py would write for tests/data/ref/sentence_cases.json (one
   document per case, its hand-labelled sentences as the sentence list, each sentence
   tokenised by Hugging Face BertWordPieceTokenizer(tests/data/ref/bert_uncased/vocab.txt),
   --append-eod: [EOS] on each document's last sentence, as Megatron's encode() does):
   tests/data/interop/mcore_bert_text_sentence.{bin,idx}.
2. If build/apps/preprocess_data exists, runs it with --split-sentences --tokenizer-type
   BertWordPieceLowerCase --append-eod on the same texts (the splitter finds the sentences
   itself), reads its <prefix>_text_sentence files with megatron-core's IndexedDataset
   (document_indices, sequence_lengths, every sequence) and compares them byte for byte
   with mcore_bert_text_sentence. Prints "ALL OK".

tests/data/test_preprocess.cpp checks in CI that preprocess_data still writes exactly
mcore_bert_text_sentence. Run from the repo root (needs `tokenizers`, megatron-core and
torch as in megatron_interop.py):
  /usr/bin/python3 tests/reference/bert_sentence_interop.py
"""
import json
import logging
import os
import subprocess
import sys
import tempfile

import numpy as np

sys.path.insert(0, os.path.dirname(__file__))
from megatron_interop import import_indexed_dataset, ROOT  # noqa: E402

OUT = os.path.join(ROOT, "tests", "data", "interop")
VOCAB = os.path.join(ROOT, "tests", "data", "ref", "bert_uncased", "vocab.txt")
CASES = os.path.join(ROOT, "tests", "data", "ref", "sentence_cases.json")


def main():
    logging.basicConfig(level=logging.WARNING)
    from tokenizers import BertWordPieceTokenizer
    idx = import_indexed_dataset()
    tok = BertWordPieceTokenizer(VOCAB, lowercase=True)
    vocab = [l.rstrip("\n") for l in open(VOCAB, encoding="utf-8")]
    eos = len(vocab) + 1  # Megatron's _BertWordPieceTokenizer appends [BOS], [EOS]
    cases = json.load(open(CASES, encoding="utf-8"))

    prefix = os.path.join(OUT, "mcore_bert_text_sentence")
    b = idx.IndexedDatasetBuilder(prefix + ".bin", dtype=np.uint16)
    docs = []
    for c in cases:  # Megatron's Encoder.encode with a list of sentences
        doc_ids, lens = [], []
        for s in c["sentences"]:
            ids = tok.encode(s, add_special_tokens=False).ids
            if ids:
                doc_ids.extend(ids)
                lens.append(len(ids))
        if doc_ids:
            doc_ids.append(eos)
            lens[-1] += 1
        b.add_document(np.array(doc_ids, dtype=np.uint16), lens)
        docs.append((doc_ids, lens))
    b.finalize(prefix + ".idx")
    print(f"wrote {prefix}.{{bin,idx}}: {len(docs)} documents, {sum(len(l) for _, l in docs)} sentences")

    app = os.path.join(ROOT, "build", "apps", "preprocess_data")
    if not os.path.exists(app):
        print("build/apps/preprocess_data missing: build it to check mpitron's output")
        return 1
    with tempfile.TemporaryDirectory() as d:
        with open(os.path.join(d, "in.jsonl"), "w", encoding="utf-8") as f:
            for c in cases:
                f.write(json.dumps({"text": c["text"]}, ensure_ascii=False) + "\n")
        subprocess.run([app, "--input", os.path.join(d, "in.jsonl"), "--output-prefix", os.path.join(d, "ours"),
                        "--split-sentences", "--tokenizer-type", "BertWordPieceLowerCase", "--vocab-file", VOCAB,
                        "--append-eod"], check=True, capture_output=True)
        ours = os.path.join(d, "ours_text_sentence")
        ds = idx.IndexedDataset(ours)
        want_doc_idx = np.cumsum([0] + [len(l) for _, l in docs]).tolist()
        assert ds.document_indices.tolist() == want_doc_idx, (ds.document_indices, want_doc_idx)
        want_lens = [n for _, l in docs for n in l]
        assert ds.sequence_lengths.tolist() == want_lens, (ds.sequence_lengths, want_lens)
        flat = [t for ids, _ in docs for t in ids]
        got = [t for i in range(len(ds)) for t in ds[i].tolist()]
        assert got == flat
        same = all(open(ours + e, "rb").read() == open(prefix + e, "rb").read() for e in (".bin", ".idx"))
        print(f"megatron-core reads ours_text_sentence: {len(ds.document_indices) - 1} documents, "
              f"{len(ds)} sentences as labelled; byte-identical to mcore_bert_text_sentence: {same}")
        print("ALL OK" if same else "FAILED")
        return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
