// tensor/cuda/ops.h — the CUDA backend (kernels, cuBLASLt, cuDNN). Contract: tensor/backend_ops.inc.
// Declared in every build; defined only when MPITRON_WITH_CUDA (the dispatcher
// never calls it otherwise).
#pragma once
#include "tensor/ops.h"

namespace mpitron::cuda {
#include "tensor/backend_ops.inc"

// Backend-specific controls (attention.h exposes them publicly).
std::string attention_backend_name();
void attention_force_fallback(bool on);
}  // namespace mpitron::cuda
