// tensor/embedding.h — embedding lookup and its scatter-add backward.
//
//   ids: (N) i32 or i64; table: (V, C); out: (N, C), table's dtype.
//   Row r = ids[n] − vocab_start. Rows outside [0, V) give zeros and receive
//   no gradient: that is vocab-parallel semantics (each TP rank holds rows
//   [vocab_start, vocab_start + V)); with vocab_start = 0 and ids validated by
//   the data layer it is a plain lookup.
#pragma once
#include "tensor/tensor.h"

namespace mpitron {

// out = table[ids]  (or out += table[ids] when accumulate, e.g. adding position embeddings)
void embedding_forward(const Tensor& ids, const Tensor& table, const Tensor& out, bool accumulate = false,
                       int64_t vocab_start = 0, Stream s = Stream());
// dtable[ids[n]] += dout[n]  (f32 or table's dtype; repeated ids sum deterministically on CPU)
void embedding_backward(const Tensor& dout, const Tensor& ids, const Tensor& dtable, int64_t vocab_start = 0,
                        Stream s = Stream());

}  // namespace mpitron
