// autograd/tape.h — the tape: nodes recorded in forward order, replayed backwards.
//
// An op's forward computes its output and, when the tape is recording, records
// one Node holding only what its backward needs. Tape::backward() seeds the
// loss gradient and calls each node's backward() in reverse order; a backward
// reads its outputs' grads and ACCUMULATES (+=) into its inputs' grads, so a
// value used twice receives the sum.
//
// Coarse nodes are first class: a whole transformer block is one node with a
// hand-written backward (model/). A node may support recompute (activation
// checkpointing): if marked, the tape calls release_saved() right after it is
// recorded (dropping activations, keeping the input) and recompute() just before
// its backward (replaying the forward from the saved input).
//
// Split backward (zero-bubble pipelines): with set_defer_weight_grads(w), nodes
// that can (the transformer block) compute only their input gradients in
// backward() and append their weight-gradient work to w, which the caller runs
// later (a schedule's W action). Other nodes compute everything in backward().
#pragma once
#include <functional>
#include <memory>
#include <utility>
#include <vector>

#include "autograd/variable.h"

namespace mpitron {

// Weight-gradient work a split backward deferred. Each task holds (by reference
// count) the tensors it reads, so what W needs stays alive until it runs.
struct WeightGradWork {
  std::vector<std::function<void()>> tasks;
  void add(std::function<void()> f) { tasks.push_back(std::move(f)); }
  bool empty() const { return tasks.empty(); }
  size_t size() const { return tasks.size(); }
  // Runs every task in order, then drops them (and what they held).
  void run() {
    std::vector<std::function<void()>> t;
    t.swap(tasks);
    for (auto& f : t) f();
  }
};

class Node {
 public:
  virtual ~Node() = default;
  virtual const char* name() const = 0;
  virtual void backward() = 0;
  virtual bool supports_recompute() const { return false; }
  virtual void release_saved() {}
  virtual void recompute() {}
  bool recompute_marked() const { return recompute_; }
  void mark_recompute(bool on) { recompute_ = on; }
  // Where backward() may defer weight-gradient work (null: do it now).
  WeightGradWork* weight_grad_sink() const { return sink_; }
  void set_weight_grad_sink(WeightGradWork* w) { sink_ = w; }

 private:
  bool recompute_ = false;
  WeightGradWork* sink_ = nullptr;
};

class Tape {
 public:
  Tape() = default;
  Tape(const Tape&) = delete;
  Tape& operator=(const Tape&) = delete;

  bool recording() const { return recording_; }
  void set_recording(bool on) { recording_ = on; }

  // Take ownership of a node (no-op, returning nullptr, when not recording).
  Node* record(std::unique_ptr<Node> node, bool recompute = false);

  // Seed d(loss) = seed (loss must be a single element or seed is broadcast),
  // run every node's backward in reverse, then clear the tape.
  void backward(const Var& loss, float seed = 1.0f);
  // Seed d(output) = grad (same shape; e.g. the gradient a pipeline stage
  // received for its output activation), then as above.
  void backward(const Var& output, const Tensor& grad);
  // Drop every node (and what they saved) without running backward.
  void clear() { nodes_.clear(); }
  // Nodes that can defer their weight gradients append them to `w` during the
  // next backward()s (null: off, the default).
  void set_defer_weight_grads(WeightGradWork* w) { defer_ = w; }
  size_t size() const { return nodes_.size(); }

 private:
  void run_backward();
  std::vector<std::unique_ptr<Node>> nodes_;
  bool recording_ = true;
  WeightGradWork* defer_ = nullptr;
};

// Within its scope the tape records nothing (evaluation, generation).
class NoGradGuard {
 public:
  explicit NoGradGuard(Tape& t) : tape_(t), prev_(t.recording()) { t.set_recording(false); }
  ~NoGradGuard() { tape_.set_recording(prev_); }

 private:
  Tape& tape_;
  bool prev_;
};

}  // namespace mpitron
