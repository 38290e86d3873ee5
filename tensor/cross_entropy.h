// tensor/cross_entropy.h — fused softmax cross-entropy over the vocabulary.
//
// One pass per row computes the loss and (optionally) the logits gradient,
// without materialising a probability tensor:
//   logits:  (N, V) f32/bf16/f16
//   targets: (N) i32 or i64; a target < 0 marks an ignored position (loss 0, zero gradient)
//   losses:  (N) f32 = logsumexp(logits[n]) − logits[n, targets[n]]
//   dlogits: (N, V) logits' dtype, may be the logits tensor itself (in place):
//            dloss_scale · (softmax(logits[n]) − onehot(targets[n]));
//            undefined → loss only (evaluation).
// dloss_scale is d(total loss)/d(losses[n]), e.g. loss_scale / num_valid_tokens.
#pragma once
#include "tensor/tensor.h"

namespace mpitron {

void softmax_cross_entropy(const Tensor& logits, const Tensor& targets, const Tensor& losses,
                           const Tensor& dlogits, float dloss_scale, Stream s = Stream());

// ---- vocab-parallel phases (Megatron's vocab-parallel cross-entropy) -----------------------
// With the vocabulary split over tensor-parallel ranks, each rank holds a column slice
//   logits:  (N, Vl) f32/bf16/f16 = columns [vocab_start, vocab_start + Vl) of the full (N, V) logits
//   targets: (N) i32 or i64, GLOBAL ids in [0, V); a target < 0 marks an ignored position
//   vocab_start >= 0.
// The full loss is assembled by the caller:
//   1. cross_entropy_local_stats on every slice;
//   2. combine across slices: lse[n] = log Σ_slices exp(lse_slice[n])  (e.g. all-reduce of the
//      max, then of Σ exp(lse_slice − max)), target_logit[n] = Σ_slices target_logit_slice[n];
//      loss[n] = lse[n] − target_logit[n] (0 for ignored rows);
//   3. cross_entropy_grad_from_lse on every slice with the global lse.

// Phase 1, per slice:
//   lse:          (N) f32 = logsumexp(logits[n, :]) over this slice's Vl columns, computed in f32.
//                 Written for every row, ignored ones included.
//   target_logit: (N) f32 = logits[n, targets[n] − vocab_start] when targets[n] >= 0 and that column
//                 lies in this slice, else 0 (so the slices' values sum to the full target logit).
void cross_entropy_local_stats(const Tensor& logits, const Tensor& targets, int64_t vocab_start,
                               const Tensor& lse, const Tensor& target_logit, Stream s = Stream());

// Phase 2, per slice, once the caller has the GLOBAL lse (N) f32 of every full row:
//   dlogits: (N, Vl) logits' dtype, may be the logits tensor itself (in place) =
//            scale · (exp(logits[n, j] − lse[n]) − onehot(targets[n] − vocab_start)[j]);
//            the one-hot term only where the target column lies in this slice;
//            rows with targets[n] < 0 get 0.
// scale is d(total loss)/d(loss[n]), e.g. loss_scale / num_valid_tokens.
void cross_entropy_grad_from_lse(const Tensor& logits, const Tensor& targets, int64_t vocab_start,
                                 const Tensor& lse, const Tensor& dlogits, float scale, Stream s = Stream());

}  // namespace mpitron
