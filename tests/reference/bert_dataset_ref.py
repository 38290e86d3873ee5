#!/usr/bin/python3
"""BERT samples from megatron-core's own code, for tests/data/test_bert_dataset.cpp.

Writes:
  tests/data/ref/bert_ds/wiki_text_sentence.{bin,idx}  a sentence-level dataset written by
      megatron-core's IndexedDatasetBuilder: the first paragraphs of WikiText-2 valid, one
      document per paragraph, sentences cut by a plain regex (any cut will do: this is
      test data), tokenised by HF BertWordPieceTokenizer(tests/data/ref/bert_uncased/vocab.txt);
  tests/data/ref/bert_dataset_ref.json  for a few configs: the sample index of megatron-core's
      compiled helpers.build_mapping and the first samples of
      BERTMaskedWordPieceDataset.__getitem__ (text, types, labels, is_random, padding_mask,
      loss_mask, truncated), with pretrain_bert.py's masking settings (max n-gram 3, whole
      words, no permutation, no geometric distribution).
megatron-core 0.16.1's module files are loaded without megatron.core's __init__ (see
megatron_interop.py); __getitem__ runs on an object made without __init__, its attributes
set as MaskedWordPieceDataset.__init__ would set them. Run from the repo root:
  /usr/bin/python3 tests/reference/bert_dataset_ref.py
"""
import json
import os
import re
import sys
import types

import numpy as np

sys.path.insert(0, os.path.dirname(__file__))
from megatron_interop import import_indexed_dataset, masked_samples, ROOT  # noqa: E402

REF = os.path.join(ROOT, "tests", "data", "ref")
VOCAB = os.path.join(REF, "bert_uncased", "vocab.txt")
PREFIX = os.path.join(REF, "bert_ds", "wiki_text_sentence")

CONFIGS = [  # name, seq_length, binary head, seed, num_samples, short_seq_prob, mask_prob, samples kept
    ("seq64_binary", 64, True, 1234, 120, 0.1, 0.15, 60),
    ("seq128_nobinary", 128, False, 7, 50, 0.1, 0.15, 30),
    ("seq24_binary_truncating", 24, True, 99, 200, 0.3, 0.2, 60),
]


def write_dataset(idx, tok):
    paras = []
    with open(os.path.join(ROOT, "assets", "text", "wikitext-2.valid.txt"), encoding="utf-8") as f:
        for line in f:
            line = line.strip()
            if line and not line.startswith("="):
                paras.append(line)
            if len(paras) == 160:
                break
    paras.append("A single sentence document .")  # one sentence: skipped with the binary head
    paras.append(" ".join(["word"] * 600) + " . Short one after a long sentence .")  # > 512 tokens
    os.makedirs(os.path.dirname(PREFIX), exist_ok=True)
    b = idx.IndexedDatasetBuilder(PREFIX + ".bin", dtype=np.uint16)
    for p in paras:
        doc, lens = [], []
        for s in re.split(r"(?<= \.) (?=[A-Z@\"])", p):
            ids = tok.encode(s, add_special_tokens=False).ids
            if ids:
                doc += ids
                lens.append(len(ids))
        b.add_document(np.array(doc, dtype=np.uint16), lens)
    b.finalize(PREFIX + ".idx")


def main():
    from tokenizers import BertWordPieceTokenizer
    idx = import_indexed_dataset()
    import megatron.core.datasets.bert_dataset as bd
    from megatron.core.datasets import helpers

    tok = BertWordPieceTokenizer(VOCAB, lowercase=True)
    write_dataset(idx, tok)
    ds = idx.IndexedDataset(PREFIX)

    vocab = [l.rstrip("\n") for l in open(VOCAB, encoding="utf-8")] + ["[BOS]", "[EOS]"]  # Megatron's add_token
    inv_vocab = dict(enumerate(vocab))
    tokenizer = types.SimpleNamespace(cls=vocab.index("[CLS]"), sep=vocab.index("[SEP]"), mask=vocab.index("[MASK]"),
                                      pad=vocab.index("[PAD]"), inv_vocab=inv_vocab)
    out = {"vocab_size": len(vocab), "documents": int(len(ds.document_indices) - 1), "sentences": len(ds),
           "configs": []}
    for name, seq, head, seed, nsamples, short_p, mask_p, keep in CONFIGS:
        config = types.SimpleNamespace(
            random_seed=seed, sequence_length=seq, classification_head=head, tokenizer=tokenizer,
            masking_probability=mask_p, short_sequence_probability=short_p, masking_max_ngram=3,
            masking_do_full_word=True, masking_do_permutation=False, masking_use_longer_ngrams=False,
            masking_use_geometric_distribution=False)
        docs = ds.document_indices  # all documents: indices = arange(n), +1 for the upper bound
        sample_index = helpers.build_mapping(docs, ds.sequence_lengths, np.iinfo(np.int32).max - 1, nsamples,
                                             seq - 3, short_p, seed, False, 2 if head else 1)
        samples = masked_samples(bd.BERTMaskedWordPieceDataset, config, ds, sample_index, keep)
        out["configs"].append({"name": name, "seq_length": seq, "binary_head": head, "seed": seed,
                               "num_samples": nsamples, "short_seq_prob": short_p, "mask_prob": mask_p,
                               "sample_index": np.asarray(sample_index).tolist(), "samples": samples})
        print(name, "samples", len(sample_index))
    with open(os.path.join(REF, "bert_dataset_ref.json"), "w") as f:
        json.dump(out, f, separators=(",", ":"))


if __name__ == "__main__":
    main()
