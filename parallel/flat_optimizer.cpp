#include "parallel/flat_optimizer.h"

#include "core/error.h"
#include "parallel/communicator.h"

#include <algorithm>
#include <cmath>

#include "tensor/elementwise.h"
#include "tensor/norm.h"

namespace mpitron {

FlatOptimizer::FlatOptimizer(const Tensor& values, int64_t begin, const std::vector<FlatParam>& params,
                     const OptimizerConfig& cfg)
    : cfg_(cfg), rule_(make_update_rule(cfg)), begin_(begin), values_(values) {
  const int64_t n = values.numel(), end = begin + n;
  offload_ = cfg.cpu_offload && !values.device().is_cpu();
  const Device state = offload_ ? Device::cpu() : values.device();
  separate_master_ = offload_ || values.dtype() != DType::F32;
  master_ = separate_master_ ? values.to(DType::F32).to(state) : values;
  const size_t states = rule_->state_names().size();  // at most two: OptimState's slots
  MPT_CHECK(states <= 2, str("--optimizer ", rule_->name(), " keeps ", states, " states per element"), "");
  if (states > 0) m_ = Tensor::zeros({n}, DType::F32, state);
  if (states > 1) v_ = Tensor::zeros({n}, DType::F32, state);
  if (offload_ && values.dtype() != DType::F32) host_values_ = Tensor::empty({n}, values.dtype(), state);
  const bool matrix_wise = rule_->matrix_wise();
  for (const FlatParam& p : params) {
    const int64_t lo = std::max(begin, p.offset) - begin, hi = std::min(end, p.offset + p.numel) - begin;
    if (hi <= lo) continue;
    const bool decay = p.weight_decay;  // the amount is the step's (a schedule may start at 0)
    all_in_norm_ = all_in_norm_ && p.in_norm;
    if (matrix_wise && p.rows > 0) {  // a run of its own, whole
      MPT_CHECK(hi - lo == p.numel,
                str("--optimizer ", cfg.optimizer, " orthogonalises each weight matrix whole, but this rank's slice [",
                    begin, ", ", end, ") of the flat parameters cuts a ", p.rows, "x", p.cols, " matrix at offset ",
                    p.offset),
                "use --optimizer dist_muon (the optimizer states sharded by whole tensors) instead of "
                "--use-distributed-optimizer / --zero-stage");
      matrices_.push_back(p);
      segments_.push_back({lo, hi, decay, p.in_norm, static_cast<int>(matrices_.size() - 1)});
      continue;
    }
    Segment& b = segments_.empty() ? segments_.emplace_back(Segment{lo, lo, decay, p.in_norm}) : segments_.back();
    if (b.end == lo && b.decay == decay && b.in_norm == p.in_norm && b.matrix < 0) b.end = hi;
    else segments_.push_back({lo, hi, decay, p.in_norm});
  }
}

void FlatOptimizer::add_sum_squares(const Tensor& grads, const Tensor& sq) const {
  if (grads.numel() == 0) return;
  if (all_in_norm_) {
    sum_squares(grads, sq);
    return;
  }
  for (const Segment& s : segments_)  // model-parallel duplicates count on one rank only
    if (s.in_norm && s.end > s.begin) sum_squares(grads.flat_range(s.begin, s.end - s.begin), sq);
}

StepResult FlatOptimizer::step(const Tensor& grads, double scaled_sq_norm, double unscale, float lr,
                           const std::function<bool(double)>& veto) {
  StepResult r;
  const double scaled_norm = std::sqrt(scaled_sq_norm);
  r.grad_norm = scaled_norm / unscale;
  const bool vetoed = veto && veto(r.grad_norm);
  if (!std::isfinite(scaled_norm) || vetoed) {
    r.skipped = true;
    return r;
  }
  // torch.nn.utils.clip_grad_norm_: coef = max_norm / (norm + 1e-6), applied when < 1.
  double grad_scale = 1.0 / unscale;
  if (cfg_.clip_grad > 0) {
    const double coef = cfg_.clip_grad / (r.grad_norm + 1e-6);
    if (coef < 1.0) grad_scale *= coef;
  }
  ++step_;
  UpdateArgs a;
  a.lr = lr;
  a.grad_scale = static_cast<float>(grad_scale);
  a.step = step_;
  // Offload: the gradients to the host, the update there, the values back.
  const Tensor g = offload_ ? grads.to(Device::cpu()) : grads;
  const Tensor copy = offload_ ? host_values_ : separate_master_ ? values_ : Tensor();
  for (const Segment& s : segments_) {
    const int64_t n = s.end - s.begin;
    if (n <= 0) continue;
    a.weight_decay = s.decay ? cfg_.weight_decay : 0.0f;
    a.param = s.matrix >= 0 ? &matrices_[static_cast<size_t>(s.matrix)] : nullptr;
    std::vector<Tensor> states;
    for (const Tensor* t : {&m_, &v_})
      if (t->defined()) states.push_back(t->flat_range(s.begin, n));
    rule_->apply(master_.flat_range(s.begin, n), g.flat_range(s.begin, n), states,
                 copy.defined() ? copy.flat_range(s.begin, n) : Tensor(), a);
  }
  if (offload_ && values_.numel() > 0) values_.copy_from(host_values_.defined() ? host_values_ : master_);
  return r;
}

StepResult FlatOptimizer::reduced_step(const Tensor& grads, Communicator* dp, Communicator* norm_group, float loss_scale,
                                   float lr, const std::function<bool(double)>& veto, int average) {
  Tensor sq = Tensor::zeros({1}, DType::F32, grads.device());
  add_sum_squares(grads, sq);
  if (dp) dp->all_reduce(sq, ReduceOp::Sum);
  if (norm_group) norm_group->all_reduce(sq, ReduceOp::Sum);
  const double unscale = static_cast<double>(loss_scale) * (average > 0 ? average : dp ? dp->size() : 1);
  return step(grads, static_cast<double>(sq.item()), unscale, lr, veto);
}

void FlatOptimizer::sync_values_from_master() {
  if (!separate_master_ || master_.numel() == 0) return;
  if (!offload_) {
    cast(master_, values_);
    return;
  }
  if (host_values_.defined()) cast(master_, host_values_);
  values_.copy_from(host_values_.defined() ? host_values_ : master_);
}

}  // namespace mpitron
