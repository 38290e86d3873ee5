#include "model/params.h"

#include <algorithm>

namespace mpitron {

namespace {
// A parameter seen as (rows, cols): 1-D tensors are (n, 1).
int64_t rows_of(const Shape& s) { return s.empty() ? 1 : s[0]; }
int64_t cols_of(const Shape& s) { return s.size() < 2 ? 1 : shape_numel(s) / s[0]; }
}  // namespace

namespace {
// Where local index `j` along the split axis lies in the global axis; `run` gets
// how many local indices from j on stay inside the same block.
int64_t global_index(const TPShard& t, int64_t local_extent, int64_t global_extent, int64_t j, int64_t* run = nullptr) {
  const std::vector<int64_t> parts = t.parts.empty() ? std::vector<int64_t>{global_extent} : t.parts;
  int64_t lstart = 0, gstart = 0;
  for (const int64_t gp : parts) {
    const int64_t lp = gp / t.size;
    if (j < lstart + lp) {
      if (run) *run = lstart + lp - j;
      return gstart + t.rank * lp + (j - lstart);
    }
    lstart += lp;
    gstart += gp;
  }
  MPT_THROW(str("local index ", j, " outside the ", local_extent, " of a tensor-parallel split"), "");
}
}  // namespace

int64_t global_element(const ParamInfo& p, int64_t i) {
  if (p.tp.axis < 0) return i;
  const int64_t cols = cols_of(p.shape), row = i / cols, col = i % cols;
  const int64_t gcols = cols_of(p.global_shape);
  if (p.tp.axis == 0) return global_index(p.tp, rows_of(p.shape), rows_of(p.global_shape), row) * gcols + col;
  return row * gcols + global_index(p.tp, cols, gcols, col);
}

std::vector<GlobalPiece> global_pieces(const ParamInfo& p, int64_t begin, int64_t end) {
  MPT_CHECK(0 <= begin && begin <= end && end <= p.numel(),
            str("global_pieces(", p.name, "): range [", begin, ", ", end, ") outside ", p.numel(), " elements"), "");
  MPT_CHECK(p.tp.axis != 1 || p.tp.parts.size() <= 1, str(p.name, ": column split in several parts is not supported"), "");
  const bool two_d = p.global_shape.size() == 2;
  const int64_t cols = cols_of(p.shape);
  std::vector<GlobalPiece> out;
  int64_t i = begin;
  while (i < end) {
    const int64_t row = i / cols, col = i % cols;
    int64_t nrows = 1, ncols;
    if (col != 0 || end - i < cols) {
      ncols = std::min(cols - col, end - i);
    } else {
      ncols = cols;
      nrows = (end - i) / cols;
      int64_t run = rows_of(p.shape) - row;  // a run of rows stays inside one part
      if (p.tp.axis == 0) global_index(p.tp, rows_of(p.shape), rows_of(p.global_shape), row, &run);
      nrows = std::min(nrows, run);
    }
    const int64_t g = global_element(p, i);
    const int64_t gcols = cols_of(p.global_shape);
    GlobalPiece piece;
    piece.local_begin = i;
    if (two_d) {
      piece.start = {g / gcols, g % gcols};
      piece.count = {nrows, ncols};
    } else {
      piece.start = {g};
      piece.count = {nrows * ncols};
    }
    out.push_back(piece);
    i += nrows * ncols;
  }
  return out;
}

void ParamSet::add(const std::string& name, const Shape& shape, bool weight_decay) {
  ParamInfo p;
  p.name = name;
  p.shape = shape;
  p.weight_decay = weight_decay;
  add(std::move(p));
}

void ParamSet::add(ParamInfo p) {
  MPT_CHECK(!values_.defined(), str("ParamSet::add(", p.name, ") after allocate()"), "");
  for (const ParamInfo& q : infos_) MPT_CHECK(q.name != p.name, str("parameter ", p.name, " declared twice"), "");
  if (p.global_shape.empty()) p.global_shape = p.shape;
  p.offset = total_;
  total_ += p.numel();
  infos_.push_back(std::move(p));
}

bool ParamSet::has(const std::string& name) const {
  for (const ParamInfo& p : infos_)
    if (p.name == name) return true;
  return false;
}

size_t ParamSet::index(const std::string& name) const {
  for (size_t i = 0; i < infos_.size(); ++i)
    if (infos_[i].name == name) return i;
  MPT_THROW(str("no parameter named ", name), "");
}

void ParamSet::allocate(DType dtype, Device device) {
  dtype_ = dtype, device_ = device;
  values_ = Tensor::zeros({total_}, dtype, device);
  grads_ = Tensor::zeros({total_}, DType::F32, device);
  vars_.clear();
  for (const ParamInfo& p : infos_) {
    Var v(values_.flat_range(p.offset, p.numel()).view(p.shape), true, p.name);
    v.set_grad(grads_.flat_range(p.offset, p.numel()).view(p.shape));
    vars_.push_back(v);
  }
}

void ParamSet::release_buffers() {
  values_ = grads_ = Tensor();
  for (Var& v : vars_) v.set_storage(Tensor(), Tensor());
}

void ParamSet::restore_values() {
  MPT_CHECK(!vars_.empty(), "ParamSet::restore_values() before allocate()", "");
  const DType dtype = dtype_;
  values_ = Tensor::empty({total_}, dtype, device_);
  for (size_t i = 0; i < infos_.size(); ++i)
    vars_[i].set_storage(values_.flat_range(infos_[i].offset, infos_[i].numel()).view(infos_[i].shape), Tensor());
}

void ParamSet::point(size_t i, const Tensor& value, const Tensor& grad) {
  const Shape& s = infos_.at(i).shape;
  vars_[i].set_storage(value.defined() ? value.view(s) : Tensor(), grad.defined() ? grad.view(s) : Tensor());
}

const ParamInfo& ParamSet::info(const std::string& name) const {
  for (const ParamInfo& p : infos_)
    if (p.name == name) return p;
  MPT_THROW(str("no parameter named ", name), "");
}

const Var& ParamSet::var(const std::string& name) const {
  for (size_t i = 0; i < infos_.size(); ++i)
    if (infos_[i].name == name) return vars_[i];
  MPT_THROW(str("no parameter named ", name), "");
}

const Var& ParamSet::var(ParamRole role) const {
  for (size_t i = 0; i < infos_.size(); ++i)
    if (infos_[i].role == role) return vars_[i];
  MPT_THROW(str("no ", to_string(role), " parameter on this rank"), "");
}

bool ParamSet::has(ParamRole role) const {
  for (const ParamInfo& p : infos_)
    if (p.role == role) return true;
  return false;
}

}  // namespace mpitron
