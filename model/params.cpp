#include "model/params.h"

#include <algorithm>

namespace mpitron {

namespace {
// A parameter seen as (rows, cols): 1-D tensors are (n, 1).
int64_t rows_of(const Shape& s) { return s.empty() ? 1 : s[0]; }
int64_t cols_of(const Shape& s) { return s.size() < 2 ? 1 : shape_numel(s) / s[0]; }
}  // namespace

int64_t global_element(const ParamInfo& p, int64_t i) {
  if (p.tp.axis < 0) return i;
  const int64_t cols = cols_of(p.shape), row = i / cols, col = i % cols;
  const int64_t gcols = cols_of(p.global_shape);
  if (p.tp.axis == 0) {
    const int64_t lp = rows_of(p.shape) / p.tp.parts, gp = rows_of(p.global_shape) / p.tp.parts;
    const int64_t grow = (row / lp) * gp + p.tp.rank * lp + row % lp;
    return grow * gcols + col;
  }
  const int64_t lp = cols / p.tp.parts, gp = gcols / p.tp.parts;
  return row * gcols + (col / lp) * gp + p.tp.rank * lp + col % lp;
}

std::vector<GlobalPiece> global_pieces(const ParamInfo& p, int64_t begin, int64_t end) {
  MPT_CHECK(0 <= begin && begin <= end && end <= p.numel(),
            str("global_pieces(", p.name, "): range [", begin, ", ", end, ") outside ", p.numel(), " elements"), "");
  MPT_CHECK(p.tp.axis != 1 || p.tp.parts == 1, str(p.name, ": column split in several parts is not supported"), "");
  const bool two_d = p.global_shape.size() == 2;
  const int64_t cols = cols_of(p.shape);
  const int64_t lp = p.tp.axis == 0 ? rows_of(p.shape) / p.tp.parts : rows_of(p.shape);  // rows per part
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
      nrows = std::min(nrows, lp - row % lp);  // a run of rows stays inside one part
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
  values_ = Tensor::zeros({total_}, dtype, device);
  grads_ = Tensor::zeros({total_}, DType::F32, device);
  vars_.clear();
  for (const ParamInfo& p : infos_) {
    Var v(values_.flat_range(p.offset, p.numel()).view(p.shape), true, p.name);
    v.set_grad(grads_.flat_range(p.offset, p.numel()).view(p.shape));
    vars_.push_back(v);
  }
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

}  // namespace mpitron
