// model/tensor_parallel.h — Megatron's tensor-parallel regions as autograd ops.
//
// A tensor-parallel (TP) group of size t splits each block's matmuls:
// column-parallel (qkv, mlp.fc: each rank holds 1/t of the output features)
// then row-parallel (attn.proj, mlp.proj: 1/t of the input features, the
// partial outputs summed over the group). Between them the activations are
// either replicated on every rank or, with --sequence-parallel, split along
// the N = B·T token rows (rank r holds rows [r·N/t, (r+1)·N/t)):
//
//                      forward            backward
//   copy    (f)        identity           all-reduce      replicated → column-parallel
//   reduce  (g)        all-reduce         identity        row-parallel → replicated
//   gather             all-gather rows    reduce-scatter  sequence-split → column-parallel
//   scatter            reduce-scatter     all-gather      row-parallel → sequence-split
//
// Every op is the identity when the group has one rank.
#pragma once
#include <cstdint>

#include "autograd/tape.h"
#include "parallel/communicator.h"

namespace mpitron {

struct TensorParallel {
  Communicator* comm = nullptr;  // the tp group; may be null when size == 1
  int size = 1, rank = 0;
  bool sequence_parallel = false;
  bool active() const { return size > 1; }
  // Token rows this rank holds of N (N / size with sequence parallelism).
  int64_t local_rows(int64_t n) const { return sequence_parallel ? n / size : n; }
  int64_t first_row(int64_t n) const { return sequence_parallel ? rank * (n / size) : 0; }
};

// Raw tensor forms (used inside the hand-written block backward).
void tp_all_reduce(const TensorParallel& tp, const Tensor& t);                 // in place, sum
Tensor tp_all_gather_rows(const TensorParallel& tp, const Tensor& local);      // (n/t, C) → (n, C)
Tensor tp_reduce_scatter_rows(const TensorParallel& tp, const Tensor& full);   // (n, C) → (n/t, C), sum

namespace ag {
Var tp_copy(Tape& tape, const Var& x, const TensorParallel& tp);
Var tp_reduce(Tape& tape, const Var& x, const TensorParallel& tp);
Var tp_gather(Tape& tape, const Var& x, const TensorParallel& tp);
Var tp_scatter(Tape& tape, const Var& x, const TensorParallel& tp);
// A parameter used in the sequence-split region (layernorms, wpe): each rank's
// gradient is a partial sum over its own rows. Returns a Var sharing p's value
// whose gradient the tape all-reduces over the group and adds into p's once
// every use of it in this backward is done (p itself without sequence parallelism).
Var sequence_parallel_param(Tape& tape, const Var& p, const TensorParallel& tp);
// Megatron's vocab-parallel cross-entropy: logits (N, V/t) are this rank's
// vocabulary slice [vocab_start, vocab_start + V/t); targets (N) are global ids
// (< 0 ignored). The full (N, V) logits are never gathered: each rank reduces
// its slice to a per-row logsumexp and target logit, the group combines those
// (N floats each). Returns the mean loss over valid targets, a (1) f32 Var,
// identical on every rank. Like ag::cross_entropy, when the tape records the
// logits' buffer is overwritten in place by their gradient.
Var vocab_parallel_cross_entropy(Tape& tape, const Var& logits, const Tensor& targets, int64_t vocab_start,
                                 const TensorParallel& tp);
}  // namespace ag

}  // namespace mpitron
