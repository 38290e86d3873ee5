#!/usr/bin/env python3
"""Reference GPT dataset indices for tests/data/test_gpt_dataset.cpp.

Re-states megatron-core's algorithm (megatron/core/datasets/gpt_dataset.py:
_build_document_sample_shuffle_indices, _build_document_index,
_build_shuffle_index, _get_num_epochs; helpers.cpp build_sample_idx with
add_extra_token_to_sequence=1, drop_last_partial_sequence=True;
utils.py/blended_megatron_dataset_builder.py: split parsing and
_get_split_indices) with numpy, using numpy.random.RandomState(seed) exactly as
Megatron does, and writes tests/data/ref/gpt_dataset_ref.json:
  rng:    raw MT19937 draws, bounded draws (32- and 64-bit paths) and shuffles
          of RandomState(seed) — checks NumpyRandomState bit for bit;
  splits: split string + document count → document bounds;
  cases:  document lengths, split range, seq_length, num_samples, seed →
          doc_idx, sample_idx, shuffle_idx.

Also: blending (helpers.cpp build_blending_indices) for a few weight vectors,
and split bounds under both rules (megatron-core's cumulative bookends, and the
legacy Megatron-DeepSpeed rule as bounds_legacy).

Run (any python3 with numpy): python3 tests/reference/gpt_dataset_ref.py
With --megatron the port is also asserted equal to megatron-core's own
functions (gpt_dataset._build_document_index/_build_shuffle_index, the
compiled helpers.build_sample_idx/build_blending_indices, the split matrix);
this was run as:
  /usr/bin/python3 tests/reference/gpt_dataset_ref.py --megatron
(Debian python3-torch + numpy 1.24, megatron-core 0.16.1; see requirements.txt).
"""
import json
import os
import re
import sys

import numpy

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
OUT = os.path.join(ROOT, "tests", "data", "ref", "gpt_dataset_ref.json")


def parse_and_normalize_split(split):
    split = list(map(float, re.findall(r"[.0-9]+", split)))
    split = split + [0.0 for _ in range(3 - len(split))]
    return list(map(lambda _: _ / sum(split), split))


def core_split_bounds(split, n):
    """megatron-core: cumulative bookends, [round(c[k]·n), round(c[k+1]·n)); None → empty."""
    w = parse_and_normalize_split(split)
    c = [0]
    for x in w:
        c.append(c[-1] + x)
    return [[int(round(c[k] * float(n))), int(round(c[k + 1] * float(n)))] if w[k] > 0
            else [int(round(c[k + 1] * float(n)))] * 2 for k in range(3)]


def blending_indices(weights, size):
    """helpers.cpp build_blending_indices (weights normalised)."""
    w = numpy.array(weights, dtype=numpy.float64)
    w = w / w.sum()
    count = [0] * len(w)
    di, dsi = [], []
    for k in range(size):
        kk = max(float(k), 1.0)
        best, err = 0, w[0] * kk - count[0]
        for d in range(1, len(w)):
            e = w[d] * kk - count[d]
            if e > err:
                best, err = d, e
        di.append(best)
        dsi.append(count[best])
        count[best] += 1
    return di, dsi


