#!/usr/bin/env bash
# tools/prepare_llmc.sh — runs HERE (the CPU machine, with the CUDA toolkit): builds the llm.c peer
# (karpathy/llm.c, a separate public project; never copied into mpitron) for the GPU machine, which
# cannot fetch anything. tools/gpu_check.sh runs it through bench/peers/llmc_gpt.py.
#
#   LLMC_SRC=/path/to/llm.c tools/prepare_llmc.sh
#
# LLMC_SRC: a clone of https://github.com/karpathy/llm.c (a checkout, or a bare/mirror git directory,
# whose HEAD is exported). Default: /work/.mirror/karpathy+llm.c/repo, where the tool library's fetch
# puts it.
#
# Makes (both ignored by git, /build*/):
#   build-llmc-src/   llm.c's source and objects (not carried)
#   build-llmc/       what is carried to the GPU machine (about 4 MiB):
#     train_gpt2cu                 llm.c's bf16 trainer for sm_90 with cuDNN flash attention
#                                  (USE_CUDNN=1, no MPI/NCCL: one GPU)
#     tinyshakespeare_{train,val}.bin  the bundled Shakespeare (assets/text) as GPT-2 tokens in llm.c's
#                                  format (256 int32 header: 20240520, 1, count; then uint16 tokens),
#                                  tokenised by our preprocess_data (PREPROCESS, else build/ or build-gpu/);
#                                  the first 32768 tokens are val, the rest train
#     LLMC_INFO                    llm.c's commit, nvcc, make flags, the build-only edits below
#
# Build-only edits to llm.c's tree (recorded in LLMC_INFO; each must match or the script stops):
#   - CUDA 13 takes a cudaMemLocation in cudaMemAdvise (llmc/cuda_utils.cuh, the managed-memory
#     fallback after an out-of-memory, never reached at 124M on an 80 GB card);
#   - no -lnvidia-ml: this machine has no nvml.h, so llmc/mfu.h compiles without NVML and needs no lib;
#   - cuDNN frontend's headers need NVRTC and the driver library at link time (NVCC_LDLIBS).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
LLMC_SRC=${LLMC_SRC:-/work/.mirror/karpathy+llm.c/repo}
SRC=${SRC:-build-llmc-src}
OUTD=${OUTD:-build-llmc}
ARCH=${ARCH:-90}
FRONTEND=$ROOT/.deps/cudnn-frontend/include

die() { echo "prepare_llmc: $*" >&2; exit 1; }
[ -e "$LLMC_SRC" ] || die "no llm.c at LLMC_SRC=$LLMC_SRC: clone https://github.com/karpathy/llm.c and pass LLMC_SRC"
[ -f "$FRONTEND/cudnn_frontend.h" ] || die "no cuDNN frontend headers at $FRONTEND: run make deps"
command -v nvcc >/dev/null || die "nvcc not found (the CUDA toolkit builds llm.c)"
PRE=${PREPROCESS:-}
if [ -z "$PRE" ]; then
  for p in build/apps/preprocess_data build-gpu/apps/preprocess_data; do [ -x "$p" ] && PRE=$p && break; done
fi
[ -n "$PRE" ] && [ -x "$PRE" ] || die "no executable preprocess_data (${PRE:-looked in build/apps and build-gpu/apps}): run make build, or pass PREPROCESS=path"

# ---- 1. llm.c's source, at one commit -----------------------------------------------------------
rm -rf "$SRC" "$OUTD"
mkdir -p "$SRC" "$OUTD"
if git --git-dir="$LLMC_SRC" rev-parse HEAD >/dev/null 2>&1; then
  GITDIR=$LLMC_SRC
elif git -C "$LLMC_SRC" rev-parse HEAD >/dev/null 2>&1; then
  GITDIR=$(git -C "$LLMC_SRC" rev-parse --absolute-git-dir)
else
  die "$LLMC_SRC is not a git checkout or git directory of llm.c"
fi
COMMIT=$(git --git-dir="$GITDIR" rev-parse HEAD)
git --git-dir="$GITDIR" archive HEAD | tar -x -C "$SRC"
[ -f "$SRC/train_gpt2.cu" ] || die "$LLMC_SRC at $COMMIT has no train_gpt2.cu: is it llm.c?"

