#include "autograd/moe.h"

#include "tensor/ops.h"

namespace mpitron::ag {

namespace {
Tensor empty_like(const Tensor& t) { return Tensor::empty(t.shape(), t.dtype(), t.device()); }

struct PermuteNode final : Node {
  Var x, y;
  Tensor dest;
  const char* name() const override { return "moe_permute"; }
  void backward() override {  // dx[n] = Σ_j dy[dest[n·k + j]]
    if (!y.grad().defined() || !x.requires_grad()) return;
    Tensor dx = empty_like(x.value());
    moe_permute_backward(y.grad(), dest, dx);
    axpby(1.0f, dx, 1.0f, x.grad_or_zeros());
  }
};

struct UnpermuteNode final : Node {
  Var in, probs, y;
  Tensor dest;
  const char* name() const override { return "moe_unpermute"; }
  void backward() override {  // din[dest[n·k + j]] = probs[n, j] · dy[n]; dprobs[n, j] = ⟨dy[n], in[...]⟩
    if (!y.grad().defined() || (!in.requires_grad() && !probs.requires_grad())) return;
    Tensor din = empty_like(in.value());
    Tensor dprobs = empty_like(probs.value());
    moe_unpermute_backward(y.grad(), in.value(), dest, probs.value(), din, dprobs);
    if (in.requires_grad()) axpby(1.0f, din, 1.0f, in.grad_or_zeros());
    if (probs.requires_grad()) axpby(1.0f, dprobs, 1.0f, probs.grad_or_zeros());
  }
};
}  // namespace

Var moe_permute(Tape& tape, const Var& x, const Tensor& dest, int64_t rows) {
  Tensor y = Tensor::empty({rows, x.value().dim(1)}, x.value().dtype(), x.value().device());
  moe_permute(x.value(), dest, y);
  Var out(y, x.requires_grad());
  if (tape.recording() && out.requires_grad()) {
    auto n = std::make_unique<PermuteNode>();
    n->x = x, n->y = out, n->dest = dest;
    tape.record(std::move(n));
  }
  return out;
}

Var moe_unpermute(Tape& tape, const Var& in, const Tensor& dest, const Var& probs, int64_t tokens) {
  Tensor y = Tensor::empty({tokens, in.value().dim(1)}, in.value().dtype(), in.value().device());
  moe_unpermute(in.value(), dest, probs.value(), y);
  Var out(y, in.requires_grad() || probs.requires_grad());
  if (tape.recording() && out.requires_grad()) {
    auto n = std::make_unique<UnpermuteNode>();
    n->in = in, n->probs = probs, n->y = out, n->dest = dest;
    tape.record(std::move(n));
  }
  return out;
}

}  // namespace mpitron::ag
