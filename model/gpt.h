// model/gpt.h — the GPT-2 architecture model.
//
//   x0 = dropout(wte[tokens] + wpe[positions])       (N, C), N = B·T
//   x_l+1 = block_l(x_l)                              l = 0 … L-1
//   logits = LN_f(x_L) · wteᵀ                         (N, V)  (tied LM head)
//   loss = mean cross-entropy(logits, targets)
// Parameter names and order (also the checkpoint's dataset names):
//   wte (V, C), wpe (P, C), layers.{l}.{ln1.weight, ln1.bias, attn.qkv.weight (3C, C),
//   attn.qkv.bias, attn.proj.weight (C, C), attn.proj.bias, ln2.weight, ln2.bias,
//   mlp.fc.weight (F, C), mlp.fc.bias, mlp.proj.weight (C, F), mlp.proj.bias}, lnf.weight, lnf.bias.
// The qkv rows are Q (C rows), then K, then V, heads contiguous in each.
#pragma once
#include <cstdint>
#include <functional>

#include "autograd/tape.h"
#include "model/block.h"
#include "model/config.h"
#include "model/params.h"

namespace mpitron {

struct ForwardOptions {
  bool recompute = false;     // --recompute-activations: whole-block recompute
  uint64_t dropout_seed = 0;  // names every dropout mask of this micro-batch
  bool train = true;          // false: no dropout
  // Called during backward when the gradients of parameters [first, end) (indices
  // in ParamSet order) are final for this micro-batch: data parallelism starts
  // reducing their bucket while backward continues. Parameters never reported
  // (embeddings, final LN) are final when Tape::backward returns.
  std::function<void(size_t first, size_t end)> grads_ready;
};

class GPT {
 public:
  GPT(const GPTConfig& cfg, Device device);

  const GPTConfig& config() const { return cfg_; }
  ParamSet& params() { return params_; }
  const ParamSet& params() const { return params_; }
  Device device() const { return device_; }

  // Megatron-style init from (seed): N(0, std) for matrices and embeddings,
  // std/sqrt(2L) for the two output projections of each block, zero biases,
  // LN weight 1 / bias 0. Uses Philox, so it is identical on every backend.
  void init_weights(uint64_t seed);

  // tokens: (B, T) i32 and targets (B, T) i32 on any device (targets < 0 ignored).
  // Returns the mean loss (1) f32; when the tape records, backward() fills the grads.
  Var forward(Tape& tape, const Tensor& tokens, const Tensor& targets, const ForwardOptions& opt);
  // Logits (B·T, V) in the compute dtype, no loss (evaluation / generation).
  Tensor logits(const Tensor& tokens);

 private:
  Var trunk(Tape& tape, const Tensor& tokens, const ForwardOptions& opt);  // LN_f output (N, C)

  GPTConfig cfg_;
  Device device_;
  ParamSet params_;
  std::vector<BlockParams> blocks_;
};

}  // namespace mpitron
