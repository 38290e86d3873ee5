// parallel/muon_rule.cpp — Muon as Megatron-Core 0.16 runs it (TensorParallelMuon over
// emerging_optimizers' OrthogonalizedOptimizer, chained with Adam for the rest), one UpdateRule
// (parallel/update_rule.h) so every way of holding model states gets it:
//
// A weight matrix W (FlatParam::rows > 0), its gradient g (already unscaled and clipped: grad_scale):
//   buf = μ·buf + (1 − μ)·g                                  --muon-momentum μ (0.95)
//   u   = Nesterov ? (1 − μ)·g + μ·buf : buf                 --muon-use-nesterov
//   W  *= 1 − lr·wd                                          decoupled weight decay
//   per block of W (a fused qkv: q, k and v apart, --muon-no-split-qkv: whole):
//     O  = newton_schulz(u_block)                            parallel/newton_schulz.h
//     W_block −= lr · scale(rows, cols) · extra · O          --muon-scale-mode, --muon-extra-scale-factor
//   scale: spectral √max(rows, cols) | unit_rms_norm √(rows/cols) | shape_scaling √max(1, rows/cols)
//   (torch.optim.Muon's default learning-rate adjustment is shape_scaling).
// Under tensor parallelism (--muon-tp-mode): blockwise orthogonalises each rank's shard and scales by
// its shape; duplicated all-gathers the block over the tp group, orthogonalises the whole on every
// rank, keeps the rank's part and scales by the whole's shape; distributed keeps the shards and sums
// each iteration's Gram matrix over the group (NsShards): the whole's update, without gathering it.
// Everything else (embeddings, the output layer, norms, biases: FlatParam::rows 0) takes the adam rule
// (parallel/update_rule.cpp) with --adam-beta1/2, --adam-eps and the same learning rate, as Megatron chains it.
// States: exp_avg (a matrix's momentum buffer, AdamW's first moment) and exp_avg_sq (AdamW's second;
// zeros beside a matrix — one buffer of the flat slice's size serves both kinds).
#include <cmath>

#include "core/error.h"
#include "parallel/communicator.h"
#include "parallel/flat_optimizer.h"
#include "parallel/newton_schulz.h"
#include "parallel/update_rule.h"
#include "tensor/elementwise.h"

namespace mpitron {
namespace {

double muon_scale(const std::string& mode, int64_t rows, int64_t cols) {
  const double r = static_cast<double>(rows), c = static_cast<double>(cols);
  if (mode == "spectral") return std::sqrt(std::max(r, c));
  if (mode == "unit_rms_norm") return std::sqrt(r / c);
  if (mode == "shape_scaling") return std::sqrt(std::max(1.0, r / c));
  MPT_THROW(str("--muon-scale-mode ", mode, " is not built"), "use spectral, unit_rms_norm or shape_scaling");
}

class MuonRule final : public UpdateRule {
 public:
  explicit MuonRule(const OptimizerConfig& c)
      : c_(c), coefficients_(ns_coefficients(c.muon_coefficients, c.muon_ns_steps)), scalar_(scalar_rule(c)) {
    muon_scale(c.muon_scale_mode, 1, 1);  // an unknown mode is refused before the first step
    MPT_CHECK(c.muon_matmul_prec == "medium" || c.muon_matmul_prec == "high" || c.muon_matmul_prec == "low",
              str("--muon-fp32-matmul-prec ", c.muon_matmul_prec, " is not low, medium or high"), "");
    MPT_CHECK(c.muon_tp_mode == "blockwise" || c.muon_tp_mode == "duplicated" || c.muon_tp_mode == "distributed",
              str("--muon-tp-mode ", c.muon_tp_mode, " is unknown"), "use blockwise, duplicated or distributed");
  }
  const char* name() const override { return "muon"; }  // dist_muon's states are the same: checkpoints interchange
  std::vector<std::string> state_names() const override { return {"exp_avg", "exp_avg_sq"}; }
  bool matrix_wise() const override { return true; }

