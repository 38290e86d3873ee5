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
#pragma once
#include <memory>
#include <vector>

#include "autograd/variable.h"

namespace mpitron {

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

 private:
  bool recompute_ = false;
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
  size_t size() const { return nodes_.size(); }

 private:
  void run_backward();
  std::vector<std::unique_ptr<Node>> nodes_;
  bool recording_ = true;
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