def megatron_cross_check(ref, sizes):
    """Compares the port above with megatron-core's own functions (needs megatron-core + torch)."""
    import sys as _sys
    import types
    import megatron
    base = list(megatron.__path__)[0]
    for name, sub in [("megatron.core", "core"), ("megatron.core.datasets", "core/datasets")]:
        mod = types.ModuleType(name)
        mod.__path__ = [os.path.join(base, sub)]
        _sys.modules[name] = mod
    utils = types.ModuleType("megatron.core.utils")
    utils.log_single_rank = lambda logger, level, *a, **k: logger.log(level, *a, **k)
    _sys.modules["megatron.core.utils"] = utils
    from megatron.core.datasets import gpt_dataset, helpers
    from megatron.core.datasets.blended_megatron_dataset_config import (
        convert_split_vector_to_split_matrix, parse_and_normalize_split as mc_parse)
    for s in ref["splits"]:
        m = convert_split_vector_to_split_matrix(mc_parse(s["split"]))
        n = float(s["num_documents"])
        for k in range(3):
            if m[k] is None:
                assert s["bounds"][k][0] == s["bounds"][k][1], s
            else:
                assert s["bounds"][k] == [int(round(m[k][0] * n)), int(round(m[k][1] * n))], s
    for c in ref["cases"]:
        rs = numpy.random.RandomState(c["seed"])
        docs = numpy.arange(c["begin"], c["end"], dtype=numpy.int32)
        d = gpt_dataset._build_document_index(docs, c["num_epochs"], rs, c["separate_final_epoch"])
        assert d.tolist() == c["doc_idx"], "doc_idx"
        tpe = int(numpy.sum(sizes[docs]))
        si = helpers.build_sample_idx(sizes, d, c["seq_length"], c["num_epochs"], tpe, True, True)
        assert si.reshape(-1).tolist() == c["sample_idx"], "sample_idx"
        n = si.shape[0] - 1
        first = ((c["num_epochs"] - 1) * tpe - 1) // c["seq_length"] if c["separate_final_epoch"] else n
        sh = gpt_dataset._build_shuffle_index(first, n, rs)
        assert sh.tolist() == c["shuffle_idx"], "shuffle_idx"
    for b in ref["blending"]:
        di = numpy.zeros(b["size"], dtype=numpy.int16)
        dsi = numpy.zeros(b["size"], dtype=numpy.int64)
        w = (numpy.array(b["weights"]) / numpy.sum(b["weights"])).tolist()
        helpers.build_blending_indices(di, dsi, w, len(w), b["size"], False)
        assert di.tolist() == b["dataset_index"] and dsi.tolist() == b["dataset_sample_index"], b["weights"]
    print("megatron-core cross-check: splits, doc_idx, sample_idx, shuffle_idx, blending all equal")


def get_split_indices(split, num_elements):
    idx = [0]
    for pct in split:
        idx.append(idx[-1] + int(round(pct * float(num_elements))))
    idx[1:] = list(map(lambda _: _ - (idx[-1] - num_elements), idx[1:]))
    return idx


def build_document_index(documents, num_epochs, rs, separate_final_epoch):
    if not separate_final_epoch or num_epochs == 1:
        d = numpy.mgrid[0:num_epochs, 0:len(documents)][1]
        d[:] = documents
        d = d.reshape(-1).astype(numpy.int32)
        rs.shuffle(d)
        return d
    first = build_document_index(documents, num_epochs - 1, rs, False)
    last = build_document_index(documents, 1, rs, False)
    return numpy.concatenate((first, last))


def build_shuffle_index(num_samples, total_size, rs):
    dtype_ = numpy.uint32 if total_size < numpy.iinfo(numpy.uint32).max - 1 else numpy.int64
    first = numpy.arange(0, num_samples, 1, dtype=dtype_)
    rs.shuffle(first)
    if num_samples == total_size:
        return first
    last = numpy.arange(num_samples, total_size, 1, dtype=dtype_)
    rs.shuffle(last)
    return numpy.concatenate((first, last))


def build_sample_idx(sizes, doc_idx, seq_length, num_epochs, tokens_per_epoch, extra=1):
    num_samples = (num_epochs * tokens_per_epoch - extra) // seq_length
    out = numpy.zeros((num_samples + 1, 2), dtype=numpy.int64)
    di, off, s = 0, 0, 1
    while s <= num_samples:
        remaining = seq_length + extra
        while remaining != 0:
            doc_len = int(sizes[doc_idx[di]]) - off
            remaining -= doc_len
            if remaining <= 0:
                off += remaining + doc_len - extra
                remaining = 0
            else:
                if di == len(doc_idx) - 1:
                    assert s == num_samples
                    off = int(sizes[doc_idx[di]]) - extra
                    break
                di += 1
                off = 0
        out[s] = (di, off)
        s += 1
    return out


