// tensor/moe_router.h — the MoE router's scores after its linear layer (Megatron-Core's
// moe/router.py TopKRouter with topk_softmax_with_capacity, and moe_utils' aux and z losses),
// one row (token) at a time, f32 throughout. The router linear itself (logits = x · Wrᵀ)
// is a gemm; capacity dropping is moe_routing's (tensor/moe_permute.h).
//
//   logits (N, E) f32, k = args.topk (1 <= k <= E), s = args.scaling (> 0; 1: none)
//   forward, per row n:
//     Softmax, !pre_softmax (Mixtral):  idx = topk(logits[n] + bias), probs = s · softmax(logits[n, idx])
//     Softmax,  pre_softmax (Qwen2-MoE): sc = softmax(logits[n]); idx = topk(sc + bias), probs = s · sc[idx]
//     Sigmoid (DeepSeek-V3):            sc = sigmoid(logits[n]); idx = topk(sc + bias),
//                                       probs = s · sc[idx] / (Σ_j sc[idx_j] + 1e-20) when k > 1, else s · sc[idx]
//     (bias: args' expert_bias (E) f32, used only to select; undefined: none. topk as tensor/moe_topk.h:
//      descending, ties to the lower expert; a NaN selection score ranks as −inf.)
//     Group-limited routing (args.num_groups = ng > 0: DeepSeek-V3's n_group / topk_group,
//     Megatron-Core's group_limited_topk with --moe-router-num-groups / --moe-router-group-topk):
//       the E experts form ng contiguous groups of E/ng; c = the selection scores above (the
//       score + bias that topk ranks); a group's score is the sum of its m largest c (m =
//       moe_group_score_topk(args): group_score_topk, or Megatron's topk / group_topk when 0;
//       transformers' DeepseekV3 hard-codes 2), added largest first (a NaN sum ranks as −inf);
//       the group_topk best groups are kept (descending, ties to the lower group) and topk
//       chooses among the kept groups' experts only — the others are never chosen (Megatron's
//       −inf fill; transformers fills 0, the same choice unless a kept c is negative).
//       probs, aux_sums, lse and the backward are unchanged: they depend on the indices only.
//     aux_sums (E) f32 = Σ_n a[n, e], the load-balancing loss's scores:
//                        a = softmax(logits[n]) (Softmax), sigmoid(logits[n]) / (Σ_e sigmoid + 1e-20) (Sigmoid);
//                        each column summed in a fixed order (deterministic, no atomics). Megatron's
//                        switch loss is Σ_e aux_sums[e] · tokens[e] · coeff · E / (k · N²).
//     lse (N) f32      = logsumexp(logits[n]) (the z-loss's; z = coeff · mean_n lse²)
//   backward, per row (the forward recomputed from logits and the given indices; dlogits overwritten):
//     dlogits[n] = ∂(Σ_j dprobs[n, j] · probs[n, j]) / ∂logits[n]       through the selected path
//                + ∂(Σ_e aux_weight[e] · a[n, e]) / ∂logits[n]            (aux_weight undefined: none)
//                + z_weight · 2 · lse[n] · softmax(logits[n])             (z_weight 0: none)
//     The selection (indices, as the forward wrote them) is not differentiated (as torch.topk's
//     indices); a choice whose index lies outside [0, E) is skipped. For the losses above:
//     aux_weight[e] = tokens[e] · coeff · E / (k · N²), z_weight = coeff / N.
// probs (N, k) f32, indices (N, k) i32, aux_sums (E) f32, lse (N) f32 may each be undefined
// in the forward (not computed). dprobs (N, k) f32, indices (N, k) i32, aux_weight (E) f32,
// dlogits (N, E) f32 in the backward. All on logits' device, contiguous.
#pragma once
#include <cstdint>

#include "tensor/tensor.h"

namespace mpitron {

enum class MoeScore : uint8_t { Softmax, Sigmoid };

struct MoeRouterArgs {
  MoeScore score = MoeScore::Softmax;
  bool pre_softmax = false;  // Softmax only: top-k of the softmax over all experts (unnormalised probs)
  int64_t topk = 2;          // k: experts per token, 1 <= k <= E
  float scaling = 1.0f;      // --moe-router-topk-scaling-factor (1: none)
  Tensor expert_bias;        // (E) f32: added to the selection scores only; undefined: none
  // Group-limited routing (above); 0 = no group limit (then group_topk and group_score_topk must be 0).
  int64_t num_groups = 0;        // ng: --moe-router-num-groups; divides E, at most kMoeMaxGroups
  int64_t group_topk = 0;        // groups kept per token: --moe-router-group-topk, 1..ng, topk <= it·E/ng
  int64_t group_score_topk = 0;  // m: experts summed into a group's score, <= E/ng; 0: topk / group_topk
};

// Most groups a router may have (the CUDA kernel keeps a row's kept groups in a 64-bit mask).
constexpr int64_t kMoeMaxGroups = 64;

// The m of the group score: group_score_topk, or Megatron's topk / group_topk when it is 0.
inline int64_t moe_group_score_topk(const MoeRouterArgs& a) {
  return a.group_score_topk > 0 ? a.group_score_topk : a.group_topk > 0 ? a.topk / a.group_topk : 0;
}

void moe_router_forward(const Tensor& logits, const MoeRouterArgs& args, const Tensor& probs, const Tensor& indices,
                        const Tensor& aux_sums, const Tensor& lse, Stream s = Stream());
void moe_router_backward(const Tensor& dprobs, const Tensor& logits, const Tensor& indices, const MoeRouterArgs& args,
                         const Tensor& aux_weight, float z_weight, const Tensor& dlogits, Stream s = Stream());

}  // namespace mpitron
