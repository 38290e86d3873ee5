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

}  // namespace mpitron
