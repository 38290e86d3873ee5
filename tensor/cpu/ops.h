// tensor/cpu/ops.h — the CPU backend (OpenMP + BLAS). Contract: tensor/backend_ops.inc.
#pragma once
#include "tensor/ops.h"

namespace mpitron::cpu {
#include "tensor/backend_ops.inc"

// moe_router.h (declared here rather than in backend_ops.inc: arguments validated by dispatch.cpp)
void moe_router_forward(const Tensor& logits, const MoeRouterArgs& args, const Tensor& probs, const Tensor& indices,
                        const Tensor& aux_sums, const Tensor& lse, Stream s);
void moe_router_backward(const Tensor& dprobs, const Tensor& logits, const Tensor& indices, const MoeRouterArgs& args,
                         const Tensor& aux_weight, float z_weight, const Tensor& dlogits, Stream s);
}  // namespace mpitron::cpu
