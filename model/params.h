// model/params.h — every parameter of a model in ONE flat buffer, with views.
//
// The layout is a list of (name, shape, offset) in a fixed order; the value
// buffer holds the compute dtype (what the kernels read), the gradient buffer
// is f32 (gradients accumulate over micro-batches in f32, as Megatron's
// main_grad). Data-parallel buckets, ZeRO shards and checkpoints are slices of
// these buffers, never per-tensor copies.
#pragma once
#include <string>
#include <vector>

#include "autograd/variable.h"

namespace mpitron {

struct ParamInfo {
  std::string name;  // e.g. "layers.3.attn.qkv.weight" (DESIGN.md checkpoint names)
  Shape shape;
  int64_t offset = 0;         // in elements, into the flat buffers
  bool weight_decay = true;   // false for biases and layernorm parameters
  int64_t numel() const { return shape_numel(shape); }
};

class ParamSet {
 public:
  // Declare a parameter; call before allocate().
  void add(const std::string& name, const Shape& shape, bool weight_decay);
  // Create the flat value (dtype) and f32 grad buffers on `device` and the Vars.
  void allocate(DType dtype, Device device);

  int64_t numel() const { return total_; }
  const std::vector<ParamInfo>& infos() const { return infos_; }
  const ParamInfo& info(const std::string& name) const;
  const Var& var(const std::string& name) const;
  const Var& var(size_t i) const { return vars_[i]; }
  const Tensor& values() const { return values_; }  // (numel) compute dtype
  const Tensor& grads() const { return grads_; }    // (numel) f32
  void zero_grad() const { grads_.zero(); }

 private:
  std::vector<ParamInfo> infos_;
  std::vector<Var> vars_;
  Tensor values_, grads_;
  int64_t total_ = 0;
};

}  // namespace mpitron
