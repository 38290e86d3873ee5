// tensor/moe_permute.h — Mixture-of-Experts token permutation (Megatron-Core's
// moe_utils.permute / unpermute): the tokens' rows grouped by expert for the expert
// GEMMs, and the experts' outputs weighted by the router's probabilities back in
// token order.
//
//   routing:   indices (N, k): the expert of token n's j-th choice (host or device,
//              i32 or i64); moe_routing() turns it into
//                dest (N·k) i32: the row of (n, j) in the expert-grouped order, or −1
//                       for a dropped choice (capacity); experts in order, within an
//                       expert (n, j) in flat order n·k + j (Megatron's stable argsort)
//                counts (E): rows per expert
//   permute:   out (R, C) = x[n] at row dest[n·k + j]    (R = rows kept ≤ N·k)
//   backward:  dx[n] = Σ_j dout[dest[n·k + j]]           (j in order; dropped: nothing)
//   unpermute: y[n]  = Σ_j probs[n, j] · in[dest[n·k + j]]   (f32 sums, j in order)
//   backward:  din[dest[n·k + j]] = probs[n, j] · dy[n],
//              dprobs[n, j]       = ⟨dy[n], in[dest[n·k + j]]⟩  (f32)
// x, out, in, y, dout, din: one float dtype (f32/bf16/f16); probs, dprobs f32; dest
// i32 on x's device. Every output row is written (no accumulation); rows are summed
// in a fixed order on both backends, so results do not depend on thread timing.
// With probabilities 1/k (k a power of two) unpermute(permute(x)) is x bit for bit.
#pragma once
#include <cstdint>
#include <vector>

#include "tensor/tensor.h"

namespace mpitron {

struct MoeRouting {
  std::vector<int32_t> dest;    // (N·k) row in the grouped order, −1 dropped
  std::vector<int64_t> counts;  // (E) rows kept per expert
  std::vector<int64_t> chosen;  // (E) choices per expert before capacity (the load-balancing loss's counts)
  int64_t rows() const;         // Σ counts
};
// From the router's top-k choices (any device: copied to the host). `capacity` > 0
// keeps at most that many rows per expert: the first in flat order (the position drop
// policy), or with `probs` (N, k) f32 the most probable, ties to the earlier (the probs
// policy); 0 keeps every choice (dropless). An index outside [0, E) throws.
MoeRouting moe_routing(const Tensor& indices, int64_t num_experts, int64_t capacity = 0, const Tensor& probs = Tensor());

void moe_permute(const Tensor& x, const Tensor& dest, const Tensor& out, Stream s = Stream());
void moe_permute_backward(const Tensor& dout, const Tensor& dest, const Tensor& dx, Stream s = Stream());
void moe_unpermute(const Tensor& in, const Tensor& dest, const Tensor& probs, const Tensor& y, Stream s = Stream());
void moe_unpermute_backward(const Tensor& dy, const Tensor& in, const Tensor& dest, const Tensor& probs,
                            const Tensor& din, const Tensor& dprobs, Stream s = Stream());

}  // namespace mpitron
