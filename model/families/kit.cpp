#include "model/families/kit.h"

#include "core/error.h"
#include "model/arch_fields.h"

namespace mpitron::family_kit {

// The field equals `value`.
FamilyPin is(const std::string& key, const json& value) {
  const ArchField& f = arch_field(key);
  return {key, [&f, value](const C& c) { return f.get(c) == value; }, f.text(value)};
}

// The field has its default for this configuration (kv_channels: C / NH; groups: NH).
FamilyPin plain(const std::string& key, std::string need) {
  const ArchField& f = arch_field(key);
  return {key,
          [&f](const C& c) {
            C d = c;
            f.reset(d);
            return f.get(d) == f.get(c);
          },
          std::move(need)};
}

FamilyPin when(const std::string& key, std::function<bool(const C&)> ok, std::string need) {
  return {key, std::move(ok), std::move(need)};
}

std::vector<FamilyPin> join(std::vector<FamilyPin> a, const std::vector<FamilyPin>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

// ---- config.json keys

[[noreturn]] void refuse(const std::string& key, const json& v, const std::string& why, const std::string& hint) {
  MPT_THROW(str("HF config.json key ", key, " = ", v.dump(), " is not supported: ", why), hint);
}

// A key that does not change the model's function (token ids, dtype, dropout, …).
HfKey harmless(const std::string& key, const std::string& note) { return {key, false, nullptr, nullptr, note}; }

// A key that sets an architecture field through its row (type and bounds are the row's).
HfKey field(const std::string& key, const std::string& field_key, bool required) {
  const ArchField& f = arch_field(field_key);
  return {key, required,
          [&f, key](const json& v, const json&, C& c) { f.set(c, v, "HF config.json key " + key); },
          [&f](const C& c) { return f.get(c); }, ""};
}

// A key whose value must satisfy ok (else refused with why); export writes `written`.
HfKey must(const std::string& key, std::function<bool(const json&)> ok, const std::string& why,
           const json& written) {
  return {key, false,
          [key, ok, why](const json& v, const json&, C&) {
            if (!ok(v)) refuse(key, v, why);
          },
          written.is_null() ? std::function<json(const C&)>() : [written](const C&) { return written; }, ""};
}

HfKey bool_key(const std::string& key, std::function<void(bool, C&)> set, std::function<json(const C&)> write) {
  return {key, false,
          [key, set](const json& v, const json&, C& c) {
            MPT_CHECK(v.is_boolean(), str("HF config.json key ", key, " must be true or false, got ", v.dump()), "");
            set(v.get<bool>(), c);
          },
          std::move(write), ""};
}

// Keys of every PretrainedConfig that do not change the function.
std::vector<HfKey> common_keys() {
  std::vector<HfKey> v;
  for (const char* k : {"_name_or_path", "architectures", "model_type", "transformers_version"})
    v.push_back(harmless(k, "names the checkpoint, not the function"));
  v.push_back(harmless("torch_dtype", "the storage dtype: every tensor is widened exactly to f32"));
  v.push_back(harmless("dtype", "the storage dtype (transformers >= 4.56's name): every tensor is widened exactly to f32"));
  for (const char* k : {"bos_token_id", "eos_token_id", "pad_token_id", "tokenizer_class"})
    v.push_back(harmless(k, "the tokenizer's, not the model's"));
  for (const char* k : {"use_cache", "output_attentions", "output_hidden_states", "return_dict", "_attn_implementation",
                        "gradient_checkpointing", "chunk_size_feed_forward"})
    v.push_back(harmless(k, "how transformers runs, not what it computes"));
  v.push_back(harmless("initializer_range", "the init of a fresh model; the weights are read"));
  return v;
}

// max_position_embeddings: the positions, and the training length of an imported model.
HfKey positions_key(const std::string& key, bool required) {
  HfKey k = field(key, "max_position_embeddings", required);
  const auto read = k.read;
  k.read = [read, key](const json& v, const json& config, C& c) {
    read(v, config, c);
    MPT_CHECK(c.max_position_embeddings <= (int64_t{1} << 31),
              str("HF config.json key ", key, " must be in [1, 2147483648], got ", v.dump()), "");
    c.seq_length = c.max_position_embeddings;
  };
  // Dynamic NTK rope: the config's context is the original one (ours reaches factor × it).
  k.write = [](const C& c) {
    return json(c.rope_scaling.type == RopeScalingType::Dynamic ? c.rope_scaling.original_max_position_embeddings
                                                                 : c.max_position_embeddings);
  };
  return k;
}

HfKey eps_key(const std::string& key) {
  HfKey k = field(key, "layernorm_epsilon", false);
  k.write = [](const C& c) { return json(hf_short_float(c.layernorm_epsilon)); };
  return k;
}

std::vector<FamilyPin> decoder_base() {
  return {is("bert", false), is("t5", false), is("causal", true), is("post_ln", false), is("num_tokentypes", 0),
          is("num_classes", 0), is("multi_latent_attention", false), is("mtp_num_layers", 0)};
}

std::vector<FamilyPin> plain_attention() {
  return {is("qk_norm", "none"), is("norm_placement", "pre"), is("attn_logit_softcapping", 0.0),
          is("final_logit_softcapping", 0.0), is("query_pre_attn_scalar", 0.0), is("window_attn_skip_freq", 0),
          is("rotary_base_local", 0.0), is("multi_latent_attention", false)};
}

std::vector<FamilyPin> llama_like() {
  return {is("normalization", "RMSNorm"), is("mlp", "swiglu"), is("position_embedding", "rope"), is("rotary_percent", 1.0),
          plain("kv_channels", "no --kv-channels")};
}

std::vector<FamilyPin> plain_ends() { return {is("layernorm_1p", false), is("scale_embeddings", false)}; }

const std::vector<std::string>& llama_buffers() {
  static const std::vector<std::string> b = {"rotary_emb.inv_freq"};
  return b;
}

std::vector<HfKey> with_keys(std::vector<HfKey> keys, const std::vector<HfKey>& over) {
  for (const HfKey& o : over) {
    bool replaced = false;
    for (HfKey& k : keys)
      if (k.key == o.key) k = o, replaced = true;
    if (!replaced) keys.push_back(o);
  }
  return keys;
}

std::vector<HfKey> without_keys(std::vector<HfKey> keys, const std::vector<std::string>& drop) {
  std::vector<HfKey> v;
  for (HfKey& k : keys) {
    bool gone = false;
    for (const std::string& d : drop) gone |= k.key == d;
    if (!gone) v.push_back(std::move(k));
  }
  return v;
}

// The keys of Llama's config.json that the families built on it share.
std::vector<HfKey> llama_core_keys() {
  std::vector<HfKey> v = common_keys();
  v.push_back(field("hidden_size", "hidden_size"));
  v.push_back(field("intermediate_size", "ffn_hidden_size"));
  v.push_back(field("num_attention_heads", "num_attention_heads"));
  v.push_back(field("num_hidden_layers", "num_layers"));
  v.push_back(field("vocab_size", "vocab_size"));
  v.push_back(field("num_key_value_heads", "num_query_groups", false));
  v.push_back(positions_key("max_position_embeddings", false));
  v.push_back(eps_key("rms_norm_eps"));
  v.push_back(field("rope_theta", "rotary_base", false));
  v.push_back(must("hidden_act", [](const json& x) { return x == "silu" || x == "swish"; }, "the SwiGLU MLP gates with silu",
                   "silu"));
  v.push_back(bool_key("tie_word_embeddings", [](bool t, C& c) { c.untie_embeddings = !t; },
                       [](const C& c) { return json(!c.untie_embeddings); }));
  v.push_back(harmless("attention_dropout", "a dropout probability: training only"));
  v.back().write = [](const C&) { return json(0.0); };
  return v;
}

// The MoE keys Mixtral and Qwen2-MoE share: experts, top-k, and the training-only router settings.
void moe_common_keys(std::vector<HfKey>& v, const std::string& experts_key) {
  v.push_back(field(experts_key, "num_experts"));
  v.push_back(field("num_experts_per_tok", "moe_router_topk"));
  v.push_back(harmless("output_router_logits", "whether transformers returns the router logits and aux loss"));
  v.back().write = [](const C&) { return json(false); };
  v.push_back(harmless("router_aux_loss_coef", "the load-balancing loss's coefficient: training only "
                                               "(mpitron's --moe-aux-loss-coeff, a run setting; not exported)"));
}

HfName nm(std::vector<std::string> names, HfTransform t, std::vector<std::string> tied) {
  HfName n;
  n.names = std::move(names);
  n.transform = t;
  n.tied = std::move(tied);
  return n;
}

// LlamaForCausalLM's, and the families built on it: model.layers.{l}.*.
HfNames llama_names() {
  using R = ParamRole;
  const std::string m = "model.layers.{l}.", a = m + "self_attn.", f = m + "mlp.";
  HfName wte = nm({"model.embed_tokens.weight"});
  wte.adjust = [](const TransformerConfig& c, const ParamSpec&, HfName& n) {
    if (!c.untie_embeddings) n.tied = {"lm_head.weight"};
  };
  return {{R::WordEmbedding, wte},
          {R::Norm1Weight, nm({m + "input_layernorm.weight"})},
          {R::QkvWeight, nm({a + "q_proj.weight", a + "k_proj.weight", a + "v_proj.weight"})},
          {R::QkvBias, nm({a + "q_proj.bias", a + "k_proj.bias", a + "v_proj.bias"})},
          {R::ProjWeight, nm({a + "o_proj.weight"})}, {R::ProjBias, nm({a + "o_proj.bias"})},
          {R::Norm2Weight, nm({m + "post_attention_layernorm.weight"})},
          {R::FcWeight, nm({f + "gate_proj.weight", f + "up_proj.weight"})},
          {R::FcBias, nm({f + "gate_proj.bias", f + "up_proj.bias"})},
          {R::MlpProjWeight, nm({f + "down_proj.weight"})}, {R::MlpProjBias, nm({f + "down_proj.bias"})},
          {R::FinalNormWeight, nm({"model.norm.weight"})},
          {R::OutputWeight, nm({"lm_head.weight"})}};
}

// The defaults LlamaConfig and the configs built on it (Qwen2Config, MistralConfig) share where a
// key is absent: RMSNorm, SwiGLU, rope, an untied head, no biases, epsilon 1e-6; `positions`
// is each config's max_position_embeddings (also the sequence length of an import).
void llama_config_defaults(C& c, int64_t positions) {
  c.normalization = Normalization::RMSNorm, c.mlp = MlpKind::SwiGLU, c.position_embedding = PositionEmbedding::Rope;
  c.untie_embeddings = true, c.add_bias_linear = false, c.layernorm_epsilon = 1e-6f;
  c.max_position_embeddings = c.seq_length = positions;
}

HfKey rope_scaling_key() {
  HfKey k;
  k.key = "rope_scaling";
  k.read = [](const json& v, const json& config, C& c) {
    json r = v;
    const std::string type = r.value("rope_type", r.value("type", std::string()));
    const int64_t positions = config.value("max_position_embeddings", c.max_position_embeddings);
    // transformers' yarn: with original_max_position_embeddings given, the factor is the ratio of the contexts
    // (DeepSeek-V3's convention; _compute_yarn_parameters).
    if (type == "yarn" && r.contains("original_max_position_embeddings") && r["original_max_position_embeddings"].is_number() &&
        r["original_max_position_embeddings"].get<double>() > 0)
      r["factor"] = static_cast<double>(positions) / r["original_max_position_embeddings"].get<double>();
    if ((type == "dynamic" || type == "yarn") && !r.contains("original_max_position_embeddings"))
      r["original_max_position_embeddings"] = positions;
    arch_field("rope_scaling").set(c, r, "HF config.json key rope_scaling");
    if (c.rope_scaling.type == RopeScalingType::Dynamic) {  // positions past the original context, by the factor
      c.max_position_embeddings = c.seq_length =
          static_cast<int64_t>(static_cast<double>(c.rope_scaling.original_max_position_embeddings) * c.rope_scaling.factor);
    }
  };
  k.write = [](const C& c) {
    json r = arch_field("rope_scaling").get(c);
    if (c.rope_scaling.type == RopeScalingType::Dynamic) r.erase("original_max_position_embeddings");  // = the config's
    return r;
  };
  return k;
}

HfKey head_dim_key() { return field("head_dim", "kv_channels", false); }

HfKey sliding_window_key() {
  HfKey k;
  k.key = "sliding_window";
  k.read = [](const json& v, const json&, C& c) {
    MPT_CHECK(v.is_number_integer() && v.get<int64_t>() >= 1,
              str("HF config.json key sliding_window must be an integer >= 1 or null, got ", v.dump()), "");
    const int64_t W = v.get<int64_t>();
    c.window_size = W >= c.max_position_embeddings ? 0 : W - 1;  // W keys: i − (W − 1) … i
  };
  k.write = [](const C& c) { return c.window_size > 0 ? json(c.window_size + 1) : json(nullptr); };
  return k;
}

HfKey layer_types_key() {
  HfKey k;
  k.key = "layer_types";
  k.read = [](const json& v, const json&, C& c) {
    MPT_CHECK(v.is_array() && static_cast<int64_t>(v.size()) == c.num_layers,
              str("HF config.json key layer_types must list num_hidden_layers (", c.num_layers, ") layer types, got ", v.dump()), "");
    c.window_layer_pattern.clear();
    c.window_attn_skip_freq = 0;
    bool any = false;
    for (const json& t : v) {
      MPT_CHECK(t == "sliding_attention" || t == "full_attention",
                str("HF config.json layer_types entry ", t.dump(), " is not built"), "mpitron has sliding_attention and full_attention layers");
      c.window_layer_pattern.push_back(t == "sliding_attention");
      any |= t == "sliding_attention";
    }
    if (!any || c.window_size == 0) c.window_layer_pattern.clear(), c.window_size = any ? c.window_size : 0;
  };
  k.write = [](const C& c) {
    json a = json::array();
    for (int64_t l = 0; l < c.num_layers; ++l) a.push_back(c.is_sliding_layer(l) ? "sliding_attention" : "full_attention");
    return a;
  };
  return k;
}

// GemmaConfig's (4.40) keys: Llama's core keys with the GeGLU MLP and a head width of its own; Gemma 2
// and Gemma 3 start from them.
std::vector<HfKey> gemma_keys() {
  std::vector<HfKey> v;
  for (HfKey& k : llama_core_keys())
    if (k.key != "hidden_act") v.push_back(k);
  for (HfKey& k : v)
    if (k.key == "num_key_value_heads") k.required = true;  // GemmaConfig's default (16) is no function of the rest
  v.push_back(field("head_dim", "kv_channels", false));       // absent: GemmaConfig's 256 (hf_defaults)
  const auto tanh_gelu = [](const json& x) { return x == "gelu_pytorch_tanh" || x == "gelu_new"; };
  // 4.40 gates with hidden_activation, or with the tanh GELU when it is null whatever hidden_act
  // says (4.38 used hidden_act: "gelu" was the erf GELU there).
  v.push_back(must("hidden_activation", tanh_gelu, "mpitron's GeGLU gates with the tanh GELU (gelu_pytorch_tanh)",
                   "gelu_pytorch_tanh"));
  v.push_back({"hidden_act", false,
               [tanh_gelu](const json& x, const json& config, C&) {
                 if (config.contains("hidden_activation") && !config["hidden_activation"].is_null()) return;
                 if (!tanh_gelu(x))
                   refuse("hidden_act", x,
                          "without hidden_activation, transformers 4.40 gates with the tanh GELU and 4.38 with "
                          "hidden_act: the function depends on the version",
                          "set hidden_activation to the activation the model was trained with (gelu_pytorch_tanh)");
               },
               [](const C&) { return json("gelu_pytorch_tanh"); }, ""});
  v.push_back(must("attention_bias", [](const json& x) { return x == false; },
                   "mpitron's Gemma has no biases (attention_bias puts them on q, k, v and o, not on the MLP)", false));
  return v;
}

FamilyPin moe_pin() { return when("num_experts", [](const C& c) { return c.num_experts > 0; }, "--num-experts"); }

std::vector<FamilyPin> moe_router() {
  return {is("moe_router_score_function", "softmax"), is("moe_router_topk_scaling_factor", 1.0),
          is("moe_router_num_groups", 0), is("moe_router_group_score_topk", 0)};
}

}  // namespace mpitron::family_kit
