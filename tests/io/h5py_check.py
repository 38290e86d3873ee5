#!/usr/bin/env python3
"""h5py reads an mpitron checkpoint: every tensor, its values, its checksum.

usage: h5py_check.py CHECKPOINT.h5 EXPECTED.json

EXPECTED.json maps dataset name -> {"dtype": "f32"|"bf16"|..., "shape": [...],
"values": [...]} (values row-major, bf16/f16 as the floats they encode).
Checks, independently of mpitron's C++ code: the root attributes, that h5py
lists exactly these datasets, their shapes and values, and the CRC-32C of
each dataset's raw little-endian row-major bytes against its mpitron_crc32c
attribute (recomputed here in pure Python). Exit 77 when h5py is missing.
"""
import json
import sys

try:
    import h5py
    import numpy as np
except ImportError as e:  # the C++ test reports SKIPPED
    print(f"h5py_check: {e}")
    sys.exit(77)


def crc32c(data: bytes) -> int:
    table = []
    for b in range(256):
        c = b
        for _ in range(8):
            c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
        table.append(c)
    crc = 0xFFFFFFFF
    for byte in data:
        crc = (crc >> 8) ^ table[(crc ^ byte) & 0xFF]
    return crc ^ 0xFFFFFFFF


def as_text(v):
    return v.decode() if isinstance(v, bytes) else str(v)


def main():
    path, expected_path = sys.argv[1], sys.argv[2]
    with open(expected_path) as f:
        expected = json.load(f)
    failures = []
    with h5py.File(path, "r") as f:
        if as_text(f.attrs["format"]) != "mpitron-ckpt":
            failures.append(f"format attribute is {f.attrs['format']!r}")
        if int(f.attrs["version"]) != 1:
            failures.append(f"version attribute is {f.attrs['version']!r}")
        names = []
        f.visititems(lambda n, o: names.append(n) if isinstance(o, h5py.Dataset) else None)
        if sorted(names) != sorted(expected):
            failures.append(f"datasets {sorted(names)} != expected {sorted(expected)}")
        for name, want in expected.items():
            if name not in f:
                continue
            ds = f[name]
            raw = ds[()]
            if list(ds.shape) != want["shape"]:
                failures.append(f"{name}: shape {ds.shape} != {want['shape']}")
                continue
            tag = as_text(ds.attrs["mpitron_dtype"]) if "mpitron_dtype" in ds.attrs else None
            dtype = want["dtype"]
            if dtype == "bf16":
                vals = (np.asarray(raw).astype(np.uint32) << 16).view(np.float32)
            elif dtype == "f16":
                vals = np.asarray(raw).view(np.float16).astype(np.float32)
            else:
                vals = np.asarray(raw)
            if (tag or None) != (dtype if dtype in ("bf16", "f16") else None):
                failures.append(f"{name}: mpitron_dtype attribute {tag!r} for dtype {dtype}")
            want_vals = np.asarray(want["values"], dtype=vals.dtype).reshape(want["shape"])
            if not np.array_equal(vals, want_vals):
                failures.append(f"{name}: values differ: {vals.ravel()[:8]} vs {want_vals.ravel()[:8]}")
            le = np.ascontiguousarray(raw).astype(np.asarray(raw).dtype.newbyteorder("<"))
            crc = crc32c(le.tobytes())
            if crc != int(ds.attrs["mpitron_crc32c"]):
                failures.append(f"{name}: crc32c {crc:#010x} != attribute {int(ds.attrs['mpitron_crc32c']):#010x}")
            if int(ds.attrs["mpitron_nbytes"]) != le.nbytes:
                failures.append(f"{name}: mpitron_nbytes {int(ds.attrs['mpitron_nbytes'])} != {le.nbytes}")
    for msg in failures:
        print("h5py_check FAIL:", msg)
    if not failures:
        print(f"h5py_check: {len(expected)} datasets OK in {path}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
