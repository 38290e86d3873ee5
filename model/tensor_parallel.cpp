#include "model/tensor_parallel.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "autograd/functions.h"
#include "tensor/ops.h"

namespace mpitron {

void tp_all_reduce(const TensorParallel& tp, const Tensor& t) {
  if (tp.active()) tp.comm->all_reduce(t, ReduceOp::Sum);
}

Tensor tp_all_gather_rows(const TensorParallel& tp, const Tensor& local) {
  if (!tp.active()) return local;
  Shape shape = local.shape();
  shape[0] *= tp.size;
  Tensor full = Tensor::empty(shape, local.dtype(), local.device());
  tp.comm->all_gather(local.contiguous(), full);
  return full;
}

Tensor tp_reduce_scatter_rows(const TensorParallel& tp, const Tensor& full) {
  if (!tp.active()) return full;
  Shape shape = full.shape();
  MPT_CHECK(shape[0] % tp.size == 0,
            str("sequence parallelism splits ", shape[0], " token rows over ", tp.size, " ranks: not divisible"),
            "make micro-batch-size x seq-length divisible by --tensor-model-parallel-size");
  shape[0] /= tp.size;
  Tensor local = Tensor::empty(shape, full.dtype(), full.device());
  tp.comm->reduce_scatter(full.contiguous(), local);
  return local;
}

namespace ag {
namespace {

enum class Region { Copy, Reduce, Gather, Scatter };

// y = forward(x); dx += backward(dy).
Tensor region_forward(Region r, const TensorParallel& tp, const Tensor& x) {
  switch (r) {
    case Region::Copy: return x;
    case Region::Reduce: {
      Tensor y = Tensor::empty(x.shape(), x.dtype(), x.device());
      y.copy_from(x);
      tp_all_reduce(tp, y);
      return y;
    }
    case Region::Gather: return tp_all_gather_rows(tp, x);
    case Region::Scatter: return tp_reduce_scatter_rows(tp, x);
  }
  return x;
}

Tensor region_backward(Region r, const TensorParallel& tp, const Tensor& dy) {
  switch (r) {
    case Region::Copy: {
      Tensor d = Tensor::empty(dy.shape(), dy.dtype(), dy.device());
      d.copy_from(dy);
      tp_all_reduce(tp, d);
      return d;
    }
    case Region::Reduce: return dy;
    case Region::Gather: return tp_reduce_scatter_rows(tp, dy);
    case Region::Scatter: return tp_all_gather_rows(tp, dy);
  }
  return dy;
}

struct RegionNode final : Node {
  Region region = Region::Copy;
  TensorParallel tp;
  Var x, y;
  const char* name() const override { return "tensor_parallel_region"; }
  void backward() override {
    if (!y.grad().defined() || !x.requires_grad()) return;
    const Tensor d = region_backward(region, tp, y.grad());
    axpby(1.0f, d, 1.0f, x.grad_or_zeros());
  }
};

Var region(Tape& tape, Region r, const Var& x, const TensorParallel& tp) {
  if (!tp.active()) return x;
  Var out(region_forward(r, tp, x.value()), x.requires_grad());
  if (tape.recording() && out.requires_grad()) {
    auto n = std::make_unique<RegionNode>();
    n->region = r, n->tp = tp, n->x = x, n->y = out;
    tape.record(std::move(n));
  }
  return out;
}

struct SequenceParallelParamNode final : Node {
  TensorParallel tp;
  Var param, partial;
  const char* name() const override { return "sequence_parallel_param"; }
  void backward() override {
    tp_all_reduce(tp, partial.grad());
    axpby(1.0f, partial.grad(), 1.0f, param.grad_or_zeros());
  }
};

}  // namespace

Var tp_copy(Tape& tape, const Var& x, const TensorParallel& tp) { return region(tape, Region::Copy, x, tp); }
Var tp_reduce(Tape& tape, const Var& x, const TensorParallel& tp) { return region(tape, Region::Reduce, x, tp); }
Var tp_gather(Tape& tape, const Var& x, const TensorParallel& tp) { return region(tape, Region::Gather, x, tp); }
Var tp_scatter(Tape& tape, const Var& x, const TensorParallel& tp) { return region(tape, Region::Scatter, x, tp); }

Var sequence_parallel_param(Tape& tape, const Var& p, const TensorParallel& tp) {
  if (!tp.active() || !tp.sequence_parallel || !tape.recording() || !p.requires_grad()) return p;
  Var partial(p.value(), true, p.name());
  // f32 as the ParamSet's gradients (ZeRO-3 allocates a gathered table's only in its backward)
  partial.set_grad(Tensor::zeros(p.shape(), p.grad().defined() ? p.grad().dtype() : DType::F32, p.value().device()));
  auto n = std::make_unique<SequenceParallelParamNode>();  // recorded first: its backward runs last
  n->tp = tp, n->param = p, n->partial = partial;
  tape.record(std::move(n));
  return partial;
}

Var vocab_parallel_cross_entropy(Tape& tape, const Var& logits, const Tensor& targets, int64_t vocab_start,
                                 const TensorParallel& tp) {
  const Tensor& lv = logits.value();
  const int64_t n = lv.dim(0);
  const std::vector<int64_t> tg = targets.to_ints();
  int64_t valid = 0;
  for (int64_t t : tg) valid += t >= 0;
  const float inv = 1.0f / static_cast<float>(std::max<int64_t>(valid, 1));
  Tensor lse = Tensor::empty({n}, DType::F32, lv.device());
  Tensor tl = Tensor::empty({n}, DType::F32, lv.device());
  cross_entropy_local_stats(lv, targets, vocab_start, lse, tl);
  // Combine the slices: lse = log Σ_r exp(lse_r) (stable), target logit = Σ_r (one rank holds it).
  std::vector<float> lse_h;
  if (tp.active()) {
    Tensor all = Tensor::empty({tp.size * n}, DType::F32, lv.device());
    tp.comm->all_gather(lse, all);
    tp.comm->all_reduce(tl, ReduceOp::Sum);
    const std::vector<float> a = all.to_floats();
    lse_h.resize(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) {
      float m = -std::numeric_limits<float>::infinity();
      for (int r = 0; r < tp.size; ++r) m = std::max(m, a[static_cast<size_t>(r * n + i)]);
      double s = 0;
      for (int r = 0; r < tp.size; ++r) s += std::exp(static_cast<double>(a[static_cast<size_t>(r * n + i)]) - m);
      lse_h[static_cast<size_t>(i)] = static_cast<float>(m + std::log(s));
    }
  } else {
    lse_h = lse.to_floats();
  }
  const std::vector<float> tl_h = tl.to_floats();
  double sum = 0;
  for (int64_t i = 0; i < n; ++i)
    if (tg[static_cast<size_t>(i)] >= 0)
      sum += static_cast<double>(lse_h[static_cast<size_t>(i)]) - tl_h[static_cast<size_t>(i)];
  const bool record = tape.recording() && logits.requires_grad();
  Var out(Tensor::from_vector({static_cast<float>(sum * inv)}, {1}).to(lv.device()), logits.requires_grad());
  if (record) {
    Tensor lse_g = Tensor::from_vector(lse_h, {n}).to(lv.device());
    cross_entropy_grad_from_lse(lv, targets, vocab_start, lse_g, lv, inv);  // in place: the fused classifier
    record_fused_loss(tape, logits, out, lv);
  }
  return out;
}

}  // namespace ag
}  // namespace mpitron
