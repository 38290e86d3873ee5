#!/usr/bin/env bash
# Installs what mpitron's build and tests need, from Debian's packages.
# Idempotent: quiet when everything is already present.
#   MPITRON_DEPS_REFERENCE=1  also installs the reference tools (PyTorch, h5py,
#                             tokenizers, megatron-core, tensorboard) used by
#                             tests/reference/ scripts to regenerate outputs.
set -euo pipefail

debs=(
  build-essential cmake ninja-build ccache pkg-config
  openmpi-bin libopenmpi-dev
  libhdf5-openmpi-dev hdf5-tools
  libboost-program-options-dev
  libcpp-httplib-dev
  doctest-dev
  libopenblas-openmp-dev
  libpcre2-dev
  libicu-dev
  libsentencepiece-dev
  nlohmann-json3-dev
  python3 python3-numpy python3-h5py python3-pip
)

missing=()
for p in "${debs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done

if [ ${#missing[@]} -gt 0 ]; then
  echo "install-deps: installing ${missing[*]}"
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO=sudo
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# TensorBoard's own reader checks our event files in the io tests.
/usr/bin/python3 -c "import tensorboard" 2>/dev/null || \
  /usr/bin/python3 -m pip install -q --break-system-packages tensorboard 2>&1 | grep -v -i "warning" || true

if [ "${MPITRON_DEPS_REFERENCE:-0}" = 1 ]; then
  refs=(python3-torch python3-pip python3-venv)
  miss=()
  for p in "${refs[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || miss+=("$p")
  done
  if [ ${#miss[@]} -gt 0 ]; then
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${miss[@]}" >/dev/null
  fi
  /usr/bin/python3 -c "import tokenizers, tiktoken" 2>/dev/null || \
    /usr/bin/python3 -m pip install -q --break-system-packages tokenizers tiktoken
fi

if command -v nvcc >/dev/null 2>&1 || [ -x /usr/local/cuda/bin/nvcc ]; then
  # cuDNN's header-only C++ frontend (PyPI nvidia-cudnn-frontend) for flash attention.
  "$(dirname "$0")/install-cudnn-frontend.sh"
else
  echo "install-deps: no CUDA toolkit found (nvcc). The build will be CPU-only;"
  echo "              install the CUDA toolkit and re-run cmake to build the CUDA backend."
fi
