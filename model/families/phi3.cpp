// Phi-3 and Phi-4-mini (Phi3ForCausalLM): Llama's maths — with a sliding window on every layer where the
// config has one, and partial rotary (partial_rotary_factor) — under names of their own: q, k and v fused
// in one qkv_proj, gate and up in one gate_up_proj. Rope scaling (Phi-3's longrope, "su" and the "yarn"
// Phi3Config relabels longrope) is refused by name.
#include "core/error.h"
#include "model/arch_fields.h"
#include "model/families/kit.h"
#include "model/families/rows.h"

namespace mpitron {

using namespace family_kit;

Family phi3_family() {
  Family f;
  f.name = "phi3";
  f.hf_class = "Phi3ForCausalLM";
  f.hf_model_types = {"phi3"};
  f.hf_classes_read = {"Phi3ForCausalLM"};
  f.hf_names = llama_names();
  f.hf_names[ParamRole::QkvWeight] = nm({"model.layers.{l}.self_attn.qkv_proj.weight"});
  f.hf_names[ParamRole::FcWeight] = nm({"model.layers.{l}.mlp.gate_up_proj.weight"});
  f.pins = join(join(join(decoder_base(), plain_attention()), plain_ends()),
                {is("num_experts", 0), is("normalization", "RMSNorm"), is("mlp", "swiglu"), is("position_embedding", "rope"),
                 plain("kv_channels", "no --kv-channels"), is("add_bias_linear", false), is("add_qkv_bias", false),
                 is("rope_scaling", nullptr)});
  f.hf_defaults = [](C& c) {  // Phi3Config's where a key is absent
    llama_config_defaults(c, 4096);
    c.layernorm_epsilon = 1e-5f;
    c.untie_embeddings = true;
  };
  f.hf_keys = llama_core_keys();
  f.hf_keys.push_back(field("partial_rotary_factor", "rotary_percent", false));
  f.hf_keys.push_back(sliding_window_key());
  f.hf_keys.push_back(must("rope_scaling", [](const json& x) { return x.is_null(); },
                           "Phi-3's longrope scaling (and su, or the yarn Phi3Config reads as longrope) is not built",
                           json(nullptr)));
  f.hf_keys.push_back(harmless("original_max_position_embeddings", "read only by longrope scaling, which must be null"));
  for (const char* k : {"embd_pdrop", "resid_pdrop"}) f.hf_keys.push_back(harmless(k, "a dropout probability: training only"));
  for (const char* k : {"attention_bias", "mlp_bias", "lm_head_bias"})
    f.hf_keys.push_back(must(k, [](const json& x) { return x == false; }, "Phi-3 has no biases"));
  for (const char* k : {"full_attn_mod", "interpolate_factor"})
    f.hf_keys.push_back(harmless(k, "Phi-4-mini's config carries it; Phi3ForCausalLM does not read it"));
  // Phi3Config's default pad_token_id (32000) is outside a smaller vocabulary, where transformers refuses the
  // embedding's padding_idx: the export writes none (the tokenizer's setting, not the model's).
  HfKey pad = harmless("pad_token_id", "the tokenizer's, not the model's");
  pad.write = [](const C&) { return json(nullptr); };
  f.hf_keys = with_keys(f.hf_keys, {pad});
  f.hf_buffers = llama_buffers();
  return f;
}

}  // namespace mpitron
