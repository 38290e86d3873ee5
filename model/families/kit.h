// model/families/kit.h — what the family rows (model/families/*.cpp) are written with: pins on
// the architecture fields, config.json keys, HF tensor names by role, and the pieces the families
// built on Llama share. A family is one file of rows, registered in model/families/registry.cpp
// (docs/model-families.md "Adding a family").
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "model/families.h"

namespace mpitron::family_kit {

using json = nlohmann::json;
using C = TransformerConfig;

// ---- pins: what a family is
FamilyPin is(const std::string& key, const json& value);                 // the field equals value
FamilyPin plain(const std::string& key, std::string need);               // the field has its default
FamilyPin when(const std::string& key, std::function<bool(const C&)> ok, std::string need);
std::vector<FamilyPin> join(std::vector<FamilyPin> a, const std::vector<FamilyPin>& b);
// Every decoder: causal, pre-LN, no BERT heads.
std::vector<FamilyPin> decoder_base();
// The attention and block of the families that predate the sublayer options: no QK-norm, norms before
// the sublayers, no soft-capping, the 1/√HD scale, every layer alike (no window pattern, one rope base).
std::vector<FamilyPin> plain_attention();
// Llama and the families built on it: RMSNorm, SwiGLU, rope over every dim, heads of C / NH.
std::vector<FamilyPin> llama_like();
// Gemma's choices, which the other decoders lack.
std::vector<FamilyPin> plain_ends();
// A buffer older Llama-family checkpoints saved.
const std::vector<std::string>& llama_buffers();

// ---- config.json keys
[[noreturn]] void refuse(const std::string& key, const json& v, const std::string& why, const std::string& hint = "");
HfKey harmless(const std::string& key, const std::string& note);  // no change to the model's function
HfKey field(const std::string& key, const std::string& field_key, bool required = true);  // sets an arch field
HfKey must(const std::string& key, std::function<bool(const json&)> ok, const std::string& why,
           const json& written = json());
HfKey bool_key(const std::string& key, std::function<void(bool, C&)> set, std::function<json(const C&)> write);
std::vector<HfKey> common_keys();                        // every PretrainedConfig's harmless keys
HfKey positions_key(const std::string& key, bool required);  // max_position_embeddings (and the import's length)
HfKey eps_key(const std::string& key);
// Keys of a list, replaced by (or, when absent, added as) those of `over` with the same key.
std::vector<HfKey> with_keys(std::vector<HfKey> keys, const std::vector<HfKey>& over);
std::vector<HfKey> without_keys(std::vector<HfKey> keys, const std::vector<std::string>& drop);

// ---- keys of the families that transformers 4.5x added (their semantics as 4.57 computes them)
// rope_scaling: transformers' object, through the rope_scaling row (tensor/rope.h): llama3, linear, dynamic,
// yarn (longrope, su, mrope refused by name). dynamic's and yarn's original context defaults to the
// config's max_position_embeddings, as transformers reads it; a dynamic model's positions reach
// factor × that (the export writes the config's back).
HfKey rope_scaling_key();
// head_dim: each head's width, decoupled from hidden_size / num_attention_heads.
HfKey head_dim_key();
// sliding_window as 4.57 masks it: query i sees keys i − W + 1 … i (W keys: window_size W − 1); null, or
// at least max_position_embeddings: none.
HfKey sliding_window_key();
// layer_types: "sliding_attention" / "full_attention" per layer (the window pattern).
HfKey layer_types_key();

// ---- tensor names
HfName nm(std::vector<std::string> names, HfTransform t = HfTransform::Copy, std::vector<std::string> tied = {});

// ---- Llama's, shared by the families built on it
std::vector<HfKey> llama_core_keys();
HfNames llama_names();
// LlamaConfig's defaults where a key is absent (RMSNorm, SwiGLU, rope, untied, no biases, eps 1e-6);
// `positions`: the config's max_position_embeddings (also the import's sequence length).
void llama_config_defaults(C& c, int64_t positions);
// Gemma's keys (GeGLU with the tanh GELU, head_dim, no biases), which Gemma 2 and 3 build on.
std::vector<HfKey> gemma_keys();
// The MoE keys the MoE families share: experts (under `experts_key`), top-k, training-only router settings.
void moe_common_keys(std::vector<HfKey>& v, const std::string& experts_key);
// An MoE MLP's pins: experts, a softmax router with no scaling.
FamilyPin moe_pin();
std::vector<FamilyPin> moe_router();

}  // namespace mpitron::family_kit
