// model/layers/layer_spec.h — what layer l of a model is made of: a list of residual branches,
// each ONE sublayer (model/layers/sublayer.h) with its norms placed around it. Built once per
// layer from the configuration by layer_spec(): the one place that turns architecture fields into
// sublayer choices (Megatron-Core's layer specs, without Python). The block (model/block.h) runs
// the branches in order and knows no sublayer's kind.
//
// A branch, with x its input and y its output (the next branch's input):
//   Pre            y = x + drop(op(norm(x)))                     GPT-2, Llama and most decoders
//   Sandwich       y = x + drop(norm_out(op(norm(x))))           Gemma 2 / Gemma 3
//   Output         y = x + drop(norm_out(op(x)))                 OLMo-2
//   AfterResidual  y = norm(x + drop(op(x)))                     the original (post-LN) BERT
// A decoder layer: [self-attention, MLP]; a T5 decoder layer [self-attention, cross-attention, MLP];
// the MLP is dense or a Mixture of Experts.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "model/config.h"
#include "model/layers/norm.h"
#include "model/layers/sublayer.h"

namespace mpitron {

enum class NormPlace : uint8_t { Pre, Sandwich, Output, AfterResidual };
const char* to_string(NormPlace p);

// One norm of a branch: its parameters' roles and dataset name ("ln1" → layers.l.ln1.weight / .bias).
struct BranchNorm {
  ParamRole weight = ParamRole::Norm1Weight, bias = ParamRole::Norm1Bias;
  std::string name;
};

struct Branch {
  std::shared_ptr<const Sublayer> op;
  NormPlace place = NormPlace::Pre;
  NormSpec spec{};    // both norms of the branch
  BranchNorm norm;    // the input norm (Pre, Sandwich) or the one after the residual (AfterResidual)
  BranchNorm out;     // the output norm (Sandwich, Output)
  int dropout_slot = 0;  // the output's dropout mask starts at the block's offset + slot·N·C
  bool input_norm() const { return place == NormPlace::Pre || place == NormPlace::Sandwich; }
  bool output_norm() const { return place == NormPlace::Sandwich || place == NormPlace::Output; }
  bool residual_norm() const { return place == NormPlace::AfterResidual; }
};

struct LayerSpec {
  int64_t layer = 0, hidden = 0;
  std::vector<Branch> branches;
  // Every parameter row of the layer, in table order: each branch's first norm, its sublayer's
  // rows, its output norm.
  std::vector<ParamSpec> rows() const;
  // The sublayer of a kind ("self_attention", …), or null.
  const Sublayer* find(const std::string& kind) const;
};

// Layer l of `c`.
std::shared_ptr<const LayerSpec> layer_spec(const TransformerConfig& c, int64_t layer);

}  // namespace mpitron
