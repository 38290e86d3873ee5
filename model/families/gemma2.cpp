// Gemma 2 (Gemma2ForCausalLM) and Gemma 3's text model (Gemma3ForCausalLM, model_type gemma3_text):
// Gemma's (1 + w) RMSNorms, GeGLU, scaled embeddings and tied head, with sandwich norms (each sublayer's
// input and output normalised), sliding and global layers (layer_types; Gemma 2 alternates, Gemma 3
// slides five of six with a local rope base), the scale query_pre_attn_scalar^−½, Gemma 2's soft-capped
// attention scores and logits, and Gemma 3's QK-norm. transformers 4.57's semantics (its masks: a
// window W is W keys).
#include "core/error.h"
#include "model/arch_fields.h"
#include "model/families/kit.h"
#include "model/families/rows.h"

namespace mpitron {

using namespace family_kit;

namespace {

// A soft cap: a positive number, or null (none); absent: the config class's default.
HfKey softcap_key(const std::string& key, const std::string& field_key, double absent) {
  HfKey k = field(key, field_key, false);
  k.write = [field_key](const C& c) {
    const json v = arch_field(field_key).get(c);
    return v.get<double>() > 0 ? v : json(nullptr);
  };
  if (absent > 0) k.absent = [field_key, absent](C& c) { arch_field(field_key).set(c, absent, field_key); };
  return k;
}

// sliding_window, absent: 4096 (both configs' default); null: none.
HfKey gemma_window_key() {
  HfKey k = sliding_window_key();
  k.absent = [](C& c) { c.window_size = 4096 - 1; };
  return k;
}

// The keys Gemma 2 and Gemma 3 share, in reading order (the window before the layer types); `softcaps`:
// the caps an absent key means (Gemma 2: 50 and 30; Gemma 3: none).
std::vector<HfKey> gemma2_common_keys(double attn_cap, double final_cap) {
  std::vector<HfKey> v = without_keys(gemma_keys(), {"head_dim"});
  v.push_back(head_dim_key());
  v.push_back(field("query_pre_attn_scalar", "query_pre_attn_scalar", false));
  v.push_back(softcap_key("attn_logit_softcapping", "attn_logit_softcapping", attn_cap));
  v.push_back(softcap_key("final_logit_softcapping", "final_logit_softcapping", final_cap));
  v.push_back(gemma_window_key());
  v.push_back(layer_types_key());
  v.push_back(harmless("cache_implementation", "how transformers caches keys, not what it computes"));
  return v;
}

std::vector<HfKey> gemma2_keys() {
  std::vector<HfKey> v = gemma2_common_keys(50, 30);
  v.push_back(must("rope_scaling", [](const json& x) { return x.is_null(); }, "Gemma 2 has no rope scaling"));
  return v;
}

// Gemma3TextConfig's: Gemma 2's with QK-norm, rope_local_base_freq on the sliding layers (rope_theta and
// rope_scaling on the global ones), and sliding_window_pattern (layer_types wins where both are given).
std::vector<HfKey> gemma3_keys() {
  std::vector<HfKey> v = gemma2_common_keys(0, 0);
  v.push_back(rope_scaling_key());
  v.push_back(field("rope_local_base_freq", "rotary_base_local", false));
  for (const char* k : {"sliding_window_pattern", "_sliding_window_pattern"}) {
    v.push_back({k, false,
                 [](const json& x, const json& config, C& c) {
                   if (config.contains("layer_types") && !config["layer_types"].is_null()) return;  // it is read
                   MPT_CHECK(x.is_number_integer() && x.get<int64_t>() >= 1,
                             str("HF config.json key sliding_window_pattern must be an integer >= 1, got ", x.dump()), "");
                   c.window_attn_skip_freq = x.get<int64_t>();
                 },
                 nullptr, ""});
  }
  v.push_back(must("use_bidirectional_attention", [](const json& x) { return x == false; },
                   "Gemma 3's bidirectional attention (an embedding model's) is not built", false));
  return v;
}

HfNames gemma2_names() {
  HfNames n = llama_names();
  const std::string m = "model.layers.{l}.";
  n[ParamRole::Norm1PostWeight] = nm({m + "post_attention_layernorm.weight"});
  n[ParamRole::Norm2Weight] = nm({m + "pre_feedforward_layernorm.weight"});
  n[ParamRole::Norm2PostWeight] = nm({m + "post_feedforward_layernorm.weight"});
  return n;
}

std::vector<FamilyPin> gemma2_pins() {
  return join(decoder_base(),
              {is("num_experts", 0), is("normalization", "RMSNorm"), is("mlp", "geglu"), is("position_embedding", "rope"),
               is("rotary_percent", 1.0), is("layernorm_1p", true), is("scale_embeddings", true),
               is("untie_embeddings", false), is("add_bias_linear", false), is("add_qkv_bias", false),
               is("norm_placement", "sandwich")});
}

void gemma2_defaults(C& c) {  // Gemma2Config's where a key is absent
  c.normalization = Normalization::RMSNorm, c.mlp = MlpKind::GeGLU, c.position_embedding = PositionEmbedding::Rope;
  c.layernorm_1p = true, c.scale_embeddings = true, c.add_bias_linear = false, c.layernorm_epsilon = 1e-6f;
  c.norm_placement = NormPlacement::Sandwich;
  c.kv_channels = 256;
  c.num_query_groups = 16;
  c.max_position_embeddings = c.seq_length = 8192;
  c.query_pre_attn_scalar = 256;
  c.window_attn_skip_freq = 2;  // the window and the soft caps: their keys' `absent`
}

}  // namespace

Family gemma2_family() {
  Family f;
  f.name = "gemma2";
  f.hf_class = "Gemma2ForCausalLM";
  f.hf_model_types = {"gemma2"};
  f.hf_classes_read = {"Gemma2ForCausalLM"};
  f.hf_names = gemma2_names();
  f.pins = join(gemma2_pins(), {is("qk_norm", "none"), is("rotary_base_local", 0.0), is("rope_scaling", nullptr)});
  f.hf_defaults = gemma2_defaults;
  f.hf_keys = gemma2_keys();
  f.hf_buffers = llama_buffers();
  return f;
}

Family gemma3_family() {
  Family f;
  f.name = "gemma3";
  f.hf_class = "Gemma3ForCausalLM";
  f.hf_model_types = {"gemma3_text"};
  f.hf_classes_read = {"Gemma3ForCausalLM"};
  f.hf_names = gemma2_names();
  f.hf_names[ParamRole::QNormWeight] = nm({"model.layers.{l}.self_attn.q_norm.weight"});
  f.hf_names[ParamRole::KNormWeight] = nm({"model.layers.{l}.self_attn.k_norm.weight"});
  f.pins = join(gemma2_pins(), {is("qk_norm", "per_head")});
  f.hf_defaults = [](C& c) {  // Gemma3TextConfig's
    gemma2_defaults(c);
    c.qk_norm = QkNorm::PerHead;
    c.max_position_embeddings = c.seq_length = 131072;
    c.window_attn_skip_freq = 6;
    c.rotary_base = 1e6, c.rotary_base_local = 1e4;
  };
  f.hf_keys = gemma3_keys();
  f.hf_buffers = llama_buffers();
  return f;
}

}  // namespace mpitron
