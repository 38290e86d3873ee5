#!/usr/bin/python3
"""T5 span-corruption samples from megatron-core's own code, for tests/data/test_t5_dataset.cpp.

Reads the sentence-level dataset tests/data/ref/bert_ds/wiki_text_sentence.{bin,idx} (written by
bert_dataset_ref.py) and its vocabulary; writes tests/data/ref/t5_dataset_ref.json: for a few
configs, the sample index of megatron-core's compiled helpers.build_mapping (targets of
encoder length − 2, runs of ≥ 1 sentence) and the first samples of
T5MaskedWordPieceDataset.__getitem__ (text_enc, text_dec, labels, loss_mask, enc_mask,
dec_mask, truncated) with pretrain_t5.py's masking settings (max n-gram 10, whole words,
geometric n-gram lengths, no permutation) and Megatron's BertWordPieceLowerCase with
--vocab-extra-ids 100: vocab.txt + [BOS] [EOS] + <extra_id_0..99>.
megatron-core's module files are loaded without megatron.core's __init__ (see
megatron_interop.py); __getitem__ runs on an object made without __init__, its attributes set
as MaskedWordPieceDataset.__init__ would set them. Run from the repo root:
  /usr/bin/python3 tests/reference/t5_dataset_ref.py
"""
import json
import os
import sys
import types

import numpy as np

sys.path.insert(0, os.path.dirname(__file__))
from megatron_interop import import_indexed_dataset, masked_samples, ROOT  # noqa: E402

REF = os.path.join(ROOT, "tests", "data", "ref")
VOCAB = os.path.join(REF, "bert_uncased", "vocab.txt")
PREFIX = os.path.join(REF, "bert_ds", "wiki_text_sentence")
EXTRA_IDS = 100

CONFIGS = [  # name, encoder length, decoder length, seed, num_samples, short_seq_prob, mask_prob, samples kept
    ("enc128_dec64", 128, 64, 1234, 80, 0.1, 0.15, 40),
    ("enc64_dec32", 64, 32, 7, 120, 0.1, 0.15, 40),
    ("enc32_dec24_short", 32, 24, 99, 150, 0.3, 0.25, 40),
]


def main():
    idx = import_indexed_dataset()
    utils = sys.modules["megatron.core.utils"]
    if not hasattr(utils, "get_te_version"):  # only the attention-mask helper reads it, never __getitem__
        utils.get_te_version = lambda: None
    import megatron.core.datasets.t5_dataset as td
    from megatron.core.datasets import helpers

    ds = idx.IndexedDataset(PREFIX)
    vocab = [l.rstrip("\n") for l in open(VOCAB, encoding="utf-8")] + ["[BOS]", "[EOS]"]  # Megatron's add_token
    vocab += ["<extra_id_{}>".format(i) for i in range(EXTRA_IDS)]
    inv_vocab = dict(enumerate(vocab))
    tokenizer = types.SimpleNamespace(
        cls=vocab.index("[CLS]"), sep=vocab.index("[SEP]"), mask=vocab.index("[MASK]"), pad=vocab.index("[PAD]"),
        bos=vocab.index("[BOS]"), eos=vocab.index("[EOS]"), inv_vocab=inv_vocab,
        additional_special_tokens_ids=[vocab.index("<extra_id_{}>".format(i)) for i in range(EXTRA_IDS)])
    out = {"vocab_size": len(vocab), "extra_ids": EXTRA_IDS, "configs": []}
    for name, enc, dec, seed, nsamples, short_p, mask_p, keep in CONFIGS:
        config = types.SimpleNamespace(
            random_seed=seed, sequence_length=enc, sequence_length_encoder=enc, sequence_length_decoder=dec,
            tokenizer=tokenizer, masking_probability=mask_p, short_sequence_probability=short_p,
            masking_max_ngram=10, masking_do_full_word=True, masking_do_permutation=False,
            masking_use_longer_ngrams=False, masking_use_geometric_distribution=True)
        sample_index = helpers.build_mapping(ds.document_indices, ds.sequence_lengths, np.iinfo(np.int32).max - 1,
                                             nsamples, enc - 2, short_p, seed, False, 1)
        samples = masked_samples(td.T5MaskedWordPieceDataset, config, ds, sample_index, keep)
        out["configs"].append({"name": name, "encoder_seq_length": enc, "decoder_seq_length": dec, "seed": seed,
                               "num_samples": nsamples, "short_seq_prob": short_p, "mask_prob": mask_p,
                               "sample_index": np.asarray(sample_index).tolist(), "samples": samples})
        print(name, "rows", len(sample_index), "samples", len(samples))
    with open(os.path.join(REF, "t5_dataset_ref.json"), "w") as f:
        json.dump(out, f, separators=(",", ":"))


if __name__ == "__main__":
    main()