  void apply(const Tensor& master, const Tensor& grad, const std::vector<Tensor>& s, const Tensor& copy,
             const UpdateArgs& u) const override {
    if (!u.param) {  // the scalar optimizer: --optimizer adam's rule on the same two states
      scalar_->apply(master, grad, s, copy, u);
      return;
    }
    const FlatParam& p = *u.param;
    const float mu = c_.muon_momentum;
    const Tensor& buf = s[0];
    axpby((1.0f - mu) * u.grad_scale, grad, mu, buf);  // buf = μ·buf + (1 − μ)·g
    Tensor upd = buf;
    if (c_.muon_nesterov) {  // (1 − μ)·g + μ·buf
      upd = Tensor::empty({p.numel}, DType::F32, master.device());
      axpby(mu, buf, 0.0f, upd);
      axpby((1.0f - mu) * u.grad_scale, grad, 1.0f, upd);
    }
    if (u.weight_decay != 0.0f) scale(master, 1.0f - u.lr * u.weight_decay);
    const Tensor orth = Tensor::empty({p.numel}, DType::F32, master.device());
    std::vector<int64_t> parts = c_.muon_split_qkv ? p.row_parts : std::vector<int64_t>{};
    if (parts.empty()) parts = {p.rows};
    int64_t r0 = 0;
    for (const int64_t rows : parts) {
      const Tensor x = upd.flat_range(r0 * p.cols, rows * p.cols).view({rows, p.cols});
      const Tensor o = orth.flat_range(r0 * p.cols, rows * p.cols).view({rows, p.cols});
      const bool dup = c_.muon_tp_mode != "blockwise" && p.tp_size > 1 && p.tp_axis >= 0;  // the whole's update
      if (dup && c_.muon_tp_mode == "duplicated") duplicated(x, o, p);
      else if (dup) newton_schulz(x, o, coefficients_, bf16(), 1e-7f, NsShards{tp_group(), p.tp_axis == 0});
      else newton_schulz(x, o, coefficients_, bf16(), 1e-7f);
      const int64_t gr = dup && p.tp_axis == 0 ? rows * p.tp_size : rows;
      const int64_t gc = dup && p.tp_axis == 1 ? p.cols * p.tp_size : p.cols;
      const double sc = muon_scale(c_.muon_scale_mode, gr, gc) * c_.muon_extra_scale;
      axpby(static_cast<float>(-u.lr * sc), orth.flat_range(r0 * p.cols, rows * p.cols), 1.0f,
            master.flat_range(r0 * p.cols, rows * p.cols));
      r0 += rows;
    }
    MPT_CHECK(r0 == p.rows, str("muon: the blocks of a ", p.rows, "-row matrix add up to ", r0, " rows"), "");
    if (copy.defined()) cast(master, copy);
  }

 private:
  bool bf16() const { return c_.muon_matmul_prec != "high"; }
  Communicator* tp_group() const {
    MPT_CHECK(c_.tp, str("--muon-tp-mode ", c_.muon_tp_mode, ": no tensor-parallel group was given to the optimizer"), "");
    return c_.tp;
  }

  // o (rows, cols) = this rank's part of the orthogonalised whole of x's block over the tp group.
  void duplicated(const Tensor& x, const Tensor& o, const FlatParam& p) const {
    Communicator& tp = *tp_group();
    const int n = tp.size(), r = tp.rank();
    // Work with the cut axis as rows: a column split (row-parallel weight) transposed, as NS(Mᵀ) = NS(M)ᵀ.
    const bool cols = p.tp_axis == 1;
    const Tensor mine = cols ? x.transpose(0, 1).contiguous() : x;  // (k, m): k the cut axis' local size
    const int64_t k = mine.dim(0), m = mine.dim(1);
    const Tensor whole = Tensor::empty({k * n, m}, DType::F32, x.device());
    tp.all_gather(mine, whole);
    const Tensor out = Tensor::empty({k * n, m}, DType::F32, x.device());
    newton_schulz(whole, out, coefficients_, bf16(), 1e-7f);
    const Tensor part = out.slice(0, r * k, (r + 1) * k);
    if (cols) o.copy_from(part.transpose(0, 1).contiguous());
    else o.copy_from(part.contiguous());
  }

  // --muon-scalar-optimizer adam: the rules table's adam row (AdamW with --adam-beta1/2, --adam-eps).
  static std::unique_ptr<UpdateRule> scalar_rule(OptimizerConfig c) {
    c.optimizer = "adam";
    return make_update_rule(c);
  }

  OptimizerConfig c_;
  std::vector<NsCoefficients> coefficients_;
  std::unique_ptr<UpdateRule> scalar_;
};

}  // namespace

std::unique_ptr<UpdateRule> make_muon_rule(const OptimizerConfig& cfg) { return std::make_unique<MuonRule>(cfg); }

}  // namespace mpitron
