#!/usr/bin/env bash
# tools/prepare_gpu_bundle.sh — runs HERE (the CPU machine, Debian 12 with the
# CUDA toolkit): makes everything the lent GPU machine needs for one call of
# tools/gpu_check.sh (docs/gpu.md):
#
#   build-gpu/      the CUDA tree: sm_90, Release, shared mpitron libraries
#                   (BUILD_SHARED_LIBS, $ORIGIN-relative RPATHs), every test,
#                   app and benchmark. Kept for incremental rebuilds; not carried.
#   build-gpu-run/  what runs: the executables, the libmpitron_*.so and the
#                   CTestTestfile.cmake files of build-gpu (paths rewritten to
#                   build-gpu-run), debug info stripped; BUNDLE_INFO says what.
#   build-gpu-bundle/build-gpu-run.tar.xz
#                   what is carried: build-gpu-run as one xz tarball (about 29
#                   MiB of ELF files become about 5 MiB); gpu_check.sh unpacks it.
#   .debs/          the Debian runtime packages the GPU machine lacks (Open MPI,
#                   PMIx, parallel HDF5 and its libcurl chain, Boost
#                   program_options, OpenMP OpenBLAS, libgfortran, PCRE2, …):
#                   the packages that own every shared library our binaries,
#                   Open MPI's launcher and its plugins load, minus the C/C++
#                   runtime (every image has it), the CUDA libraries (the GPU
#                   machine has its own) and the InfiniBand/OFI/UCX stacks (one
#                   node needs none; those Open MPI plugins are not loaded).
#   build-llmc/     the llm.c peer (tools/prepare_llmc.sh: llm.c's train_gpt2cu for sm_90 and its
#                   token files, about 4 MiB), when llm.c's source is here (LLMC_SRC); SKIP_LLMC=1 skips it.
# Static libraries would put the CUDA kernels into every one of ~40 binaries
# (8 MB each); shared, they are in libmpitron_tensor.so once.
#
#   tools/prepare_gpu_bundle.sh            (JOBS=1 by default: CUDA compiles are heavy here)
# Environment: BUILD (build-gpu), RUN (build-gpu-run), BUNDLE (build-gpu-bundle), JOBS (1), ARCH (90),
# SKIP_BUILD=1 to reuse BUILD as it is, SKIP_LLMC=1 to leave build-llmc/ out, LLMC_SRC (tools/prepare_llmc.sh). All three folders match .gitignore's /build*/.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
BUILD=${BUILD:-build-gpu}
RUN=${RUN:-build-gpu-run}
BUNDLE=${BUNDLE:-build-gpu-bundle}
JOBS=${JOBS:-1}
ARCH=${ARCH:-90}
LIMIT=$((64 * 1024 * 1024))

# ---- 1. the CUDA build ------------------------------------------------------------
if [ "${SKIP_BUILD:-0}" != 1 ]; then
  cmake -S . -B "$BUILD" -G Ninja -DMPITRON_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES="$ARCH" -DCMAKE_BUILD_TYPE=Release \
    -DBUILD_SHARED_LIBS=ON -DCMAKE_BUILD_RPATH_USE_ORIGIN=ON >/dev/null
  ninja -C "$BUILD" -j "$JOBS"
fi

# ---- 2. the carried copy: executables, shared libraries, ctest files ----------------
rm -rf "$RUN"
mkdir -p "$RUN"
(cd "$BUILD" && find . -path '*/CMakeFiles' -prune -o -type f \
   \( -name '*.so' -o -name '*.so.*' -o -name 'CTestTestfile.cmake' -o -perm -u+x \) -print) |
  while read -r f; do
    mkdir -p "$RUN/$(dirname "$f")"
    cp -a "$BUILD/$f" "$RUN/$f"
  done
# Release builds carry no -g, but strip what debug info there is (-lineinfo stays in the fatbins).
find "$RUN" -type f \( -perm -u+x -o -name '*.so*' \) -exec sh -c 'file -b "$1" | grep -q ELF && strip --strip-debug "$1"' _ {} \;
find "$RUN" -name CTestTestfile.cmake -exec sed -i "s#$ROOT/$BUILD#$ROOT/$RUN#g" {} +
echo "$ROOT" >"$RUN/BUNDLE_ROOT"
{
  echo "built $(date -u +%Y-%m-%dT%H:%MZ) on $(hostname) from $(git rev-parse --short HEAD 2>/dev/null)$(git diff --quiet 2>/dev/null || echo ' + uncommitted changes')"
  echo "nvcc: $(nvcc --version | tail -2 | head -1)"
  echo "CMAKE_CUDA_ARCHITECTURES=$ARCH, Release, BUILD_SHARED_LIBS=ON, RPATH \$ORIGIN-relative"
  echo "source root at build time: $ROOT (tests read MPITRON_SOURCE_DIR=$ROOT; gpu_check.sh links it to the checkout)"
} >"$RUN/BUNDLE_INFO"

