// parallel/newton_schulz.h — the orthogonalisation at the heart of Muon (parallel/muon_rule.cpp):
// the Newton–Schulz iteration that maps a matrix G = U S Vᵀ to about U Vᵀ, as NVIDIA's
// emerging_optimizers (Megatron-Core's Muon) and torch.optim.Muon compute it:
//
//   X = G / max(‖G‖_F, eps)                 on the wide orientation (m ≤ n; a tall G is worked
//                                           on as Gᵀ, without a copy: the products below swap sides)
//   repeat `steps` times, (a, b, c) from the coefficient set:
//     A = X Xᵀ           (m, m)
//     B = b·A + c·A·A    (m, m)
//     X = a·X + B·X      (m, n)
//
// Coefficient sets (--muon-coefficient-type): "simple" (Keller Jordan's (3.4445, -4.7750, 2.0315)),
// "quintic" (five tuples, cycled), "polar_express" (eight, the last repeated), "cans" (five, the last
// repeated) — emerging_optimizers' tables.
// Precision: f32 throughout ("high"), or the products' operands rounded to bf16 with f32 accumulation
// and an f32 X ("medium": Megatron's default --muon-fp32-matmul-prec, what Hopper runs fastest).
// Every step is tensor/gemm.h and tensor/elementwise.h, so it runs wherever they do (CPU BLAS,
// cuBLASLt, the simulated device); one norm read back per matrix.
#pragma once
#include <string>
#include <vector>

#include "tensor/tensor.h"

namespace mpitron {

struct NsCoefficients {
  float a, b, c;
};

// The set's tuples for `steps` iterations (cycled or the last repeated, as the set defines);
// an unknown type is refused naming --muon-coefficient-type.
std::vector<NsCoefficients> ns_coefficients(const std::string& type, int steps);
// The coefficient types built, for the flag's check.
std::vector<std::string> ns_coefficient_types();

class Communicator;

// The matrix's shards over a group (Megatron's --muon-tp-mode distributed): each rank holds g, a block
// of rows (rows_split) or of columns of the whole; the Gram matrix and the norm are summed over the
// group, so every rank's out is its block of the whole's orthogonalisation (the side the split
// leaves whole is the Gram's: Xᵀ X for a row split, X Xᵀ for a column split).
struct NsShards {
  Communicator* group = nullptr;  // null: g is the whole matrix
  bool rows_split = true;
};

// out (m, n) f32 = the orthogonalisation of g (m, n) f32 (out may not alias g). bf16_operands:
// "medium" precision. eps guards a zero matrix (its result is zero).
void newton_schulz(const Tensor& g, const Tensor& out, const std::vector<NsCoefficients>& coefficients,
                   bool bf16_operands = false, float eps = 1e-7f, const NsShards& shards = {});

}  // namespace mpitron
