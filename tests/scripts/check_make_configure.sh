#!/usr/bin/env bash
# `make` on a fresh machine before `make deps` (issue 47, item 6): the Makefile's
# configure step names what is missing and says `make deps`, and leaves nothing that
# breaks the next try (no half-made CMakeCache.txt; a cache left by an older failed
# configure does not stop the next `make` at "ninja: error: loading 'build.ninja'").
# Cheap: no real configure runs; CMake is a stand-in script where one is needed.
#   check_make_configure.sh <source dir>
set -u
src=$1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fails=0
bad() { echo "FAIL: $*"; fails=$((fails + 1)); }
# run <name> <env...> -- <make args...>: make's output in $tmp/<name>.out, its status in rc
run() {
  local name=$1; shift
  local envs=()
  while [ "$1" != -- ]; do envs+=("$1"); shift; done
  shift
  env "${envs[@]}" make --no-print-directory -C "$src" CUDNN_FRONTEND=true "$@" >"$tmp/$name.out" 2>&1
  rc=$?
}

# 1. No mpicxx on PATH (everything else there): refused before CMake, naming it and `make deps`.
mkdir -p "$tmp/bin"
for d in /usr/local/bin /usr/bin /bin; do
  [ -d "$d" ] && ln -s "$d"/* "$tmp/bin/" 2>/dev/null
done
rm -f "$tmp"/bin/mpic* "$tmp"/bin/mpiCC "$tmp"/bin/mpicxx* "$tmp"/bin/mpirun "$tmp"/bin/mpiexec*
run nompi PATH="$tmp/bin" -- configure BUILD="$tmp/b1"
[ "$rc" -ne 0 ] || bad "1: configure without mpicxx succeeded"
grep -q "mpicxx" "$tmp/nompi.out" || bad "1: the message does not name mpicxx: $(cat "$tmp/nompi.out")"
grep -q "make deps" "$tmp/nompi.out" || bad "1: the message does not say make deps: $(cat "$tmp/nompi.out")"
[ ! -e "$tmp/b1/CMakeCache.txt" ] || bad "1: $tmp/b1/CMakeCache.txt was left behind"

# A stand-in for cmake: writes the cache, then fails (MODE=fail) or writes build.ninja.
mkdir -p "$tmp/fake"
cat >"$tmp/fake/cmake" <<'SH'
#!/usr/bin/env bash
b=""
while [ $# -gt 0 ]; do [ "$1" = -B ] && b=$2; shift; done
echo "configure $b" >>"$FAKE_LOG"
mkdir -p "$b" && echo "# half-made" >"$b/CMakeCache.txt"
if [ "$MODE" = fail ]; then echo "CMake Error: Could NOT find MPI (missing: MPI_CXX_FOUND CXX)" >&2; exit 1; fi
echo "# generated" >"$b/build.ninja"
SH
chmod +x "$tmp/fake/cmake"

# 2. CMake fails: the cache is removed, the message says `make deps`, and the second `make`
#    says the same thing again (it configures again) instead of "ninja: error".
for try in 1 2; do
  run "fail$try" PATH="$tmp/fake:$PATH" MODE=fail FAKE_LOG="$tmp/log2" -- BUILD="$tmp/b2"
  [ "$rc" -ne 0 ] || bad "2.$try: make succeeded with a failing cmake"
  grep -q "make deps" "$tmp/fail$try.out" || bad "2.$try: no 'make deps' in: $(cat "$tmp/fail$try.out")"
  grep -q "ninja: error" "$tmp/fail$try.out" && bad "2.$try: ninja ran on a failed configure: $(cat "$tmp/fail$try.out")"
  [ ! -e "$tmp/b2/CMakeCache.txt" ] || bad "2.$try: the half-made CMakeCache.txt was left behind"
done
[ "$(grep -c configure "$tmp/log2" 2>/dev/null)" = 2 ] || bad "2: cmake was not run on each try: $(cat "$tmp/log2" 2>/dev/null)"

# 3. A cache without build.ninja (left by an older Makefile's failed configure): configure runs again.
mkdir -p "$tmp/b3" && echo "# stale" >"$tmp/b3/CMakeCache.txt"
run stale PATH="$tmp/fake:$PATH" MODE=ok FAKE_LOG="$tmp/log3" -- configure BUILD="$tmp/b3"
[ "$rc" -eq 0 ] || bad "3: configure failed: $(cat "$tmp/stale.out")"
grep -q "configure $tmp/b3" "$tmp/log3" 2>/dev/null || bad "3: a stale CMakeCache.txt without build.ninja skipped the configure"
# ... and once configured, it is not configured again.
run again PATH="$tmp/fake:$PATH" MODE=ok FAKE_LOG="$tmp/log3" -- configure BUILD="$tmp/b3"
[ "$(grep -c configure "$tmp/log3")" = 1 ] || bad "3: a configured build dir was configured again"

if [ "$fails" -eq 0 ]; then echo "make configure: all checks passed"; exit 0; fi
exit 1
