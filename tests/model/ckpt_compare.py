#!/usr/bin/env python3
"""h5py compares two mpitron checkpoints tensor by tensor.

usage: ckpt_compare.py PARALLEL.h5 SINGLE.h5

PARALLEL.h5 was written collectively by several ranks (tensor/pipeline/data
parallel, each rank its hyperslabs); SINGLE.h5 by one process after the same
training steps. Checks, with h5py only: both hold exactly the same datasets
with the same global shapes; every dataset of PARALLEL.h5 has the CRC-32C of
its bytes (recomputed here) in its mpitron_crc32c attribute; values agree
within fp32 reduction-order noise (rtol 1e-4, atol 1e-5 of the tensor's
largest magnitude, plus 2e-6 for weights). Exit 77 when h5py is missing.
"""
import sys

try:
    import h5py
    import numpy as np
except ImportError as e:
    print(f"ckpt_compare: {e}")
    sys.exit(77)

TABLE = []
for b in range(256):
    c = b
    for _ in range(8):
        c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
    TABLE.append(c)


def crc32c(data: bytes) -> int:
    crc = 0xFFFFFFFF
    t = TABLE
    for byte in data:
        crc = (crc >> 8) ^ t[(crc ^ byte) & 0xFF]
    return crc ^ 0xFFFFFFFF


def datasets(f):
    names = []
    f.visititems(lambda n, o: names.append(n) if isinstance(o, h5py.Dataset) else None)
    return sorted(names)


def main():
    a_path, b_path = sys.argv[1], sys.argv[2]
    failures = []
    with h5py.File(a_path, "r") as a, h5py.File(b_path, "r") as b:
        na, nb = datasets(a), datasets(b)
        if na != nb:
            failures.append(f"dataset lists differ: only in parallel {sorted(set(na) - set(nb))[:5]}, "
                            f"only in single {sorted(set(nb) - set(na))[:5]}")
        for name in nb:
            if name not in a:
                continue
            x, y = np.asarray(a[name][()]), np.asarray(b[name][()])
            if x.shape != y.shape:
                failures.append(f"{name}: shape {x.shape} vs {y.shape}")
                continue
            raw = np.ascontiguousarray(x).astype(x.dtype.newbyteorder("<")).tobytes()
            if crc32c(raw) != int(a[name].attrs["mpitron_crc32c"]):
                failures.append(f"{name}: crc32c does not match its attribute")
            scale = float(np.max(np.abs(y))) if y.size else 0.0
            # Weights: an absolute floor of 2e-6 (the attention key bias has an exactly
            # zero gradient, so Adam moves it by reduction-order noise alone).
            floor = 2e-6 if name.startswith("model/") else 1e-12
            if not np.allclose(x, y, rtol=1e-4, atol=1e-5 * scale + floor):
                i = int(np.argmax(np.abs(x - y)))
                failures.append(f"{name}: values differ, worst element {i}: {x.ravel()[i]} vs {y.ravel()[i]}")
        print(f"ckpt_compare: {len(nb)} datasets compared")
    for f in failures[:20]:
        print("ckpt_compare:", f)
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
