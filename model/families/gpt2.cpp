// GPT-2 (GPT2LMHeadModel): LayerNorm, tanh GELU, learned positions, tied, biases, MHA.
#include "core/error.h"
#include "model/arch_fields.h"
#include "model/families/kit.h"
#include "model/families/rows.h"

namespace mpitron {

using namespace family_kit;

namespace {

std::vector<HfKey> gpt2_keys() {
  std::vector<HfKey> v = common_keys();
  v.push_back(field("n_embd", "hidden_size"));
  v.push_back(field("n_layer", "num_layers"));
  v.push_back(field("n_head", "num_attention_heads"));
  v.push_back(positions_key("n_positions", true));
  v.push_back(harmless("n_ctx", "GPT-2's older name of n_positions; transformers reads n_positions"));
  v.back().write = [](const C& c) { return json(c.max_position_embeddings); };
  HfKey inner = field("n_inner", "ffn_hidden_size", false);  // null: 4·n_embd
  v.push_back(inner);
  v.push_back(field("vocab_size", "vocab_size"));
  v.push_back(eps_key("layer_norm_epsilon"));
  v.push_back({"activation_function", false,
               [](const json& v, const json&, C& c) {
                 const std::string a = v.is_string() ? v.get<std::string>() : "";
                 if (a == "gelu_new" || a == "gelu_pytorch_tanh") c.mlp = MlpKind::GeluTanh;
                 else if (a == "gelu") c.mlp = MlpKind::GeluErf;
                 else refuse("activation_function", v, "mpitron's GPT-2 MLP is the tanh GELU (gelu_new) or the erf GELU (gelu)");
               },
               [](const C& c) { return json(c.gelu_erf() ? "gelu" : "gelu_new"); }, ""});
  v.push_back(must("scale_attn_weights", [](const json& x) { return x == true; },
                   "the attention scores are always scaled by 1/sqrt(head dim)"));
  v.push_back(must("scale_attn_by_inverse_layer_idx", [](const json& x) { return x == false; },
                   "mpitron does not divide layer l's attention scores by l + 1"));
  v.push_back(harmless("reorder_and_upcast_attn", "the scores in f32 (mpitron's are f32 in any dtype)"));
  v.push_back(must("add_cross_attention", [](const json& x) { return x == false; }, "GPT-2 has no cross-attention here"));
  v.push_back(must("tie_word_embeddings", [](const json& x) { return x == true; }, "GPT-2's LM head is the tied wte",
                   true));
  for (const char* k : {"resid_pdrop", "embd_pdrop", "attn_pdrop", "summary_first_dropout"})
    v.push_back(harmless(k, "a dropout probability: training only"));
  for (const char* k : {"summary_type", "summary_use_proj", "summary_activation", "summary_proj_to_labels",
                        "task_specific_params"})
    v.push_back(harmless(k, "GPT2DoubleHeadsModel's and pipelines' settings, not GPT2LMHeadModel's"));
  for (const char* k : {"resid_pdrop", "embd_pdrop", "attn_pdrop"})
    for (HfKey& h : v)
      if (h.key == k) h.write = [](const C&) { return json(0.0); };
  return v;
}

// GPT2LMHeadModel's, after "transformer." (Conv1D stores (in, out): transposed).
HfNames gpt2_names() {
  using R = ParamRole;
  const HfTransform T = HfTransform::Transpose;
  const std::string h = "h.{l}.";
  return {{R::WordEmbedding, nm({"wte.weight"}, HfTransform::Copy, {"lm_head.weight"})},
          {R::PositionEmbedding, nm({"wpe.weight"})},
          {R::Norm1Weight, nm({h + "ln_1.weight"})}, {R::Norm1Bias, nm({h + "ln_1.bias"})},
          {R::QkvWeight, nm({h + "attn.c_attn.weight"}, T)}, {R::QkvBias, nm({h + "attn.c_attn.bias"})},
          {R::ProjWeight, nm({h + "attn.c_proj.weight"}, T)}, {R::ProjBias, nm({h + "attn.c_proj.bias"})},
          {R::Norm2Weight, nm({h + "ln_2.weight"})}, {R::Norm2Bias, nm({h + "ln_2.bias"})},
          {R::FcWeight, nm({h + "mlp.c_fc.weight"}, T)}, {R::FcBias, nm({h + "mlp.c_fc.bias"})},
          {R::MlpProjWeight, nm({h + "mlp.c_proj.weight"}, T)}, {R::MlpProjBias, nm({h + "mlp.c_proj.bias"})},
          {R::FinalNormWeight, nm({"ln_f.weight"})}, {R::FinalNormBias, nm({"ln_f.bias"})}};
}

}  // namespace

Family gpt2_family() {
  Family f;
  f.name = "gpt2";
  f.hf_class = "GPT2LMHeadModel";
  f.hf_model_types = {"gpt2"};
  f.hf_classes_read = {"GPT2LMHeadModel", "GPT2Model"};
  f.hf_names = gpt2_names();
  f.pins = join(join(join(decoder_base(), {is("num_experts", 0), is("window_size", 0)}), plain_attention()), {is("normalization", "LayerNorm"),
                          when("mlp", [](const C& c) { return c.mlp == MlpKind::GeluTanh || c.mlp == MlpKind::GeluErf; },
                               "a GELU MLP (no --swiglu)"),
                          is("position_embedding", "learned_absolute"), is("untie_embeddings", false),
                          is("add_bias_linear", true), plain("num_query_groups", "no --group-query-attention"),
                          plain("kv_channels", "no --kv-channels"), plain_ends()[0], plain_ends()[1], is("rope_scaling", nullptr)});
  f.hf_defaults = [](C&) {};  // TransformerConfig's defaults are GPT-2's
  f.hf_keys = gpt2_keys();
  f.hf_prefixes = {"transformer.", ""};  // GPT2LMHeadModel's, and GPT2Model's / the hub's gpt2 file
  f.hf_buffers = {".attn.bias", ".attn.masked_bias"};  // the causal mask buffers
  f.hf_lm_head_copy = true;
  f.hf_single_file = true;
  return f;
}

}  // namespace mpitron
