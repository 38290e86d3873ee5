#!/usr/bin/env python3
"""tests/cuda_sim/convert_launches.py FILE... — rewrites `kernel<<<g, b, s, st>>>(args)`
launch sites into `MPT_LAUNCH(g, b, s, st, kernel)(args)` (common.cuh), the form both
nvcc and the simulated device (tests/cuda_sim) build. Missing shmem/stream become
0/nullptr. A one-off helper for merging kernels written with <<<>>>; review the diff."""
import re
import sys

PAT = re.compile(r'([A-Za-z_][A-Za-z0-9_:]*(?:<[^;{}()<>]*>)?)(\s*)<<<(.*?)>>>\(', re.S)


def split_top(x):
    out, depth, cur = [], 0, ''
    for c in x:
        depth += c in '(['
        depth -= c in ')]'
        if c == ',' and depth == 0:
            out.append(cur)
            cur = ''
        else:
            cur += c
    return out + [cur]


def rewrite(text):
    def rep(m):
        cfg = [c.strip() for c in split_top(m.group(3))]
        cfg += ['0', 'nullptr'][len(cfg) - 2:] if len(cfg) < 4 else []
        return 'MPT_LAUNCH(%s, %s)(' % (', '.join(cfg), m.group(1))
    return PAT.subn(rep, text)


for path in sys.argv[1:]:
    src = open(path).read()
    out, n = rewrite(src)
    if n:
        open(path, 'w').write(out)
    print(f'{path}: {n} launch site(s) rewritten')
