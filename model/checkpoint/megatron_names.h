// model/checkpoint/megatron_names.h — mpitron's parameter table in Megatron-Core GPTModel's
// names and TP splits, shared by the reader (megatron_checkpoint.cpp) and the writer
// (megatron_save.cpp) of Megatron checkpoints, so that one table maps both ways.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "core/error.h"
#include "io/torch_value.h"
#include "model/config.h"
#include "model/param_table.h"

namespace mpitron {

// A Megatron tensor and how it is split over Megatron's TP ranks.
struct MegTensor {
  std::string name;            // without the layer: "embedding.word_embeddings.weight", "self_attention.linear_qkv.weight"
  std::string local_name;      // the local (non-TE) spec's name in a legacy state dict ("" = same)
  int64_t layer = -1;          // a block's: the global layer
  int tp_axis = -1;            // 0 rows, 1 columns
  std::vector<int64_t> parts;  // column-parallel parts (SwiGLU's gate | up)
  bool qkv = false;            // rows interleaved per query group
  std::string full(int64_t local_layer) const {
    return layer < 0 ? name : str("decoder.layers.", local_layer, ".", name);
  }
  std::string full_local(int64_t local_layer) const {
    const std::string& n = local_name.empty() ? name : local_name;
    return layer < 0 ? n : str("decoder.layers.", local_layer, ".", n);
  }
};

// The Megatron tensor of one row of mpitron's parameter table; throws naming a parameter that
// GPTModel has no counterpart for.
MegTensor megatron_of(const ParamSpec& s, const GPTConfig& c);

// Megatron's row of mpitron's qkv row r (Q | K | V → per query group [q_g; k_g; v_g]).
int64_t megatron_qkv_row(const GPTConfig& c, int64_t r);

// The model configuration Megatron-LM's args (argparse.Namespace) describe; throws naming an
// argument that makes a model mpitron does not build. `where` names the file in errors.
GPTConfig megatron_config_of_args(const io::PyValue& args, const std::string& where);

}  // namespace mpitron
