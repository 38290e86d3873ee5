#!/usr/bin/env python3
"""TensorBoard's own reader parses an mpitron event file.

usage: tb_check.py LOGDIR EXPECTED.json
EXPECTED.json maps tag -> [[step, value], ...]. Exit 77 when tensorboard is
not importable (install: pip install --break-system-packages tensorboard).
"""
import json
import sys

try:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
except ImportError as e:
    print(f"tb_check: {e}")
    sys.exit(77)


def main():
    logdir, expected_path = sys.argv[1], sys.argv[2]
    with open(expected_path) as f:
        expected = json.load(f)
    acc = EventAccumulator(logdir, size_guidance={"scalars": 0})
    acc.Reload()
    failures = []
    tags = sorted(acc.Tags()["scalars"])
    if tags != sorted(expected):
        failures.append(f"scalar tags {tags} != {sorted(expected)}")
    for tag, points in expected.items():
        if tag not in tags:
            continue
        got = [(e.step, e.value) for e in acc.Scalars(tag)]
        want = [(int(s), float(v)) for s, v in points]
        if len(got) != len(want):
            failures.append(f"{tag}: {len(got)} events, expected {len(want)}")
            continue
        for (gs, gv), (ws, wv) in zip(got, want):
            # values are stored as float32
            if gs != ws or abs(gv - wv) > 1e-6 * max(1.0, abs(wv)):
                failures.append(f"{tag}: got step {gs} value {gv}, expected step {ws} value {wv}")
        if any(e.wall_time < 1.5e9 for e in acc.Scalars(tag)):
            failures.append(f"{tag}: implausible wall_time")
    for msg in failures:
        print("tb_check FAIL:", msg)
    if not failures:
        print(f"tb_check: {len(expected)} tags OK in {logdir}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
