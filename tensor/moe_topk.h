// tensor/moe_topk.h — the MoE router's top-k selection (Megatron-Core's
// topk_softmax_with_capacity picks torch.topk of the scores).
//
//   forward:  scores (N, E) f32 → values (N, k) f32, indices (N, k) i32: each row's k
//             largest scores in descending order; equal scores by the lower expert
//             index first (a total order: the same choice on every backend and rank)
//   backward: dscores (N, E) = 0, then dscores[n, indices[n, j]] = dvalues[n, j]
// 1 <= k <= E. NaN scores are refused by the caller's non-finite checks, not here (a NaN
// never compares larger, so a row of NaN picks the lowest indices).
#pragma once
#include <cstdint>

#include "tensor/tensor.h"

namespace mpitron {

void moe_topk(const Tensor& scores, int64_t k, const Tensor& values, const Tensor& indices, Stream s = Stream());
void moe_topk_backward(const Tensor& dvalues, const Tensor& indices, const Tensor& dscores, Stream s = Stream());

}  // namespace mpitron
