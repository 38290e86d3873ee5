// Llama (LlamaForCausalLM) and the families built on its names: Qwen2, Mistral, Gemma, Mixtral,
// Qwen2-MoE.
#include "core/error.h"
#include "model/arch_fields.h"
#include "model/families/kit.h"
#include "model/families/rows.h"

namespace mpitron {

using namespace family_kit;

namespace {

// pretraining_tp: 4.40's Llama then computes its linears in slices of out_features / tp and
// uses only the first tp slices: the same function when tp divides every sliced size, a
// model that drops rows when it does not.
void check_pretraining_tp(const json& v, const json& config) {
  MPT_CHECK(v.is_number_integer() && v.get<int64_t>() >= 1,
            str("HF config.json key pretraining_tp must be an integer >= 1, got ", v.dump()), "");
  const int64_t tp = v.get<int64_t>();
  const auto num = [&](const char* k, int64_t def) {
    return config.contains(k) && config[k].is_number_integer() ? config[k].get<int64_t>() : def;
  };
  const int64_t C = num("hidden_size", 0), NH = num("num_attention_heads", 1), G = num("num_key_value_heads", NH);
  const int64_t HD = NH > 0 ? C / NH : 0;
  for (const auto& [name, size] : std::vector<std::pair<std::string, int64_t>>{
           {"intermediate_size", num("intermediate_size", 0)}, {"hidden_size", C},
           {"num_key_value_heads x head dim", G * HD}, {"vocab_size", num("vocab_size", 0)}})
    MPT_CHECK(size % tp == 0,
              str("HF config.json key pretraining_tp = ", tp, " does not divide ", name, " = ", size,
                  ": transformers then computes with the first ", tp, " slices of ", size / tp, " and drops the rest"),
              "a checkpoint trained that way is not one mpitron can reproduce; set pretraining_tp 1 if the weights "
              "are whole");
}

// The keys Llama (LlamaConfig: 4.40's, mlp_bias of 4.41, head_dim of 4.44, rope_scaling as 4.57 applies
// it: llama3, linear, dynamic, yarn) has.
std::vector<HfKey> llama_keys() {
  std::vector<HfKey> v = llama_core_keys();
  v.push_back(rope_scaling_key());
  // attention_bias: q, k, v and o; mlp_bias (transformers >= 4.41): the MLP's. mpitron's
  // --disable-bias-linear is all or nothing, so they must agree.
  for (const char* key : {"attention_bias", "mlp_bias"})
    v.push_back({key, false,
                 [key](const json& x, const json& config, C& c) {
                   MPT_CHECK(x.is_boolean(), str("HF config.json key ", key, " must be true or false, got ", x.dump()), "");
                   const bool a = config.value("attention_bias", false), m = config.value("mlp_bias", false);
                   MPT_CHECK(a == m, str("HF config.json attention_bias = ", a, " but mlp_bias = ", m),
                             "mpitron has biases on every linear or on none (--disable-bias-linear)");
                   c.add_bias_linear = x.get<bool>();
                 },
                 [](const C& c) { return json(c.add_bias_linear); }, ""});
  v.push_back({"pretraining_tp", false, [](const json& x, const json& config, C&) { check_pretraining_tp(x, config); },
               nullptr, ""});
  v.push_back(head_dim_key());
  v.push_back(must("partial_rotary_factor", [](const json& x) { return x.is_number() && x.get<double>() == 1.0; },
                   "transformers 4.40's Llama rotates every head dim and later versions honour the factor: the "
                   "function depends on the version"));
  // Qwen2's and Mistral's window keys, as older conversions leave them in Llama configs.
  v.push_back({"sliding_window", false,
               [](const json& x, const json& config, C& c) {
                 MPT_CHECK(x.is_number_integer(), str("HF config.json key sliding_window must be an integer, got ", x.dump()), "");
                 if (config.value("use_sliding_window", true) && x.get<int64_t>() < c.max_position_embeddings)
                   MPT_THROW(str("HF config.json sliding_window = ", x.dump(), " (below max_position_embeddings ",
                                 c.max_position_embeddings, ") is not supported for a ", config.value("model_type", "llama")),
                             "LlamaForCausalLM attends to every earlier position");
               },
               nullptr, ""});
  v.push_back(harmless("use_sliding_window", "read with sliding_window"));
  v.push_back(harmless("max_window_layers", "read with sliding_window"));
  return v;
}

// Qwen2 (4.40's Qwen2Config): Llama's core keys and a sliding window that 4.40 applies in its
// eager and sdpa attention whatever use_sliding_window says, but in flash attention only with
// use_sliding_window (and below max_window_layers): refused unless it reaches past every position.
std::vector<HfKey> qwen2_keys() {
  std::vector<HfKey> v = llama_core_keys();
  v.push_back({"sliding_window", true,
               [](const json& x, const json&, C& c) {
                 MPT_CHECK(x.is_number_integer(), str("HF config.json key sliding_window must be an integer, got ", x.dump()), "");
                 if (x.get<int64_t>() < c.max_position_embeddings)
                   refuse("sliding_window", x,
                          str("below max_position_embeddings ", c.max_position_embeddings,
                              ", transformers 4.40's Qwen2 windows its eager/sdpa attention but not its flash attention "
                              "(use_sliding_window false): the function depends on the attention implementation"));
               },
               [](const C& c) { return json(c.max_position_embeddings); }, ""});
  v.push_back(must("use_sliding_window", [](const json& x) { return x.is_boolean(); }, "it is true or false", false));
  v.push_back(must("rope_scaling", [](const json&) { return false; },
                   "4.40's Qwen2 ignores rope scaling and later versions apply it: only rope_scaling null converts"));
  v.push_back(harmless("max_window_layers", "read with sliding_window"));
  v.back().write = [](const C& c) { return json(c.num_layers); };
  return v;
}

// Gemma (4.40's GemmaConfig): Llama's core keys with the GeGLU MLP and a head width of its own.
// Mistral (4.40's MistralConfig): Llama's core keys and the sliding window its eager, sdpa and
// flash attention all apply (query i sees keys i − W … i); null: every earlier key.
std::vector<HfKey> mistral_keys() {
  std::vector<HfKey> v = llama_core_keys();
  v.push_back({"sliding_window", false,
               [](const json& x, const json&, C& c) {
                 arch_field("window_size").set(c, x, "HF config.json key sliding_window");
                 MPT_CHECK(c.window_size >= 1, "HF config.json key sliding_window must be >= 1 or null", "");
               },
               [](const C& c) { return c.window_size > 0 ? json(c.window_size) : json(nullptr); }, ""});
  v.back().absent = [](C& c) { c.window_size = 4096; };  // MistralConfig's default; null: no window
  v.push_back({"head_dim", false,
               [](const json& x, const json& config, C&) {
                 const int64_t C = config.value("hidden_size", int64_t{0}), NH = config.value("num_attention_heads", int64_t{1});
                 if (!(x.is_null() || (x.is_number_integer() && NH > 0 && x.get<int64_t>() * NH == C)))
                   refuse("head_dim", x, str("transformers 4.40's Mistral has heads of hidden_size / num_attention_heads = ",
                                             NH > 0 ? C / NH : 0));
               },
               nullptr, ""});
  return v;
}

// Mixtral (4.40's MixtralConfig): Mistral's keys with every MLP a Mixture of Experts of
// intermediate_size-wide SwiGLU experts; the router's top-k weights renormalised (a softmax
// over the k chosen logits: no --moe-router-pre-softmax).
std::vector<HfKey> mixtral_keys() {
  std::vector<HfKey> v;
  for (HfKey& k : mistral_keys())
    if (k.key != "intermediate_size" && k.key != "head_dim") v.push_back(k);
  v.push_back(field("intermediate_size", "moe_ffn_hidden_size"));
  moe_common_keys(v, "num_local_experts");
  v.push_back(must("router_jitter_noise", [](const json& x) { return x.is_number() && x.get<double>() == 0.0; },
                   "router jitter (noise on the router's input in training) is not built", 0.0));
  for (HfKey& k : v)
    if (k.key == "sliding_window") k.absent = nullptr;  // MixtralConfig's default: null (no window)
  return v;
}

// Qwen2-MoE (4.40's Qwen2MoeConfig): Qwen2's keys; layer l's MLP is an MoE when (l + 1) %
// decoder_sparse_step == 0 (else a dense MLP of intermediate_size), with a shared expert of
// shared_expert_intermediate_size under a sigmoid gate; norm_topk_prob false: the top-k of the
// softmax over every expert, unnormalised (--moe-router-pre-softmax).
std::vector<HfKey> qwen2_moe_keys() {
  std::vector<HfKey> v = qwen2_keys();
  moe_common_keys(v, "num_experts");
  v.push_back(field("moe_intermediate_size", "moe_ffn_hidden_size"));
  v.push_back(field("shared_expert_intermediate_size", "moe_shared_expert_intermediate_size"));
  v.push_back(bool_key("norm_topk_prob", [](bool t, C& c) { c.moe_router_pre_softmax = !t; },
                       [](const C& c) { return json(!c.moe_router_pre_softmax); }));
  v.push_back({"decoder_sparse_step", false,
               [](const json& x, const json&, C& c) {
                 MPT_CHECK(x.is_number_integer() && x.get<int64_t>() >= 1,
                           str("HF config.json key decoder_sparse_step must be an integer >= 1, got ", x.dump()), "");
                 const int64_t step = x.get<int64_t>();
                 c.moe_layer_pattern.clear();
                 if (step > 1)  // transformers' MoE layers are l = step − 1, 2·step − 1, …; Megatron's N counts from 0
                   for (int64_t l = 0; l < c.num_layers; ++l) c.moe_layer_pattern.push_back((l + 1) % step == 0);
               },
               [](const C& c) {
                 if (c.moe_layer_pattern.empty() && c.moe_layer_freq == 1) return json(1);
                 for (int64_t step = 1; step <= c.num_layers; ++step) {
                   bool same = true;
                   for (int64_t l = 0; l < c.num_layers; ++l) same &= c.is_moe_layer(l) == ((l + 1) % step == 0);
                   if (same) return json(step);
                 }
                 MPT_THROW(str("--moe-layer-freq ", arch_field("moe_layer_freq").get(c).dump(),
                               " is no Qwen2-MoE decoder_sparse_step (MoE layers l with (l + 1) % step == 0)"),
                           "export MoE layer patterns Qwen2MoeForCausalLM can express");
               },
               ""});
  v.push_back(must("mlp_only_layers", [](const json& x) { return x.is_array() && x.empty(); },
                   "transformers 4.40's Qwen2-MoE has no dense-only layers list (decoder_sparse_step only)"));
  return v;
}

}  // namespace

Family llama_family() {
  Family f;
  f.name = "llama";
  f.hf_class = "LlamaForCausalLM";
  f.hf_model_types = {"llama"};
  f.hf_classes_read = {"LlamaForCausalLM"};
  f.hf_names = llama_names();
  // Llama 3.x: rope scaling and (Llama 3.2 small) heads of their own width are Llama's too.
  std::vector<FamilyPin> like;
  for (const FamilyPin& p : llama_like())
    if (p.key != "kv_channels") like.push_back(p);
  f.pins = join(join(join(join(decoder_base(), {is("num_experts", 0), is("window_size", 0)}), plain_attention()), like),
                join({is("add_qkv_bias", false)}, plain_ends()));
  f.hf_defaults = [](C& c) { llama_config_defaults(c, 2048); };  // LlamaConfig's
  f.hf_keys = llama_keys();
  f.hf_buffers = llama_buffers();
  return f;
}

Family qwen2_family() {
  Family f;
  f.name = "qwen2";
  f.hf_class = "Qwen2ForCausalLM";
  f.hf_model_types = {"qwen2"};
  f.hf_classes_read = {"Qwen2ForCausalLM"};
  f.hf_names = llama_names();
  f.pins = join(join(join(join(decoder_base(), {is("num_experts", 0), is("window_size", 0), is("rope_scaling", nullptr)}), plain_attention()), llama_like()), join(plain_ends(), {is("add_bias_linear", false), is("add_qkv_bias", true)}));
  f.hf_defaults = [](C& c) {  // Qwen2Config's
    llama_config_defaults(c, 32768);
    c.add_qkv_bias = true;
  };
  f.hf_keys = qwen2_keys();
  f.hf_buffers = llama_buffers();
  return f;
}

Family mistral_family() {
  // Llama with a sliding window. A Mistral without one (sliding_window null, as v0.2+) imports
  // here and trains as a Llama: family_of() tries llama first, so it exports as LlamaForCausalLM,
  // the same function.
  Family f;
  f.name = "mistral";
  f.hf_class = "MistralForCausalLM";
  f.hf_model_types = {"mistral"};
  f.hf_classes_read = {"MistralForCausalLM"};
  f.hf_names = llama_names();
  f.pins = join(join(join(join(join(decoder_base(), {is("num_experts", 0), is("rope_scaling", nullptr)}), plain_attention()), llama_like()), plain_ends()),
                {is("add_bias_linear", false), is("add_qkv_bias", false),
                 when("window_size", [](const C& c) { return c.window_size > 0; }, "--window-size")});
  f.hf_defaults = [](C& c) {  // MistralConfig's (sliding_window: its key's `absent`)
    llama_config_defaults(c, 4096 * 32);
    c.num_query_groups = 8;
  };
  f.hf_keys = mistral_keys();
  f.hf_buffers = llama_buffers();
  return f;
}

Family gemma_family() {
  Family f;
  f.name = "gemma";
  f.hf_class = "GemmaForCausalLM";
  f.hf_model_types = {"gemma"};
  f.hf_classes_read = {"GemmaForCausalLM"};
  f.hf_names = llama_names();
  f.pins = join(join(join(decoder_base(), {is("num_experts", 0), is("window_size", 0), is("rope_scaling", nullptr)}), plain_attention()), {is("normalization", "RMSNorm"), is("mlp", "geglu"), is("position_embedding", "rope"),
                          is("rotary_percent", 1.0), is("layernorm_1p", true), is("scale_embeddings", true),
                          is("add_bias_linear", false), is("add_qkv_bias", false)});
  f.hf_defaults = [](C& c) {  // GemmaConfig's defaults where a key is absent
    c.normalization = Normalization::RMSNorm, c.mlp = MlpKind::GeGLU, c.position_embedding = PositionEmbedding::Rope;
    c.layernorm_1p = true, c.scale_embeddings = true, c.add_bias_linear = false, c.layernorm_epsilon = 1e-6f;
    c.kv_channels = 256;
    c.max_position_embeddings = c.seq_length = 8192;
  };
  f.hf_keys = gemma_keys();
  f.hf_buffers = llama_buffers();
  return f;
}

Family mixtral_family() {
  Family f;
  f.name = "mixtral";
  f.hf_class = "MixtralForCausalLM";
  f.hf_model_types = {"mixtral"};
  f.hf_classes_read = {"MixtralForCausalLM"};
  f.hf_names = llama_names();
  add_moe_names(f.hf_names, {"block_sparse_moe.", "gate", "w1", "w3", "w2", "", ""});
  f.pins = join(join(join(join(join(join(decoder_base(), {is("rope_scaling", nullptr)}), plain_attention()), llama_like()), plain_ends()), moe_router()),
                {moe_pin(), is("add_bias_linear", false), is("add_qkv_bias", false), is("moe_router_pre_softmax", false),
                 is("moe_layer_freq", 1), is("moe_shared_expert_intermediate_size", 0)});
  f.hf_defaults = [](C& c) {  // MixtralConfig's
    llama_config_defaults(c, 4096 * 32);
    c.layernorm_epsilon = 1e-5f;
    c.num_query_groups = 8;
    c.num_experts = 8;
    c.moe_router_topk = 2;
    c.rotary_base = 1e6;
  };
  f.hf_keys = mixtral_keys();
  f.hf_buffers = llama_buffers();
  return f;
}

Family qwen2_moe_family() {
  Family f;
  f.name = "qwen2_moe";
  f.hf_class = "Qwen2MoeForCausalLM";
  f.hf_model_types = {"qwen2_moe"};
  f.hf_classes_read = {"Qwen2MoeForCausalLM"};
  f.hf_names = llama_names();
  add_moe_names(f.hf_names, {"mlp.", "gate", "gate_proj", "up_proj", "down_proj", "shared_expert.", "shared_expert_gate"});
  f.pins = join(join(join(join(join(join(decoder_base(), {is("window_size", 0), is("rope_scaling", nullptr)}), plain_attention()), llama_like()), plain_ends()), moe_router()),
                {moe_pin(), is("add_bias_linear", false), is("add_qkv_bias", true),
                 when("moe_shared_expert_intermediate_size",
                      [](const C& c) { return c.moe_shared_expert_intermediate_size > 0; },
                      "--moe-shared-expert-intermediate-size"),
                 is("moe_shared_expert_gate", true)});
  f.hf_defaults = [](C& c) {  // Qwen2MoeConfig's
    llama_config_defaults(c, 32768);
    c.add_qkv_bias = true;
    c.num_experts = 60;
    c.moe_router_topk = 4;
    c.moe_ffn_hidden_size = 1408;
    c.moe_shared_expert_intermediate_size = 5632;
    c.moe_shared_expert_gate = true;
    c.moe_router_pre_softmax = true;  // norm_topk_prob false
  };
  f.hf_keys = qwen2_moe_keys();
  f.hf_buffers = llama_buffers();
  return f;
}

}  // namespace mpitron
