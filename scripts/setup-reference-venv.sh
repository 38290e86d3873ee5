#!/usr/bin/env bash
# Creates (idempotently) the Python venv that the newer reference scripts run with:
# PyPI's torch, transformers 4.x, megatron-core 0.16.1, deepspeed, openai, safetensors,
# tokenizers, sentencepiece and numpy on Debian's /usr/bin/python3 (about 6 GB).
# Used by tests/reference/hf_family2_ref.py and the Megatron/DeepSpeed checkpoint,
# Muon and fp8 references. Nothing here is needed to build mpitron or to run ctest.
#
#   MPITRON_REF_VENV=/path   where the venv goes (default: <repo root>/.venv-ref);
#                            point several worktrees at one shared venv with it.
#
# Notes (see shared REFERENCES.md): megatron-core 0.17+ needs Python 3.12, hence the pin;
# DS_BUILD_OPS=0 keeps deepspeed from compiling CUDA ops (it picks its CPU accelerator);
# a file named kernels.py on sys.path shadows an optional package transformers probes
# and breaks the import of every model.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="${MPITRON_REF_VENV:-$root/.venv-ref}"
py=/usr/bin/python3

pkgs=(torch "transformers<5" megatron-core==0.16.1 deepspeed openai safetensors tokenizers sentencepiece numpy)

if [ ! -x "$venv/bin/python" ]; then
  echo "setup-reference-venv: creating $venv"
  "$py" -m venv "$venv"
fi

# Quiet when everything already imports at the pinned versions.
if ! "$venv/bin/python" - <<'PY' >/dev/null 2>&1
import importlib.metadata as md
import torch, transformers, megatron.core, deepspeed, openai, safetensors, tokenizers, sentencepiece, numpy
assert md.version("megatron-core") == "0.16.1"
assert int(md.version("transformers").split(".")[0]) < 5
PY
then
  echo "setup-reference-venv: installing ${pkgs[*]}"
  "$venv/bin/python" -m pip install -q --upgrade pip
  DS_BUILD_OPS=0 "$venv/bin/python" -m pip install -q "${pkgs[@]}"
fi

"$venv/bin/python" - <<'PY'
import importlib.metadata as md, sys
print("python", sys.version.split()[0], sys.executable)
for n in ["torch", "transformers", "megatron-core", "deepspeed", "openai", "safetensors",
          "tokenizers", "sentencepiece", "numpy"]:
    print(f"{n} {md.version(n)}")
PY
