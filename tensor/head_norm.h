// tensor/head_norm.h — RMS normalisation of head views (QK-norm), in two phases so that a group
// split across tensor-parallel ranks can be all-reduced between them (the tensor layer calls no
// communicator: the caller does, between the phases).
//
//   Qwen3, Gemma 3: each head's HD values are a group, one (HD) weight shared by the heads
//                   (q_norm/k_norm applied to q.view(..., NH, HD));
//   OLMo-2:         each token's whole q (or k) row of NH·HD values is a group, weight (NH·HD);
//                   under TP a rank holds NH/t heads, so its row is a slice of the group.
//
// Operands:
//   x, out, dout, dx: (N, H, D) views with the heads of a row packed, stride(2) == 1 and
//        stride(1) == D, the row stride free — e.g. the q (or k) heads of a packed qkv
//        (N, (NH + 2G)·HD) viewed (N, NH + 2G, HD) and sliced on dim 1: no copies. One float
//        dtype (f32, bf16, f16) for x, out, weight, dout, dx; math in f32.
//   The GROUPING is given by the statistics' shape (ss, rstd, dot), G groups per row:
//        (N, H) f32: per head, each group the D values of one head, weight (D);
//        (N, 1) f32: the whole row, one group of H·D values, weight (H·D) (this rank's slice).
//        (With H = 1 the two are the same.) Statistics are contiguous.
//   count: the group's GLOBAL element count, the mean's divisor: D per head; NH·HD for a row
//        split over ranks (this call sees H·D of it); >= the local group size.
//
// Forward (ss all-reduced over the ranks that split a group, when they do):
//   ss   = Σ_group x²                                         head_norm_sumsq
//   rstd = 1/√(ss/count + eps),  out = x·rstd·weight           head_norm_forward
// Backward, with x̂ = x·rstd and g = dout·weight (dot all-reduced like ss):
//   dot  = Σ_group g·x̂   (this call's share)                  head_norm_backward_dot
//   dx   = rstd·(g − x̂·dot/count),  dweight += Σ_n dout·x̂     head_norm_backward
// (per head, dweight also sums over the heads). Unsplit, this is rmsnorm.h over each group.
#pragma once
#include <cstdint>

#include "tensor/tensor.h"

namespace mpitron {

// ss (N, G) f32 = Σ x² over each group of x (N, H, D) (overwritten).
void head_norm_sumsq(const Tensor& x, const Tensor& ss, Stream s = Stream());

// out (N, H, D) = x·rstd·weight, rstd (N, G) f32 = 1/√(ss/count + eps) (both overwritten).
// weight: (D) when G = H, (H·D) when G = 1, x's dtype, contiguous. out may alias x (in place
// on a packed qkv); the backward needs x, so an in-place caller keeps a copy or recomputes.
void head_norm_forward(const Tensor& x, const Tensor& ss, int64_t count, float eps, const Tensor& weight,
                       const Tensor& out, const Tensor& rstd, Stream s = Stream());

// dot (N, G) f32 = Σ_group (dout·weight)·x·rstd over this call's share of each group (overwritten).
void head_norm_backward_dot(const Tensor& dout, const Tensor& x, const Tensor& weight, const Tensor& rstd,
                            const Tensor& dot, Stream s = Stream());
// dx (N, H, D) = rstd·(dout·weight − x·rstd·dot/count), overwritten; may alias dout.
// dweight (weight's shape) += Σ over rows (and, per head, heads) of dout·x·rstd, f32 or x's
// dtype, accumulated in f32. Either may be undefined (skipped).
void head_norm_backward(const Tensor& dout, const Tensor& x, const Tensor& weight, const Tensor& rstd,
                        const Tensor& dot, int64_t count, const Tensor& dx, const Tensor& dweight,
                        Stream s = Stream());

}  // namespace mpitron
