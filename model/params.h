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
#include "model/param_table.h"

namespace mpitron {

// How one tensor-parallel rank's piece is cut out of the global parameter.
//   axis -1: replicated (every TP rank holds the whole tensor);
//   axis 0/1: split along rows/columns. The global axis is cut into consecutive
//   blocks of global sizes `parts` (empty: one block, the whole axis; qkv under GQA:
//   NH·HD, G·HD, G·HD) and each block is split evenly over the TP ranks, so local
//   block j holds global rows [start_j + rank·parts[j]/size, … + parts[j]/size).
struct TPShard {
  int axis = -1;
  std::vector<int64_t> parts;
  int rank = 0, size = 1;
};

struct ParamInfo {
  std::string name;  // e.g. "layers.3.attn.qkv.weight" (docs/checkpoint-format.md)
  Shape shape;                // this rank's (local) shape
  int64_t offset = 0;         // in elements, into the flat buffers
  bool weight_decay = true;   // false for biases and layernorm parameters
  Shape global_shape;         // the whole tensor (== shape unless TP-split)
  TPShard tp;
  int64_t global_offset = 0;  // offset in the single-rank layout (names the init's random stream)
  // This rank is the one copy that counts (grad norm) and is saved: false for a
  // TP-replicated parameter on tp rank > 0 and for the tied word embedding's
  // copy on the last pipeline stage.
  bool canonical = true;
  bool expert = false;        // a routed expert's (held by one ep rank; its gradient reduced over the edp group)
  ParamRole role = ParamRole::WordEmbedding;  // from the parameter table (model/param_table.h)
  ParamInit init = ParamInit::Normal;
  int64_t numel() const { return shape_numel(shape); }
};

// Global element index (row-major in global_shape) of local element `i` of p.
int64_t global_element(const ParamInfo& p, int64_t i);

// A rectangle of the global tensor whose elements, in row-major order, are
// local elements [local_begin, local_begin + numel) of the parameter.
struct GlobalPiece {
  int64_t local_begin = 0;
  Shape start, count;  // in global_shape coordinates
  int64_t numel() const { return shape_numel(count); }
};
// The local elements [begin, end) of p as global rectangles, in local order.
std::vector<GlobalPiece> global_pieces(const ParamInfo& p, int64_t begin, int64_t end);

class ParamSet {
 public:
  // Declare a parameter; call before allocate(). `global_shape` empty: same as shape.
  void add(const std::string& name, const Shape& shape, bool weight_decay);
  void add(ParamInfo info);  // info.offset is assigned here
  // Create the flat value (dtype) and f32 grad buffers on `device` and the Vars.
  void allocate(DType dtype, Device device);

  int64_t numel() const { return total_; }
  const std::vector<ParamInfo>& infos() const { return infos_; }
  const ParamInfo& info(const std::string& name) const;
  bool has(const std::string& name) const;
  size_t index(const std::string& name) const;
  const Var& var(const std::string& name) const;
  // The parameter of a role outside the blocks (wte, lnf.weight, head.weight, …: one per
  // role; model/param_table.h). has(role): this rank holds it.
  const Var& var(ParamRole role) const;
  bool has(ParamRole role) const;
  const Var& var(size_t i) const { return vars_[i]; }
  const Tensor& values() const { return values_; }  // (numel) compute dtype
  const Tensor& grads() const { return grads_; }    // (numel) f32
  void zero_grad() const { grads_.zero(); }

  // ZeRO-3 (model/training/states_zero3.cpp) holds the values and gradients itself:
  // release_buffers() drops both flat buffers (values() and grads() undefined, every
  // Var released); restore_values() allocates a whole value buffer again, every Var's
  // value a view of it (gradients released); point() sets parameter i's value and
  // gradient to (shape) tensors of the caller's (either may be undefined).
  void release_buffers();
  void restore_values();
  void point(size_t i, const Tensor& value, const Tensor& grad);

 private:
  std::vector<ParamInfo> infos_;
  std::vector<Var> vars_;
  Tensor values_, grads_;
  int64_t total_ = 0;
  DType dtype_ = DType::F32;
  Device device_ = Device::cpu();
};

}  // namespace mpitron