# ---- 3. runtime .debs ---------------------------------------------------------------
# Packages owning every library that our binaries, Open MPI's launcher and the
# Open MPI / PMIx plugins need (ldd follows the whole chain).
EXCLUDE='^(libc6|libstdc\+\+6|libgcc-s1|libfabric1|libucx0|libpsm2-2|libpsm-infinipath1|libibverbs1|librdmacm1|ibverbs-providers|libefa1|libnl-3-200|libnl-route-3-200|libmunge2)$'
EXPLICIT="openmpi-bin openmpi-common libopenmpi3 libpmix2 libhdf5-openmpi-103-1 libboost-program-options1.74.0 libopenblas0-openmp libpcre2-8-0 libgfortran5"
owner() {  # the package owning a library path (merged /usr: dpkg may know it as /lib/…)
  dpkg -S "$1" 2>/dev/null | head -1 | cut -d: -f1 || true
}
libs=$( {
  find "$RUN" -type f \( -perm -u+x -o -name '*.so*' \) -exec sh -c 'file -b "$1" | grep -q ELF && echo "$1"' _ {} \;
  echo /usr/bin/orterun /usr/bin/orted
  ls /usr/lib/x86_64-linux-gnu/openmpi/lib/openmpi3/*.so /usr/lib/x86_64-linux-gnu/pmix2/lib/pmix/*.so 2>/dev/null
} | xargs ldd 2>/dev/null | awk '/=> \//{print $3}' | sort -u | xargs -r readlink -f | sort -u)
pkgs=$(for l in $libs; do
  p=$(owner "$l")
  [ -n "$p" ] || p=$(owner "${l#/usr}")
  [ -n "$p" ] && echo "$p"
done; for p in $EXPLICIT; do echo "$p"; done)
pkgs=$(echo "$pkgs" | sed 's/:amd64$//' | sort -u | grep -Ev "$EXCLUDE")
rm -rf .debs
mkdir -p .debs
# The versions installed here (what the binaries were linked against); where the
# mirror no longer has that one (superseded by a security update), its current one.
for p in $pkgs; do
  v=$(dpkg-query -W -f='${Version}' "$p" 2>/dev/null || true)
  (cd .debs && { apt-get download "$p=$v" >/dev/null 2>&1 || apt-get download "$p" >/dev/null 2>&1; }) ||
    echo "prepare_gpu_bundle: could not download $p" >&2
done
[ -n "$(ls .debs/*.deb 2>/dev/null)" ] || { echo "prepare_gpu_bundle: no .debs downloaded" >&2; exit 1; }

# ---- 4. compress: the carried tree is one xz tarball (29 MiB of ELF files -> ~5 MiB) ----
rm -rf "$BUNDLE"
mkdir -p "$BUNDLE"
tar -C "$RUN" -cf - . | xz -T2 -6 >"$BUNDLE/$RUN.tar.xz"

# ---- 4b. the llm.c peer ----------------------------------------------------------------
LLMC=build-llmc
if [ "${SKIP_LLMC:-0}" != 1 ]; then
  tools/prepare_llmc.sh || { echo "prepare_gpu_bundle: the llm.c peer failed (SKIP_LLMC=1 to go on without it)" >&2; exit 1; }
fi

# ---- 5. sizes against the 64 MiB carry limit ----------------------------------------
mib() { echo "$1 / 1048576" | bc -l; }
tree=$(git ls-files -co --exclude-standard -z | xargs -0 du -cb 2>/dev/null | tail -1 | cut -f1)
run=$(du -sb "$RUN" | cut -f1)
bundle=$(du -sb "$BUNDLE" | cut -f1)
debs=$(du -sb .debs | cut -f1)
llmc=0
[ -d "$LLMC" ] && llmc=$(du -sb "$LLMC" | cut -f1)
total=$((tree + bundle + debs + llmc))
echo
echo "packages ($(echo $pkgs | wc -w)): $(echo $pkgs | tr '\n' ' ')"
printf 'working tree %6.1f MiB\n%-12s %6.1f MiB (%s unpacked: %.1f MiB)\n.debs        %6.1f MiB\n%-12s %6.1f MiB\ntotal        %6.1f MiB of 64 MiB\n' \
  "$(mib $tree)" "$BUNDLE" "$(mib $bundle)" "$RUN" "$(mib $run)" "$(mib $debs)" "$LLMC" "$(mib $llmc)" "$(mib $total)"
echo "largest files of the bundle (unpacked) and .debs:"
find "$RUN" .debs -type f -printf '%s %p\n' | sort -rn | head -6 | awk '{printf "  %6.1f MiB %s\n", $1 / 1048576, $2}' || true
if [ "$total" -gt "$LIMIT" ]; then
  echo "prepare_gpu_bundle: OVER the 64 MiB carry limit (docs/gpu.md: what to drop)" >&2
  exit 1
fi
echo
carry="\"$BUNDLE\", \".debs\""
[ -d "$LLMC" ] && carry="$carry, \"$LLMC\""
echo "next (device tool): run carry=[$carry] command=\"bash tools/gpu_check.sh\" timeout_s=600"
