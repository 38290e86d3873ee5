// model/config_json.h — GPTConfig as the checkpoint's `model_config` JSON attribute.
// The architecture keys (normalization, swiglu, position_embedding, rotary_base,
// rotary_percent, num_query_groups, untie_embeddings, add_bias_linear) are
// optional on read: a checkpoint written before model families is GPT-2.
#pragma once
#include <nlohmann/json.hpp>

#include "model/config.h"

namespace mpitron {

nlohmann::json config_to_json(const GPTConfig& c);
// Throws (naming `where`) when a shape key is missing or an architecture value is unknown.
// Dropouts are 0 and compute_dtype f32 (they are run settings, not the model's).
GPTConfig config_from_json(const nlohmann::json& j, const std::string& where);

}  // namespace mpitron
