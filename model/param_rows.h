// model/param_rows.h — builders of parameter-table rows (model/param_table.h), shared by the
// table's outer rows and the sublayers that own a block's rows (model/layers/sublayer.h).
#pragma once
#include <string>
#include <utility>
#include <vector>

#include "model/param_table.h"

namespace mpitron {

// A row: name, role, global shape, init, placement (layer for ParamPlace::Layer). Weight decay
// on matrices and embeddings (Normal / OutputNormal init), not on biases and norms.
inline ParamSpec param_row(std::string name, ParamRole role, Shape shape, ParamInit init, ParamPlace place,
                           int64_t layer = -1) {
  ParamSpec s;
  s.name = std::move(name);
  s.role = role;
  s.global_shape = std::move(shape);
  s.init = init;
  s.place = place;
  s.layer = layer;
  s.weight_decay = init == ParamInit::Normal || init == ParamInit::OutputNormal;
  return s;
}
// Split over the tensor-parallel ranks along `axis` (0 rows, 1 columns), in `parts` (global sizes).
inline ParamSpec tp_split(ParamSpec s, int axis, std::vector<int64_t> parts = {}) {
  s.tp_axis = axis;
  s.tp_parts = std::move(parts);
  return s;
}
// A matmul weight (6 FLOPs per element per token).
inline ParamSpec matmul_row(ParamSpec s) {
  s.matmul = true;
  return s;
}
// Axis 0 is the padded vocabulary.
inline ParamSpec vocab_row(ParamSpec s) {
  s.vocab = true;
  return s;
}
// A routed expert's row.
inline ParamSpec expert_row(ParamSpec s, int64_t e) {
  s.expert = e;
  return s;
}

}  // namespace mpitron