def build_indices(sizes, begin, end, seq_length, num_samples, seed):
    documents = numpy.arange(begin, end, dtype=numpy.int32)
    tokens_per_epoch = int(numpy.sum(sizes[documents]))
    num_epochs, tokens = 1, tokens_per_epoch
    if num_samples:
        while tokens < num_samples * seq_length + 1:
            num_epochs += 1
            tokens += tokens_per_epoch
    separate = False
    if num_epochs > 1:
        sans = ((num_epochs - 1) * tokens_per_epoch - 1) // seq_length
        from_final = num_samples - sans
        per_epoch = (tokens_per_epoch - 1) // seq_length
        separate = from_final < int(0.80 * per_epoch)
    rs = numpy.random.RandomState(seed)
    doc_idx = build_document_index(documents, num_epochs, rs, separate)
    sample_idx = build_sample_idx(sizes, doc_idx, seq_length, num_epochs, tokens_per_epoch)
    n = sample_idx.shape[0] - 1
    shuffle = build_shuffle_index(sans if separate else n, n, rs)
    return dict(num_epochs=num_epochs, separate_final_epoch=separate, doc_idx=doc_idx.tolist(),
                sample_idx=sample_idx.reshape(-1).tolist(), shuffle_idx=shuffle.tolist())


def main():
    ref = {"numpy_version": numpy.__version__}
    rng = []
    for seed in (0, 1234, 4294967295):
        rs = numpy.random.RandomState(seed)
        raw = rs.randint(0, 2 ** 32, size=1300, dtype=numpy.uint64).tolist()   # > 2 refills of 624
        rs = numpy.random.RandomState(seed)
        b32 = [int(rs.randint(0, m + 1, dtype=numpy.uint64)) for m in (1, 2, 6, 1000, 2 ** 31 + 5)]
        b64 = [int(rs.randint(0, m + 1, dtype=numpy.uint64)) for m in (2 ** 32, 2 ** 40 + 3, 2 ** 63 - 1)]
        rs = numpy.random.RandomState(seed)
        shuffles = []
        for n in (1, 2, 10, 1000):
            a = numpy.arange(n, dtype=numpy.int64)
            rs.shuffle(a)
            shuffles.append(a.tolist())
        rng.append(dict(seed=seed, raw=raw, bounded32=b32, bounded64=b64, shuffles=shuffles))
    ref["rng"] = rng

    splits = []
    for split, n in [("969,30,1", 1000), ("969,30,1", 17), ("969,30,1", 3), ("50,50", 5), ("1,1,1", 10),
                     ("98/2/0", 12345), ("100", 7), ("0.8 0.1 0.1", 25), ("1,1,2", 2), ("3,3,2", 4)]:
        legacy = get_split_indices(parse_and_normalize_split(split), n)
        splits.append(dict(split=split, num_documents=n, bounds=core_split_bounds(split, n),
                           bounds_legacy=[[legacy[k], legacy[k + 1]] for k in range(3)]))
    ref["splits"] = splits

    rs = numpy.random.RandomState(7)
    sizes = rs.randint(1, 60, size=40).astype(numpy.int32)
    total = int(sizes.sum())
    cases = []
    for (begin, end, seq, samples, seed) in [
        (0, 40, 16, 0, 1234),                       # one epoch
        (0, 40, 16, (2 * total) // 16 + 1, 1234),   # 3 epochs, tiny last one: separate shuffle
        (0, 40, 16, (3 * total - 1) // 16, 1234),   # 3 full epochs: one shuffle
        (5, 31, 32, 200, 42),                       # a split range, several epochs
        (0, 40, 100, 50, 0),                        # samples longer than most documents
        (10, 12, 8, 40, 3),                         # two documents, many epochs
    ]:
        c = dict(begin=begin, end=end, seq_length=seq, num_samples=samples, seed=seed)
        c.update(build_indices(sizes, begin, end, seq, samples, seed))
        cases.append(c)
    ref["doc_lengths"] = sizes.tolist()
    ref["cases"] = cases
    ref["blending"] = []
    for weights, size in [([0.3, 0.7], 10), ([0.2, 0.3, 0.5], 1000), ([1, 1], 4), ([0.05, 0.9, 0.05], 333)]:
        di, dsi = blending_indices(weights, size)
        ref["blending"].append(dict(weights=weights, size=size, dataset_index=di, dataset_sample_index=dsi))
    if "--megatron" in sys.argv:
        megatron_cross_check(ref, sizes)
    with open(OUT, "w") as f:
        json.dump(ref, f, separators=(",", ":"))
        f.write("\n")
    print(f"wrote {OUT} ({os.path.getsize(OUT)} bytes): {len(cases)} index cases, {len(splits)} splits, "
          f"numpy {numpy.__version__}")


if __name__ == "__main__":
    main()
