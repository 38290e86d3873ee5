#!/usr/bin/env bash
# The programs the first configure needs, checked before CMake runs (the Makefile's
# configure step): on a fresh machine, before `make deps`, the user reads what is
# missing and what to run, not a page of CMake errors.
set -u
missing=()
need() {  # a program and the Debian package that has it
  command -v "$1" >/dev/null 2>&1 || missing+=("$1 (Debian $2)")
}
need cmake cmake
need ninja ninja-build
need c++ build-essential
need pkg-config pkg-config
need mpicxx libopenmpi-dev
need mpirun openmpi-bin
if [ ${#missing[@]} -gt 0 ]; then
  echo "mpitron: cannot configure the build; not found on PATH:" >&2
  for m in "${missing[@]}"; do echo "  $m" >&2; done
  echo "run \`make deps\` (scripts/install-deps.sh installs what the build and the tests need), then \`make\` again" >&2
  exit 1
fi
