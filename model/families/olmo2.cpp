// OLMo-2 (Olmo2ForCausalLM): Llama's SwiGLU block with the norms moved onto the sublayers' outputs
// (x += norm(attention(x)), x += norm(mlp(x)): no norm before them) and QK-norm over each token's whole
// query and key widths (q_norm of NH·HD, k_norm of G·HD values, before the heads are split and rope).
#include "core/error.h"
#include "model/arch_fields.h"
#include "model/families/kit.h"
#include "model/families/rows.h"

namespace mpitron {

using namespace family_kit;

Family olmo2_family() {
  Family f;
  f.name = "olmo2";
  f.hf_class = "Olmo2ForCausalLM";
  f.hf_model_types = {"olmo2"};
  f.hf_classes_read = {"Olmo2ForCausalLM"};
  const std::string m = "model.layers.{l}.";
  f.hf_names = llama_names();
  f.hf_names[ParamRole::Norm1PostWeight] = nm({m + "post_attention_layernorm.weight"});
  f.hf_names[ParamRole::Norm2PostWeight] = nm({m + "post_feedforward_layernorm.weight"});
  f.hf_names[ParamRole::QNormWeight] = nm({m + "self_attn.q_norm.weight"});
  f.hf_names[ParamRole::KNormWeight] = nm({m + "self_attn.k_norm.weight"});
  f.pins = join(join(decoder_base(), plain_ends()),
                {is("num_experts", 0), is("window_size", 0), is("normalization", "RMSNorm"), is("mlp", "swiglu"),
                 is("position_embedding", "rope"), is("rotary_percent", 1.0), plain("kv_channels", "no --kv-channels"),
                 is("qk_norm", "full_width"), is("norm_placement", "output"), is("attn_logit_softcapping", 0.0),
                 is("final_logit_softcapping", 0.0), is("query_pre_attn_scalar", 0.0), is("add_bias_linear", false),
                 is("add_qkv_bias", false)});
  f.hf_defaults = [](C& c) {  // Olmo2Config's where a key is absent
    llama_config_defaults(c, 2048);
    c.layernorm_epsilon = 1e-5f;
    c.qk_norm = QkNorm::FullWidth;
    c.norm_placement = NormPlacement::Output;
  };
  f.hf_keys = llama_core_keys();
  f.hf_keys.push_back(rope_scaling_key());
  f.hf_keys.push_back(must("attention_bias", [](const json& x) { return x == false; },
                           "mpitron's OLMo-2 has no attention biases (the published configs have none)", false));
  f.hf_buffers = llama_buffers();
  return f;
}

}  // namespace mpitron
