// autograd/moe.h — Mixture-of-Experts token permutation on the tape
// (tensor/moe_permute.h; Megatron-Core's moe_utils.permute / unpermute).
//
//   moe_permute(x (N, C), dest)              → (rows, C): token rows grouped by expert
//   moe_unpermute(in (rows, C), dest, probs) → (N, C): Σ_j probs[n, j] · in[dest[n·k + j]]
// dest: MoeRouting::dest as an (N·k) i32 tensor on x's device; probs (N, k) f32 (the
// router's top-k probabilities, a Var: their gradient flows back to the router).
#pragma once
#include <cstdint>

#include "autograd/tape.h"
#include "tensor/moe_permute.h"

namespace mpitron::ag {

Var moe_permute(Tape& tape, const Var& x, const Tensor& dest, int64_t rows);
Var moe_unpermute(Tape& tape, const Var& in, const Tensor& dest, const Var& probs, int64_t tokens);

}  // namespace mpitron::ag
