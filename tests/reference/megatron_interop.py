#!/usr/bin/env python3
"""Interop between mpitron's .bin/.idx and megatron-core's IndexedDataset.

1. Writes, with megatron-core's IndexedDatasetBuilder, one small dataset per
   dtype code (tests/data/interop/mcore_<dtype>.bin/.idx) from the documents in
   DOCS below, plus mcore_merged (add_index of mcore_uint16 twice), and the
   documents themselves as interop_manifest.json.
2. Reads mpitron's files tests/data/interop/ours_<dtype> (written by
   `MPITRON_WRITE_INTEROP=1 build/tests/data_test_indexed_dataset`) with
   megatron-core's IndexedDataset and checks every sequence, the document
   indices and the dtype against the manifest, and that ours_* are
   byte-identical to mcore_*. Prints one line per file and "ALL OK".

tests/data/test_indexed_dataset.cpp then reads mcore_* token for token and
checks that mpitron's writer reproduces them (and ours_*) byte for byte.

How it was run (megatron-core 0.16.1 needs torch; Debian's python3-torch 1.13
is too old for `import megatron.core`, so the package __init__ is bypassed and
only megatron/core/datasets/indexed_dataset.py is loaded):
  apt-get install -y python3-torch
  /usr/bin/python3 -m pip install --break-system-packages --no-deps megatron-core
  /usr/bin/python3 tests/reference/megatron_interop.py   # writes mcore_*, manifest
  cmake --build build --target data_test_indexed_dataset
  (cd build && MPITRON_WRITE_INTEROP=1 ./tests/data_test_indexed_dataset)   # writes ours_*
  /usr/bin/python3 tests/reference/megatron_interop.py   # reads ours_*: prints ALL OK
"""
import json
import logging
import os
import sys
import types

import numpy as np

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
OUT = os.path.join(ROOT, "tests", "data", "interop")

# name -> (numpy dtype, documents: list of documents, each a list of sequences)
DOCS = {
    "uint8": (np.uint8, [[[0, 1, 255]], [[7], [8, 9]], [], [[200, 100, 50, 25]]]),
    "int8": (np.int8, [[[-128, 0, 127]], [], [[5, -5], [1]], [[-1]]]),
    "int16": (np.int16, [[[-32768, 32767, 0, 1]], [[2, -3]], [[]]]),
    "int32": (np.int32, [[[-2147483648, 2147483647]], [[50256, 0, 1, 2]], [], [[9, 8], [7]]]),
    "int64": (np.int64, [[[-9223372036854775808, 9223372036854775807, 3]], [[1 << 40]], []]),
    "float64": (np.float64, [[[1.5, -2.25, 1e300]], [[0.1, 3.0]], []]),
    "float32": (np.float32, [[[0.5, -3.75, 3.0e38]], [], [[0.1, 2.0], [1.0]]]),
    "uint16": (np.uint16, [[[15496, 995, 50256]], [[464, 2068, 7586, 21831, 50256], [11, 50256]], [],
                            [[65535, 0]], [[1, 2, 3, 4, 5, 6, 7]]]),
}


def import_indexed_dataset():
    """Loads megatron/core/datasets/indexed_dataset.py without megatron.core's __init__."""
    import megatron
    base = list(megatron.__path__)[0]
    for name, sub in [("megatron.core", "core"), ("megatron.core.datasets", "core/datasets")]:
        mod = types.ModuleType(name)
        mod.__path__ = [os.path.join(base, sub)]
        sys.modules[name] = mod
    try:
        import megatron.core.utils  # noqa: F401
    except Exception:
        utils = types.ModuleType("megatron.core.utils")
        utils.log_single_rank = lambda logger, level, *a, **k: logger.log(level, *a, **k)
        sys.modules["megatron.core.utils"] = utils
    import megatron.core.datasets.indexed_dataset as idx
    return idx


def masked_samples(cls, config, ds, sample_index, keep):
    """The first `keep` samples of a megatron-core MaskedWordPieceDataset subclass (BERT, T5), its
    __getitem__ run on an object made without __init__, the attributes set as __init__ would."""
    obj = cls.__new__(cls)
    obj.config, obj.dataset, obj.sample_index = config, ds, sample_index
    obj.token_lookup = list(config.tokenizer.inv_vocab.keys())
    obj._pad_token_id = config.tokenizer.pad
    samples = []
    for i in range(min(keep, len(sample_index))):
        s = obj[i]
        samples.append({k: (v.tolist() if isinstance(v, np.ndarray) else int(v)) for k, v in s.items()})
    return samples


def write_mcore(idx, torch):
    manifest = {}
    for name, (dt, docs) in DOCS.items():
        prefix = os.path.join(OUT, f"mcore_{name}")
        b = idx.IndexedDatasetBuilder(prefix + ".bin", dtype=dt)
        for k, doc in enumerate(docs):
            if k % 2 == 0:  # add_document path
                flat = [v for seq in doc for v in seq]
                b.add_document(np.array(flat, dtype=dt), [len(s) for s in doc])
            else:           # add_item + end_document path
                for seq in doc:
                    b.add_item(torch.from_numpy(np.array(seq, dtype=dt).astype(
                        np.int32 if dt == np.uint16 else dt)))
                b.end_document()
        b.finalize(prefix + ".idx")
        manifest[name] = {"code": idx.DType.code_from_dtype(dt),
                          "documents": [[np.array(s, dtype=dt).tolist() for s in d] for d in docs]}
    b = idx.IndexedDatasetBuilder(os.path.join(OUT, "mcore_merged.bin"), dtype=np.uint16)
    b.add_index(os.path.join(OUT, "mcore_uint16"))
    b.add_index(os.path.join(OUT, "mcore_uint16"))
    b.finalize(os.path.join(OUT, "mcore_merged.idx"))
    with open(os.path.join(OUT, "interop_manifest.json"), "w") as f:
        json.dump(manifest, f, indent=1)
        f.write("\n")
    return manifest


def check(idx, prefix, name, spec):
    dt, _ = DOCS[name]
    ds = idx.IndexedDataset(prefix)
    assert ds.index.dtype == dt, (prefix, ds.index.dtype)
    seqs = [s for d in spec["documents"] for s in d]
    assert len(ds) == len(seqs), (prefix, len(ds), len(seqs))
    for i, s in enumerate(seqs):
        got = ds[i]
        assert got.dtype == dt and got.tolist() == np.array(s, dtype=dt).tolist(), (prefix, i, got, s)
    doc_idx = np.cumsum([0] + [len(d) for d in spec["documents"]]).tolist()
    assert ds.document_indices.tolist() == doc_idx, (prefix, ds.document_indices, doc_idx)


def main():
    logging.basicConfig(level=logging.WARNING)
    import torch
    idx = import_indexed_dataset()
    os.makedirs(OUT, exist_ok=True)
    manifest = write_mcore(idx, torch)
    ok = True
    for name, spec in manifest.items():
        check(idx, os.path.join(OUT, f"mcore_{name}"), name, spec)
        ours = os.path.join(OUT, f"ours_{name}")
        if not os.path.exists(ours + ".idx"):
            print(f"{name}: mcore written; ours_{name} missing (run the C++ test with MPITRON_WRITE_INTEROP=1)")
            ok = False
            continue
        check(idx, ours, name, spec)
        same = all(open(ours + ext, "rb").read() == open(os.path.join(OUT, f"mcore_{name}") + ext, "rb").read()
                   for ext in (".bin", ".idx"))
        print(f"{name}: megatron-core reads ours_{name} token for token; byte-identical to mcore_{name}: {same}")
        ok = ok and same
    print("ALL OK" if ok else "FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
