// tensor/cpu/ops.h — the CPU backend (OpenMP + BLAS). Contract: tensor/backend_ops.inc.
#pragma once
#include "tensor/ops.h"

namespace mpitron::cpu {
#include "tensor/backend_ops.inc"
}  // namespace mpitron::cpu
