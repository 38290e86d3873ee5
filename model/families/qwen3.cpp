// Qwen3 (Qwen3ForCausalLM) and Qwen3-MoE (Qwen3MoeForCausalLM): Llama's block with QK-norm (an RMSNorm
// over each query and key head, one weight of the head width, before rope) and a head width of its own;
// Qwen3-MoE's MLPs are experts (no shared expert), the top-k renormalised with norm_topk_prob.
#include "core/error.h"
#include "model/arch_fields.h"
#include "model/families/kit.h"
#include "model/families/rows.h"

namespace mpitron {

using namespace family_kit;

namespace {

// Qwen3Config's keys (transformers 4.57): Llama's core, head_dim, QK-norm always on, no biases; a sliding
// window only with use_sliding_window (the published configs have none: refused).
std::vector<HfKey> qwen3_keys() {
  std::vector<HfKey> v = llama_core_keys();
  v.push_back(head_dim_key());
  v.push_back(rope_scaling_key());
  v.push_back(must("attention_bias", [](const json& x) { return x == false; },
                   "mpitron's Qwen3 has no attention biases (the published Qwen3 configs have none)", false));
  v.push_back(must("use_sliding_window", [](const json& x) { return x == false; },
                   "Qwen3's sliding window (use_sliding_window true) is not built", false));
  v.push_back(harmless("sliding_window", "read only with use_sliding_window, which must be false"));
  v.push_back(harmless("max_window_layers", "read only with use_sliding_window, which must be false"));
  v.push_back(must("layer_types", [](const json& x) {
                     if (!x.is_array()) return false;
                     for (const json& t : x)
                       if (t != "full_attention") return false;
                     return true;
                   },
                   "every Qwen3 layer attends globally here (no sliding_attention)"));
  return v;
}

HfNames qwen3_names() {
  HfNames n = llama_names();
  n[ParamRole::QNormWeight] = nm({"model.layers.{l}.self_attn.q_norm.weight"});
  n[ParamRole::KNormWeight] = nm({"model.layers.{l}.self_attn.k_norm.weight"});
  return n;
}

std::vector<FamilyPin> qwen3_pins() {
  return join(join(decoder_base(), plain_ends()),
              {is("window_size", 0), is("normalization", "RMSNorm"), is("mlp", "swiglu"), is("position_embedding", "rope"),
               is("rotary_percent", 1.0), is("qk_norm", "per_head"), is("norm_placement", "pre"),
               is("attn_logit_softcapping", 0.0), is("final_logit_softcapping", 0.0), is("query_pre_attn_scalar", 0.0),
               is("add_bias_linear", false), is("add_qkv_bias", false)});
}

void qwen3_defaults(C& c) {  // Qwen3Config's where a key is absent
  llama_config_defaults(c, 32768);
  c.qk_norm = QkNorm::PerHead;
  c.kv_channels = 128;
  c.num_query_groups = 32;
}

// Qwen3MoeConfig's: Qwen3's with MoE MLPs where (l + 1) % decoder_sparse_step == 0 and l is not in
// mlp_only_layers (dense MLPs of intermediate_size there), experts of moe_intermediate_size.
std::vector<HfKey> qwen3_moe_keys() {
  std::vector<HfKey> v = qwen3_keys();
  moe_common_keys(v, "num_experts");
  v.push_back(field("moe_intermediate_size", "moe_ffn_hidden_size"));
  v.push_back(bool_key("norm_topk_prob", [](bool t, C& c) { c.moe_router_pre_softmax = !t; },
                       [](const C& c) { return json(!c.moe_router_pre_softmax); }));
  const auto pattern = [](const json& config, C& c) {
    const int64_t step = config.value("decoder_sparse_step", int64_t{1});
    MPT_CHECK(step >= 1, str("HF config.json key decoder_sparse_step must be >= 1, got ", step), "");
    std::vector<int64_t> dense;
    if (config.contains("mlp_only_layers") && !config["mlp_only_layers"].is_null()) {
      MPT_CHECK(config["mlp_only_layers"].is_array(), "HF config.json key mlp_only_layers must be a list of layers", "");
      for (const json& l : config["mlp_only_layers"]) {
        MPT_CHECK(l.is_number_integer() && l.get<int64_t>() >= 0 && l.get<int64_t>() < c.num_layers,
                  str("HF config.json mlp_only_layers entry ", l.dump(), " is not a layer of ", c.num_layers), "");
        dense.push_back(l.get<int64_t>());
      }
    }
    c.moe_layer_pattern.clear();
    c.moe_layer_freq = 1;
    bool all = true;
    std::vector<uint8_t> p;
    for (int64_t l = 0; l < c.num_layers; ++l) {
      bool moe = (l + 1) % step == 0;
      for (const int64_t d : dense) moe &= d != l;
      p.push_back(moe);
      all &= moe;
    }
    if (!all) c.moe_layer_pattern = p;
  };
  v.push_back({"decoder_sparse_step", false, [pattern](const json&, const json& config, C& c) { pattern(config, c); },
               [](const C& c) {  // the pattern as mlp_only_layers over a step of 1
                 (void)c;
                 return json(1);
               },
               ""});
  v.push_back({"mlp_only_layers", false, [pattern](const json&, const json& config, C& c) { pattern(config, c); },
               [](const C& c) {
                 json a = json::array();
                 for (int64_t l = 0; l < c.num_layers; ++l)
                   if (!c.is_moe_layer(l)) a.push_back(l);
                 return a;
               },
               ""});
  return v;
}

}  // namespace

Family qwen3_family() {
  Family f;
  f.name = "qwen3";
  f.hf_class = "Qwen3ForCausalLM";
  f.hf_model_types = {"qwen3"};
  f.hf_classes_read = {"Qwen3ForCausalLM"};
  f.hf_names = qwen3_names();
  f.pins = join(qwen3_pins(), {is("num_experts", 0)});
  f.hf_defaults = qwen3_defaults;
  f.hf_keys = qwen3_keys();
  f.hf_buffers = llama_buffers();
  return f;
}

Family qwen3_moe_family() {
  Family f;
  f.name = "qwen3_moe";
  f.hf_class = "Qwen3MoeForCausalLM";
  f.hf_model_types = {"qwen3_moe"};
  f.hf_classes_read = {"Qwen3MoeForCausalLM"};
  f.hf_names = qwen3_names();
  add_moe_names(f.hf_names, {"mlp.", "gate", "gate_proj", "up_proj", "down_proj", "", ""});
  f.pins = join(join(qwen3_pins(), moe_router()), {moe_pin(), is("moe_shared_expert_intermediate_size", 0)});
  f.hf_defaults = [](C& c) {
    qwen3_defaults(c);
    c.kv_channels = 128, c.num_query_groups = 4;
    c.num_experts = 128, c.moe_router_topk = 8, c.moe_ffn_hidden_size = 768;
    c.moe_router_pre_softmax = true;  // norm_topk_prob false
  };
  f.hf_keys = qwen3_moe_keys();
  f.hf_buffers = llama_buffers();
  return f;
}

}  // namespace mpitron
