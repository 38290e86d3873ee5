#!/bin/bash
# bench/build_baseline_server.sh — builds text_generation_server as it was at an older commit
# (default ce51f6e: its own HTTP/1.1 loop, one request at a time, before the dynamic engine), for
# bench_serve.py --baseline-server. A temporary git worktree, a CPU-only build of that one target
# (ccache makes it quick when the tree was built before), the binary copied out, the worktree removed.
#   bench/build_baseline_server.sh [COMMIT] [OUT_DIR]      → OUT_DIR/text_generation_server
set -euo pipefail
COMMIT=${1:-ce51f6e}
OUT=${2:-/tmp/mpitron_baseline_server}
SRC=$(cd "$(dirname "$0")/.." && pwd)
TREE=$(mktemp -d /tmp/mpitron_baseline_tree.XXXXXX)
cleanup() { git -C "$SRC" worktree remove --force "$TREE" >/dev/null 2>&1 || rm -rf "$TREE"; }
trap cleanup EXIT
git -C "$SRC" worktree add --detach "$TREE" "$COMMIT" >/dev/null
[ -e "$SRC/.deps" ] && ln -s "$(readlink -f "$SRC/.deps")" "$TREE/.deps"
export CCACHE_BASEDIR=$TREE
cmake -S "$TREE" -B "$TREE/build" -G Ninja -DMPITRON_CUDA=OFF >/dev/null
ninja -C "$TREE/build" -j"$(nproc)" text_generation_server >/dev/null
mkdir -p "$OUT"
cp "$TREE/build/apps/text_generation_server" "$OUT/"
echo "$OUT/text_generation_server (commit $(git -C "$TREE" rev-parse --short HEAD))"
