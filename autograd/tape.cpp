#include "autograd/tape.h"

namespace mpitron {

Node* Tape::record(std::unique_ptr<Node> node, bool recompute) {
  if (!recording_) return nullptr;
  if (recompute) {
    MPT_CHECK(node->supports_recompute(), str("node ", node->name(), " cannot be recomputed"),
              "only mark nodes whose forward can be replayed (e.g. transformer blocks)");
    node->mark_recompute(true);
    node->release_saved();
  }
  nodes_.push_back(std::move(node));
  return nodes_.back().get();
}

void Tape::backward(const Var& loss, float seed) {
  MPT_CHECK(loss.defined() && loss.requires_grad(), "backward() of a value that does not require grad",
            "was the forward run inside a NoGradGuard?");
  loss.grad_or_zeros().fill(seed);
  run_backward();
}

void Tape::backward(const Var& output, const Tensor& grad) {
  MPT_CHECK(output.defined() && output.requires_grad(), "backward() of a value that does not require grad",
            "was the forward run inside a NoGradGuard?");
  MPT_CHECK(grad.defined() && grad.shape() == output.shape(),
            str("backward(): gradient ", grad.defined() ? grad.describe() : "undefined", " for an output of shape ",
                shape_str(output.shape())),
            "");
  output.grad_or_zeros().copy_from(grad);
  run_backward();
}

void Tape::run_backward() {
  for (auto it = nodes_.rbegin(); it != nodes_.rend(); ++it) {
    Node& n = **it;
    if (n.recompute_marked()) n.recompute();
    n.set_weight_grad_sink(defer_);
    n.backward();
    it->reset();  // free what the node saved as soon as it is used
  }
  nodes_.clear();
}

}  // namespace mpitron
