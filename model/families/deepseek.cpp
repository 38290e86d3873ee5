// DeepSeek-V3 (DeepseekV3ForCausalLM; Kimi K2 and the models built on its config): multi-latent attention
// (model/layers/mla_layer.h) with YaRN rope and its mscale, dense MLPs in the first first_k_dense_replace
// layers, then MoE MLPs of n_routed_experts sigmoid-scored experts — group-limited (n_group, topk_group),
// selected with the e_score_correction_bias (aux-loss-free balancing), the k probabilities renormalised and
// times routed_scaling_factor — plus n_shared_experts always-on experts. transformers 4.57's semantics:
// the rope dims of q_b_proj / q_proj and kv_a_proj_with_mqa are interleaved pairs (rope_interleave), ours
// rotate-half halves: the import reorders those rows (and the export back). The multi-token prediction
// modules (num_nextn_predict_layers, model.layers.{L …}) are read into --mtp-num-layers' MTP layers.
#include "core/error.h"
#include "model/arch_fields.h"
#include "model/families/kit.h"
#include "model/families/rows.h"

namespace mpitron {

using namespace family_kit;

namespace {

// The rows of a weight whose output is heads × [nope (dn) | rope (dr)] (q) or [latent (kr) | rope (dr)]
// (kv_a, one "head" of width kr + dr): our rope half i is HF's interleaved dim 2i, half dr/2 + i dim 2i + 1.
std::vector<int64_t> deinterleave_rows(int64_t heads, int64_t first, int64_t dr) {
  std::vector<int64_t> v;
  for (int64_t h = 0; h < heads; ++h) {
    const int64_t base = h * (first + dr);
    for (int64_t i = 0; i < first; ++i) v.push_back(base + i);
    for (int64_t i = 0; i < dr / 2; ++i) v.push_back(base + first + 2 * i);
    for (int64_t i = 0; i < dr / 2; ++i) v.push_back(base + first + 2 * i + 1);
  }
  return v;
}

HfNames deepseek_names() {
  HfNames n = llama_names();
  const std::string a = "model.layers.{l}.self_attn.";
  using R = ParamRole;
  const auto q_rows = [](const TransformerConfig& c, const ParamSpec&, HfName& x) {
    x.rows = deinterleave_rows(c.num_attention_heads, c.qk_head_dim, c.qk_pos_emb_head_dim);
  };
  HfName q_up = nm({a + "q_b_proj.weight"}), q = nm({a + "q_proj.weight"}), kv_down = nm({a + "kv_a_proj_with_mqa.weight"});
  q_up.adjust = q_rows;
  q.adjust = q_rows;
  kv_down.adjust = [](const TransformerConfig& c, const ParamSpec&, HfName& x) {
    x.rows = deinterleave_rows(1, c.kv_lora_rank, c.qk_pos_emb_head_dim);
  };
  n[R::MlaQDownWeight] = nm({a + "q_a_proj.weight"});
  n[R::MlaQDownNormWeight] = nm({a + "q_a_layernorm.weight"});
  n[R::MlaQUpWeight] = q_up;
  n[R::MlaQWeight] = q;
  n[R::MlaKvDownWeight] = kv_down;
  n[R::MlaKvDownNormWeight] = nm({a + "kv_a_layernorm.weight"});
  n[R::MlaKvUpWeight] = nm({a + "kv_b_proj.weight"});
  // The MTP modules (model.layers.{L + k − 1}.*, DeepSeek's layout; transformers reads none of them): the two
  // norms, the projection, the block as any layer's, and the shared head's norm. Their embed_tokens and
  // shared_head.head are copies of the model's (skipped on import, hf_skip).
  const std::string m = "model.layers.{l}.";
  n[R::MtpEmbedNormWeight] = nm({m + "enorm.weight"});
  n[R::MtpHiddenNormWeight] = nm({m + "hnorm.weight"});
  n[R::MtpProjWeight] = nm({m + "eh_proj.weight"});
  n[R::MtpFinalNormWeight] = nm({m + "shared_head.norm.weight"});
  // Each MTP module's copies of the embedding and the output layer: tied names (checked equal on import,
  // written on export: Family::hf_write_tied).
  const auto mtp_copies = [](const TransformerConfig& c, const std::string& what) {
    std::vector<std::string> v;
    for (int64_t k = 0; k < c.mtp_num_layers; ++k) v.push_back(str("model.layers.", c.num_layers + k, ".", what));
    return v;
  };
  n[R::WordEmbedding].adjust = [mtp_copies](const TransformerConfig& c, const ParamSpec&, HfName& x) {
    x.tied.clear();
    if (!c.untie_embeddings) x.tied.push_back("lm_head.weight");
    for (const std::string& t : mtp_copies(c, "embed_tokens.weight")) x.tied.push_back(t);
    if (!c.untie_embeddings)
      for (const std::string& t : mtp_copies(c, "shared_head.head.weight")) x.tied.push_back(t);
  };
  n[R::OutputWeight].adjust = [mtp_copies](const TransformerConfig& c, const ParamSpec&, HfName& x) {
    x.tied = mtp_copies(c, "shared_head.head.weight");
  };
  add_moe_names(n, {"mlp.", "gate", "gate_proj", "up_proj", "down_proj", "shared_experts.", ""});
  n.erase(R::SharedGateWeight);
  return n;
}

HfKey int_key(const std::string& key, std::function<void(int64_t, C&)> set, std::function<json(const C&)> write,
              int64_t lo = 0) {
  return {key, false,
          [key, set, lo](const json& v, const json&, C& c) {
            MPT_CHECK(v.is_number_integer() && v.get<int64_t>() >= lo,
                      str("HF config.json key ", key, " must be an integer >= ", lo, ", got ", v.dump()), "");
            set(v.get<int64_t>(), c);
          },
          std::move(write), ""};
}

// DeepseekV3Config's keys (transformers 4.57), in reading order.
std::vector<HfKey> deepseek_keys() {
  std::vector<HfKey> v = without_keys(llama_core_keys(), {"num_key_value_heads"});
  v.push_back(rope_scaling_key());
  v.push_back(must("rope_interleave", [](const json& x) { return x == true; },
                   "mpitron reads DeepSeek's interleaved rope dims (rope_interleave true) only", true));
  v.push_back(must("attention_bias", [](const json& x) { return x == false; }, "DeepSeek-V3 has no attention biases", false));
  v.push_back({"num_key_value_heads", false,
               [](const json& x, const json& config, C&) {
                 if (x != config.value("num_attention_heads", json())) refuse("num_key_value_heads", x, "MLA has one key and value per head");
               },
               [](const C& c) { return json(c.num_attention_heads); }, ""});
  v.push_back({"q_lora_rank", false,  // null: a plain q_proj
               [](const json& x, const json&, C& c) {
                 MPT_CHECK(x.is_number_integer() && x.get<int64_t>() >= 1,
                           str("HF config.json key q_lora_rank must be null or an integer >= 1, got ", x.dump()), "");
                 c.q_lora_rank = x.get<int64_t>();
               },
               [](const C& c) { return c.q_lora_rank > 0 ? json(c.q_lora_rank) : json(nullptr); }, ""});
  v.back().absent = [](C& c) { c.q_lora_rank = 1536; };  // DeepseekV3Config's default; null: none
  v.push_back(field("kv_lora_rank", "kv_lora_rank"));
  v.push_back(field("qk_nope_head_dim", "qk_head_dim"));
  v.push_back(field("qk_rope_head_dim", "qk_pos_emb_head_dim"));
  v.push_back(field("v_head_dim", "v_head_dim"));
  v.push_back(must("pretraining_tp", [](const json& x) { return x == 1; },
                   "DeepseekV3ForCausalLM computes its linears whole (pretraining_tp 1)"));
  v.push_back({"qk_head_dim", false,
               [](const json& x, const json& config, C&) {
                 const json want = config.value("qk_nope_head_dim", 128) + config.value("qk_rope_head_dim", 64);
                 if (x != want) refuse("qk_head_dim", x, str("it is qk_nope_head_dim + qk_rope_head_dim = ", want.dump()));
               },
               [](const C& c) { return json(c.qk_head_dim + c.qk_pos_emb_head_dim); }, ""});
  v.push_back(harmless("head_dim", "DeepseekV3Config sets it to qk_rope_head_dim; the MLA sizes above are read"));
  v.back().write = [](const C& c) { return json(c.qk_pos_emb_head_dim); };
  // The MoE MLPs.
  v.push_back(field("n_routed_experts", "num_experts"));
  v.push_back(field("num_experts_per_tok", "moe_router_topk"));
  v.push_back(field("moe_intermediate_size", "moe_ffn_hidden_size"));
  v.push_back(int_key("n_shared_experts", [](int64_t n, C& c) { c.moe_shared_expert_intermediate_size = n * c.moe_ffn(); },
                      [](const C& c) { return json(c.moe_shared_expert_intermediate_size / c.moe_ffn()); }));
  v.push_back(field("routed_scaling_factor", "moe_router_topk_scaling_factor", false));
  v.push_back(field("n_group", "moe_router_num_groups", false));
  v.push_back(field("topk_group", "moe_router_group_topk", false));
  v.push_back(int_key("first_k_dense_replace",
                      [](int64_t k, C& c) {
                        c.moe_layer_pattern.assign(static_cast<size_t>(c.num_layers), 1);
                        for (int64_t l = 0; l < std::min(k, c.num_layers); ++l) c.moe_layer_pattern[static_cast<size_t>(l)] = 0;
                        c.moe_layer_freq = 1;
                      },
                      [](const C& c) {
                        int64_t k = 0;
                        while (k < c.num_layers && !c.is_moe_layer(k)) ++k;
                        for (int64_t l = k; l < c.num_layers; ++l)
                          MPT_CHECK(c.is_moe_layer(l), str("--moe-layer-freq ", arch_field("moe_layer_freq").get(c).dump(),
                                                           " is no first_k_dense_replace (dense layers first, then MoE)"),
                                    "export MoE patterns DeepseekV3ForCausalLM can express");
                        return json(k);
                      }));
  v.back().absent = [](C& c) {  // DeepseekV3Config's default: 3
    c.moe_layer_pattern.assign(static_cast<size_t>(c.num_layers), 1);
    for (int64_t l = 0; l < std::min<int64_t>(3, c.num_layers); ++l) c.moe_layer_pattern[static_cast<size_t>(l)] = 0;
  };
  v.push_back(must("scoring_func", [](const json& x) { return x == "sigmoid"; }, "DeepSeek-V3 scores experts with a sigmoid",
                   "sigmoid"));
  v.push_back(must("topk_method", [](const json& x) { return x == "noaux_tc"; },
                   "the aux-loss-free, group-limited selection (noaux_tc) is what DeepSeek-V3 routes with", "noaux_tc"));
  v.push_back(must("norm_topk_prob", [](const json& x) { return x == true; },
                   "the k sigmoid probabilities are renormalised (norm_topk_prob true)", true));
  v.push_back(must("moe_layer_freq", [](const json& x) { return x == 1; }, "first_k_dense_replace gives the MoE layers", 1));
  for (const char* k : {"aux_loss_alpha", "seq_aux", "ep_size", "router_aux_loss_coef"})
    v.push_back(harmless(k, "a training or runtime setting, not the model's function"));
  v.push_back(field("num_nextn_predict_layers", "mtp_num_layers", false));  // the MTP depth (DeepSeek-V3: 1)
  v.push_back(must("quantization_config", [](const json&) { return false; },
                   "the published DeepSeek-V3 weights are fp8 block-quantized",
                   json()));
  v.back().read = [](const json& x, const json&, C&) {
    refuse("quantization_config", x, "the published DeepSeek-V3 weights are fp8 block-quantized",
           "dequantize them to bf16 first (DeepSeek's fp8_cast_bf16.py) and drop quantization_config");
  };
  return v;
}

}  // namespace

Family deepseek_v3_family() {
  Family f;
  f.name = "deepseek_v3";
  f.hf_class = "DeepseekV3ForCausalLM";
  f.hf_model_types = {"deepseek_v3"};
  f.hf_classes_read = {"DeepseekV3ForCausalLM"};
  f.hf_names = deepseek_names();
  f.hf_expert_bias = "model.layers.{l}.mlp.gate.e_score_correction_bias";
  f.hf_write_tied = true;
  // MTP layers past the depth read (all of them when num_nextn_predict_layers is 0).
  f.hf_skip = [](const C& c, const std::string& name) {
    const std::string p = "model.layers.";
    if (name.rfind(p, 0) != 0) return false;
    const size_t dot = name.find('.', p.size());
    const std::string idx = name.substr(p.size(), dot - p.size());
    if (idx.empty() || idx.find_first_not_of("0123456789") != std::string::npos || std::stoll(idx) < c.num_layers)
      return false;
    return std::stoll(idx) >= c.num_layers + c.mtp_num_layers;
  };
  f.pins = {is("bert", false), is("t5", false), is("causal", true), is("post_ln", false), is("num_tokentypes", 0),
            is("num_classes", 0), is("multi_latent_attention", true), is("normalization", "RMSNorm"), is("mlp", "swiglu"),
            is("position_embedding", "rope"), is("layernorm_1p", false), is("scale_embeddings", false),
            is("add_bias_linear", false), is("add_qkv_bias", false), is("norm_placement", "pre"),
            is("moe_router_score_function", "sigmoid"), is("moe_router_enable_expert_bias", true),
            is("moe_router_pre_softmax", false), is("moe_shared_expert_gate", false), is("moe_router_group_score_topk", 2),
            moe_pin()};
  f.hf_defaults = [](C& c) {  // DeepseekV3Config's where a key is absent
    llama_config_defaults(c, 4096);
    c.multi_latent_attention = true;
    c.q_lora_rank = 0, c.kv_lora_rank = 512, c.qk_head_dim = 128, c.qk_pos_emb_head_dim = 64, c.v_head_dim = 128;
    c.num_experts = 256, c.moe_router_topk = 8, c.moe_ffn_hidden_size = 2048, c.moe_shared_expert_intermediate_size = 2048;
    c.moe_router_score_function = MoeScore::Sigmoid, c.moe_router_enable_expert_bias = true;
    c.moe_router_num_groups = 8, c.moe_router_group_topk = 4, c.moe_router_topk_scaling_factor = 2.5f;
    c.moe_router_group_score_topk = 2;  // transformers' DeepseekV3TopkRouter: the sum of each group's best 2
    c.mtp_num_layers = 0;               // num_nextn_predict_layers
    c.moe_layer_pattern.clear();
  };
  f.hf_keys = deepseek_keys();
  f.hf_buffers = llama_buffers();
  return f;
}

}  // namespace mpitron