# ---- 2. the build-only edits ---------------------------------------------------------------------
edit() {  # edit FILE SED-EXPRESSION WHAT: applies it and fails unless the file changed
  local f=$SRC/$1 before
  before=$(md5sum "$f")
  sed -i "$2" "$f"
  [ "$(md5sum "$f")" != "$before" ] || die "llm.c $COMMIT: the edit '$3' no longer matches $1; update tools/prepare_llmc.sh"
  EDITS="${EDITS:+$EDITS; }$3"
}
EDITS=""
if [ "$(nvcc --version | sed -n 's/.*release \([0-9]*\)\..*/\1/p')" -ge 13 ]; then
  edit llmc/cuda_utils.cuh \
    's/cudaMemAdvise(\*out, bytes, cudaMemAdviseSetPreferredLocation, cudaCpuDeviceId)/cudaMemAdvise(*out, bytes, cudaMemAdviseSetPreferredLocation, cudaMemLocation{cudaMemLocationTypeHost, 0})/' \
    "cudaMemAdvise takes a cudaMemLocation (CUDA 13)"
fi
if ! echo '#include <nvml.h>' | g++ -x c++ -E -I/usr/local/cuda/include - >/dev/null 2>&1; then
  edit Makefile 's/^  NVCC_LDFLAGS += -lnvidia-ml$/  # no -lnvidia-ml: no nvml.h here/' "no -lnvidia-ml (no nvml.h: built without NVML)"
fi
ln -s "$ROOT/.deps/cudnn-frontend" "$SRC/cudnn-frontend"

# ---- 3. build --------------------------------------------------------------------------------------
FLAGS="USE_CUDNN=1 GPU_COMPUTE_CAPABILITY=$ARCH NO_MULTI_GPU=1 NO_USE_MPI=1 CI=true"
LDLIBS="-lnvrtc -L/usr/local/cuda/lib64/stubs -lcuda"
echo "prepare_llmc: building llm.c $COMMIT (make train_gpt2cu $FLAGS NVCC_LDLIBS=\"$LDLIBS\")"
# shellcheck disable=SC2086
(cd "$SRC" && make train_gpt2cu $FLAGS NVCC_LDLIBS="$LDLIBS") >"$SRC/build.log" 2>&1 ||
  { tail -20 "$SRC/build.log" >&2; die "llm.c build failed: $SRC/build.log"; }
cp "$SRC/train_gpt2cu" "$OUTD/"
strip --strip-debug "$OUTD/train_gpt2cu"

# ---- 4. data: the bundled Shakespeare as GPT-2 tokens in llm.c's format ---------------------------
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
python3 - assets/text/tinyshakespeare.txt "$TMP/shakespeare.jsonl" <<'EOF'
import json, sys
text = open(sys.argv[1], encoding="utf-8").read()
with open(sys.argv[2], "w") as f:  # one document: the whole text, as llm.c's own tinyshakespeare.py
    f.write(json.dumps({"text": text}) + "\n")
EOF
"$PRE" --input "$TMP/shakespeare.jsonl" --output-prefix "$TMP/shakespeare" --tokenizer-type GPT2BPETokenizer \
  --vocab-file assets/gpt2/gpt2-vocab.json --merge-file assets/gpt2/gpt2-merges.txt >/dev/null
python3 - "$TMP/shakespeare_text_document" "$OUTD" <<'EOF'
import struct, sys
prefix, out = sys.argv[1], sys.argv[2]
idx = open(prefix + ".idx", "rb").read()
assert idx[:9] == b"MMIDIDX\x00\x00", "not a Megatron .idx"
dtype = idx[17]
assert dtype == 8, f"token dtype code {dtype}, llm.c needs uint16 (code 8)"
tokens = open(prefix + ".bin", "rb").read()  # one document: all of it
n = len(tokens) // 2
val = 32768
def write(path, data):
    header = struct.pack("<256i", *([20240520, 1, len(data) // 2] + [0] * 253))
    with open(path, "wb") as f:
        f.write(header + data)
write(f"{out}/tinyshakespeare_val.bin", tokens[: 2 * val])
write(f"{out}/tinyshakespeare_train.bin", tokens[2 * val:])
print(f"prepare_llmc: {n} GPT-2 tokens: {val} val, {n - val} train")
EOF

{
  echo "llm.c https://github.com/karpathy/llm.c commit $COMMIT ($(git --git-dir="$GITDIR" log -1 --format=%cd --date=short))"
  echo "built $(date -u +%Y-%m-%dT%H:%MZ) on $(hostname): make train_gpt2cu $FLAGS NVCC_LDLIBS=\"$LDLIBS\""
  echo "nvcc: $(nvcc --version | tail -2 | head -1)"
  echo "build-only edits: ${EDITS:-none}"
} >"$OUTD/LLMC_INFO"
cat "$OUTD/LLMC_INFO"
du -sh "$OUTD"
