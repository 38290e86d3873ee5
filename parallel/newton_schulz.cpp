#include "parallel/newton_schulz.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "core/error.h"
#include "parallel/communicator.h"
#include "tensor/elementwise.h"
#include "tensor/gemm.h"
#include "tensor/norm.h"

namespace mpitron {
namespace {

struct CoefficientSet {
  const char* name;
  bool repeat_last;  // after the table: its last tuple again (else the table cycles)
  std::vector<NsCoefficients> table;
};

// emerging_optimizers' muon_utils tables (the values rounded to f32 there too).
const std::vector<CoefficientSet>& sets() {
  static const std::vector<CoefficientSet> s = {
      {"simple", false, {{3.4445f, -4.7750f, 2.0315f}}},
      {"quintic",
       false,
       {{4.0848f, -6.8946f, 2.9270f},
        {3.9505f, -6.3029f, 2.6377f},
        {3.7418f, -5.5913f, 2.3037f},
        {2.8769f, -3.1427f, 1.2046f},
        {2.8366f, -3.0525f, 1.2012f}}},
      {"polar_express",
       true,
       {{8.2051f, -22.9019f, 16.4607f},
        {4.0664f, -2.8612f, 0.5184f},
        {3.9096f, -2.8234f, 0.5250f},
        {3.2856f, -2.4153f, 0.4853f},
        {2.2779f, -1.6198f, 0.3985f},
        {1.8726f, -1.2307f, 0.3585f},
        {1.8564f, -1.2132f, 0.3568f},
        {1.8750f, -1.2500f, 0.3750f}}},
      {"cans",
       true,
       {{8.4703f, -25.1081f, 18.6293f},
        {4.1828f, -3.1087f, 0.5806f},
        {3.9619f, -2.9541f, 0.5630f},
        {3.2866f, -2.4647f, 0.5074f},
        {2.2737f, -1.6447f, 0.4162f}}},
  };
  return s;
}

}  // namespace

std::vector<std::string> ns_coefficient_types() {
  std::vector<std::string> v;
  for (const CoefficientSet& s : sets()) v.push_back(s.name);
  return v;
}

std::vector<NsCoefficients> ns_coefficients(const std::string& type, int steps) {
  MPT_CHECK(steps >= 1, str("--muon-num-ns-steps ", steps, " is not a positive number of iterations"),
            "the default is 5");
  for (const CoefficientSet& s : sets()) {
    if (type != s.name) continue;
    std::vector<NsCoefficients> v;
    const size_t n = s.table.size();
    for (int i = 0; i < steps; ++i) {
      const size_t k = static_cast<size_t>(i);
      v.push_back(s.table[s.repeat_last ? std::min(k, n - 1) : k % n]);
    }
    return v;
  }
  std::string built;
  for (const std::string& t : ns_coefficient_types()) built += (built.empty() ? "" : ", ") + t;
  MPT_THROW(str("--muon-coefficient-type ", type, " is not built"), str("use one of ", built));
}

void newton_schulz(const Tensor& g, const Tensor& out, const std::vector<NsCoefficients>& coefficients,
                   bool bf16_operands, float eps, const NsShards& shards) {
  MPT_CHECK(g.ndim() == 2 && g.dtype() == DType::F32 && out.shape() == g.shape() && out.dtype() == DType::F32,
            "newton_schulz: g and out must be (m, n) f32", "");
  const int64_t m = g.dim(0), n = g.dim(1);
  // Worked on as gᵀ (the Gram matrix gᵀg, the update X·B) when tall, or when its rows are a shard.
  const bool tall = shards.group ? shards.rows_split : m > n;
  const int64_t k = tall ? n : m;
  const Device dev = g.device();

  // X = g / max(‖g‖_F, eps)
  Tensor sq = Tensor::zeros({1}, DType::F32, dev);
  sum_squares(g, sq);
  if (shards.group) shards.group->all_reduce(sq, ReduceOp::Sum);
  const double norm = std::sqrt(static_cast<double>(sq.item()));
  Tensor x = out, next = Tensor::empty({m, n}, DType::F32, dev);
  axpby(static_cast<float>(1.0 / std::max(norm, static_cast<double>(eps))), g, 0.0f, x);

  Tensor a = Tensor::empty({k, k}, DType::F32, dev), b = Tensor::empty({k, k}, DType::F32, dev);
  // "medium": the products read bf16 copies (f32 accumulation, f32 results).
  Tensor xh, ah, bh;
  if (bf16_operands) {
    xh = Tensor::empty({m, n}, DType::BF16, dev);
    ah = Tensor::empty({k, k}, DType::BF16, dev);
    bh = Tensor::empty({k, k}, DType::BF16, dev);
  }
  auto op = [&](const Tensor& t, const Tensor& h) -> const Tensor& {
    if (!h.defined()) return t;
    cast(t, h);
    return h;
  };
  for (const NsCoefficients& c : coefficients) {
    const Tensor& xo = op(x, xh);
    GemmArgs gram;  // A = X Xᵀ (m, m), or Xᵀ X (n, n) for a tall X
    gram.trans_a = tall;
    gram.trans_b = !tall;
    gemm(xo, xo, a, gram);
    if (shards.group) shards.group->all_reduce(a, ReduceOp::Sum);  // the whole's Gram matrix
    if (c.c != 0.0f) {  // B = b·A + c·A·A
      const Tensor& ao = op(a, ah);
      GemmArgs sqr;
      sqr.alpha = c.c;
      gemm(ao, ao, b, sqr);
      axpby(c.b, a, 1.0f, b);
    } else {
      axpby(c.b, a, 0.0f, b);
    }
    const Tensor& bo = op(b, bh);
    if (tall) gemm(xo, bo, next);  // X·B (B is symmetric)
    else gemm(bo, xo, next);       // B·X
    axpby(c.a, x, 1.0f, next);     // + a·X
    std::swap(x, next);
  }
  if (x.data_ptr() != out.data_ptr()) out.copy_from(x);
}

}  // namespace mpitron
