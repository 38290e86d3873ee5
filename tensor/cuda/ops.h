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

// moe_router.h (declared here rather than in backend_ops.inc: arguments validated by dispatch.cpp)
void moe_router_forward(const Tensor& logits, const MoeRouterArgs& args, const Tensor& probs, const Tensor& indices,
                        const Tensor& aux_sums, const Tensor& lse, Stream s);
void moe_router_backward(const Tensor& dprobs, const Tensor& logits, const Tensor& indices, const MoeRouterArgs& args,
                         const Tensor& aux_weight, float z_weight, const Tensor& dlogits, Stream s);
}  // namespace mpitron::cuda
