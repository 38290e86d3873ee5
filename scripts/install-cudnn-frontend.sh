#!/usr/bin/env bash
# Fetches the header-only cuDNN frontend C++ API (PyPI `nvidia-cudnn-frontend`)
# into <repo>/.deps/cudnn-frontend/include, where tensor/CMakeLists.txt looks
# for cudnn_frontend.h. Only the headers are used: nothing Python is installed.
# Idempotent and quiet when the headers are already there; does nothing when
# there is no CUDA toolkit (the build is CPU-only then).
#   MPITRON_CUDNN_FRONTEND_VERSION=1.x.y   pin a version (default: newest)
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
dest="$repo/.deps/cudnn-frontend/include"

if [ -f "$dest/cudnn_frontend.h" ]; then exit 0; fi
if ! command -v nvcc >/dev/null 2>&1 && [ ! -x /usr/local/cuda/bin/nvcc ]; then exit 0; fi

py=""
for c in python3 python; do
  if command -v "$c" >/dev/null 2>&1 && "$c" -m pip --version >/dev/null 2>&1; then py="$c"; break; fi
done
if [ -z "$py" ]; then
  echo "install-cudnn-frontend: no python with pip; attention will use the cuBLAS fallback" >&2
  exit 0
fi

spec="nvidia-cudnn-frontend"
[ -n "${MPITRON_CUDNN_FRONTEND_VERSION:-}" ] && spec="nvidia-cudnn-frontend==${MPITRON_CUDNN_FRONTEND_VERSION}"

tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
echo "install-cudnn-frontend: downloading $spec (headers only)"
# The wheels are per Python version/platform but the headers inside are the same;
# prefer a binary wheel, fall back to the sdist (which also carries include/).
if ! "$py" -m pip download -q --no-deps --only-binary=:all: -d "$tmp" "$spec" 2>/dev/null; then
  "$py" -m pip download -q --no-deps --no-binary=:all: -d "$tmp" "$spec"
fi

"$py" - "$tmp" "$dest" <<'PY'
import os, sys, tarfile, zipfile, shutil
src, dest = sys.argv[1], sys.argv[2]
stage = os.path.join(src, "x")
for f in os.listdir(src):
    p = os.path.join(src, f)
    if f.endswith(".whl") or f.endswith(".zip"):
        zipfile.ZipFile(p).extractall(stage)
    elif f.endswith(".tar.gz"):
        with tarfile.open(p) as t:
            t.extractall(stage)
# Find the directory holding cudnn_frontend.h (cudnn_frontend/include in wheels, include/ in sdists).
hit = None
for root, _, files in os.walk(stage):
    if "cudnn_frontend.h" in files:
        if hit is None or len(root) < len(hit):
            hit = root
if hit is None:
    sys.exit("install-cudnn-frontend: cudnn_frontend.h not found in the download")
tmpdest = dest + ".tmp"
shutil.rmtree(tmpdest, ignore_errors=True)
shutil.copytree(hit, tmpdest)
shutil.rmtree(dest, ignore_errors=True)
os.makedirs(os.path.dirname(dest), exist_ok=True)
os.rename(tmpdest, dest)
PY
echo "install-cudnn-frontend: headers in $dest"
