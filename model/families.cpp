#include "model/families.h"

#include <cstdio>
#include <cstdlib>

#include "core/error.h"
#include "model/arch_fields.h"

namespace mpitron {

namespace {

using json = nlohmann::json;
using C = TransformerConfig;

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

[[noreturn]] void refuse(const std::string& key, const json& v, const std::string& why, const std::string& hint = "") {
  MPT_THROW(str("HF config.json key ", key, " = ", v.dump(), " is not supported: ", why), hint);
}

// A key that does not change the model's function (token ids, dtype, dropout, …).
HfKey harmless(const std::string& key, const std::string& note) { return {key, false, nullptr, nullptr, note}; }

// A key that sets an architecture field through its row (type and bounds are the row's).
HfKey field(const std::string& key, const std::string& field_key, bool required = true) {
  const ArchField& f = arch_field(field_key);
  return {key, required,
          [&f, key](const json& v, const json&, C& c) { f.set(c, v, "HF config.json key " + key); },
          [&f](const C& c) { return f.get(c); }, ""};
}

// A key whose value must satisfy ok (else refused with why); export writes `written`.
HfKey must(const std::string& key, std::function<bool(const json&)> ok, const std::string& why,
           const json& written = json()) {
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
  return k;
}

HfKey eps_key(const std::string& key) {
  HfKey k = field(key, "layernorm_epsilon", false);
  k.write = [](const C& c) { return json(hf_short_float(c.layernorm_epsilon)); };
  return k;
}

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

// The keys Llama (4.40's LlamaConfig, and mlp_bias of later versions) has.
std::vector<HfKey> llama_keys() {
  std::vector<HfKey> v = llama_core_keys();
  v.push_back(must("rope_scaling", [](const json&) { return false; },
                   "mpitron's rope has no scaling (linear, dynamic, yarn, llama3); only rope_scaling null converts"));
  v.back().write = [](const C&) { return json(nullptr); };
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
  v.push_back({"head_dim", false,
               [](const json& x, const json& config, C&) {
                 const int64_t C = config.value("hidden_size", int64_t{0}), NH = config.value("num_attention_heads", int64_t{1});
                 if (!(x.is_number_integer() && NH > 0 && x.get<int64_t>() * NH == C))
                   refuse("head_dim", x, str("transformers 4.40's Llama has heads of hidden_size / num_attention_heads = ",
                                             NH > 0 ? C / NH : 0));
               },
               nullptr, ""});
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

// The MoE keys Mixtral and Qwen2-MoE share: experts, top-k, and the training-only router settings.
void moe_common_keys(std::vector<HfKey>& v, const std::string& experts_key) {
  v.push_back(field(experts_key, "num_experts"));
  v.push_back(field("num_experts_per_tok", "moe_router_topk"));
  v.push_back(harmless("output_router_logits", "whether transformers returns the router logits and aux loss"));
  v.back().write = [](const C&) { return json(false); };
  v.push_back(harmless("router_aux_loss_coef", "the load-balancing loss's coefficient: training only "
                                               "(mpitron's --moe-aux-loss-coeff, a run setting; not exported)"));
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

std::vector<HfKey> bert_keys() {
  std::vector<HfKey> v = common_keys();
  v.push_back(field("hidden_size", "hidden_size"));
  v.push_back(field("num_hidden_layers", "num_layers"));
  v.push_back(field("num_attention_heads", "num_attention_heads"));
  v.push_back(field("intermediate_size", "ffn_hidden_size"));
  v.push_back(field("vocab_size", "vocab_size"));
  v.push_back(positions_key("max_position_embeddings", false));
  HfKey types = field("type_vocab_size", "num_tokentypes", false);
  const auto read = types.read;
  types.read = [read](const json& x, const json& config, C& c) {
    read(x, config, c);
    MPT_CHECK(c.num_tokentypes >= 1, str("HF config.json type_vocab_size = ", c.num_tokentypes, " must be >= 1"), "");
  };
  v.push_back(types);
  v.push_back(eps_key("layer_norm_eps"));
  v.push_back({"hidden_act", false,
               [](const json& x, const json&, C& c) {
                 if (x == "gelu") c.mlp = MlpKind::GeluErf;
                 else if (x == "gelu_new" || x == "gelu_pytorch_tanh") c.mlp = MlpKind::GeluTanh;
                 else refuse("hidden_act", x, "mpitron's BERT has \"gelu\" (exact, erf) and \"gelu_new\" / "
                                              "\"gelu_pytorch_tanh\" (tanh approximation)");
               },
               [](const C& c) { return json(c.gelu_erf() ? "gelu" : "gelu_new"); }, ""});
  v.push_back(must("position_embedding_type", [](const json& x) { return x == "absolute"; },
                   "mpitron's BERT has learned absolute positions only (relative_key attention is not implemented)",
                   "absolute"));
  v.push_back(must("is_decoder", [](const json& x) { return x == false; }, "mpitron's BERT is the bidirectional encoder"));
  v.push_back(must("add_cross_attention", [](const json& x) { return x == false; }, "mpitron's BERT has no cross-attention"));
  v.push_back(must("tie_word_embeddings", [](const json& x) { return x == true; },
                   "mpitron's BERT decoder is the word embedding matrix (tied)", true));
  for (const char* k : {"hidden_dropout_prob", "attention_probs_dropout_prob", "classifier_dropout"})
    v.push_back(harmless(k, "a dropout probability: training only"));
  for (const char* k : {"directionality", "pooler_fc_size", "pooler_num_attention_heads", "pooler_num_fc_layers",
                        "pooler_size_per_head", "pooler_type"})
    v.push_back(harmless(k, "Google's BERT export settings transformers does not read"));
  return v;
}

// T5 (4.40's T5Config, T5ForConditionalGeneration): num_layers is the encoder's, num_decoder_layers the
// decoder's (absent: as many); feed_forward_proj "relu" (the original T5) or "gated-gelu" (v1.1: the tanh
// GELU gating wi_1); tie_word_embeddings (default true) ties lm_head to shared and scales the decoder's
// output by d_model^−½ (mpitron's final norm carries the factor: model/param_table.h hf_factor).
std::vector<HfKey> t5_keys() {
  std::vector<HfKey> v = common_keys();
  v.push_back(field("d_model", "hidden_size"));
  v.push_back(field("d_kv", "kv_channels"));
  v.push_back(field("num_heads", "num_attention_heads"));
  v.push_back(field("d_ff", "ffn_hidden_size"));
  v.push_back(field("vocab_size", "vocab_size"));
  v.push_back(field("num_layers", "encoder_num_layers"));
  v.push_back({"num_decoder_layers", false,
               [](const json& x, const json&, C& c) {
                 MPT_CHECK(x.is_number_integer() && x.get<int64_t>() >= 1,
                           str("HF config.json key num_decoder_layers must be an integer >= 1, got ", x.dump()), "");
                 c.num_layers = c.encoder_num_layers + x.get<int64_t>();
               },
               [](const C& c) { return json(c.decoder_num_layers()); }, "",
               [](C& c) { c.num_layers = 2 * c.encoder_num_layers; }});  // T5Config: as many as the encoder's
  v.push_back(field("relative_attention_num_buckets", "relative_attention_num_buckets", false));
  v.push_back(field("relative_attention_max_distance", "relative_attention_max_distance", false));
  v.push_back(eps_key("layer_norm_epsilon"));
  v.push_back({"feed_forward_proj", false,
               [](const json& x, const json&, C& c) {
                 if (x == "relu") c.mlp = MlpKind::ReLU;
                 else if (x == "gated-gelu") c.mlp = MlpKind::GeGLU;
                 else refuse("feed_forward_proj", x, "mpitron's T5 MLP is \"relu\" (DenseReluDense) or \"gated-gelu\" (t5 v1.1)");
               },
               [](const C& c) { return json(c.mlp == MlpKind::GeGLU ? "gated-gelu" : "relu"); }, ""});
  v.push_back(must("dense_act_fn", [](const json& x) { return x == "relu" || x == "gelu_new"; },
                   "T5Config derives it from feed_forward_proj: relu, or gelu_new for gated-gelu"));
  v.back().write = [](const C& c) { return json(c.mlp == MlpKind::GeGLU ? "gelu_new" : "relu"); };
  v.push_back(harmless("is_gated_act", "T5Config derives it from feed_forward_proj"));
  v.back().write = [](const C& c) { return json(mlp_gated(c.mlp)); };
  v.push_back(must("is_encoder_decoder", [](const json& x) { return x == true; }, "T5 is an encoder-decoder", true));
  v.push_back(bool_key("tie_word_embeddings", [](bool t, C& c) { c.untie_embeddings = !t; },
                       [](const C& c) { return json(!c.untie_embeddings); }));
  v.push_back(harmless("decoder_start_token_id", "generation's first decoder token (generate_text --decoder-start-token)"));
  v.back().write = [](const C&) { return json(0); };
  for (const char* k : {"dropout_rate", "classifier_dropout"}) v.push_back(harmless(k, "a dropout probability: training only"));
  v.push_back(harmless("initializer_factor", "the init of a fresh model; the weights are read"));
  v.push_back(harmless("n_positions", "T5's informative length; relative positions have no table"));
  v.push_back(harmless("task_specific_params", "pipelines' settings, not the model's"));
  return v;
}

// The defaults LlamaConfig and the configs built on it (Qwen2Config, MistralConfig) share where a
// key is absent: RMSNorm, SwiGLU, rope, an untied head, no biases, epsilon 1e-6; `positions`
// is each config's max_position_embeddings (also the sequence length of an import).
void llama_config_defaults(C& c, int64_t positions) {
  c.normalization = Normalization::RMSNorm, c.mlp = MlpKind::SwiGLU, c.position_embedding = PositionEmbedding::Rope;
  c.untie_embeddings = true, c.add_bias_linear = false, c.layernorm_epsilon = 1e-6f;
  c.max_position_embeddings = c.seq_length = positions;
}

std::vector<Family> build() {
  // Every decoder: causal, pre-LN, no BERT heads.
  const std::vector<FamilyPin> decoder_base = {is("bert", false), is("t5", false), is("causal", true), is("post_ln", false),
                                               is("num_tokentypes", 0), is("num_classes", 0)};
  // ... with dense MLPs (all but the MoE families).
  const std::vector<FamilyPin> any_window = join(decoder_base, {is("num_experts", 0)});
  // ... attending to every earlier key (all but Mistral).
  const std::vector<FamilyPin> decoder = join(any_window, {is("window_size", 0)});
  // Llama and the families built on it: RMSNorm, SwiGLU, rope over every dim, heads of C / NH.
  const std::vector<FamilyPin> llama_like = {
      is("normalization", "RMSNorm"), is("mlp", "swiglu"), is("position_embedding", "rope"),
      is("rotary_percent", 1.0), plain("kv_channels", "no --kv-channels")};
  const std::vector<FamilyPin> no_qkv_bias = {is("add_qkv_bias", false)};
  // Gemma's choices, which the other decoders lack.
  const std::vector<FamilyPin> plain_ends = {is("layernorm_1p", false), is("scale_embeddings", false)};
  const std::vector<std::string> llama_buffers = {"rotary_emb.inv_freq"};  // a buffer older checkpoints saved
  std::vector<Family> v;
  {
    Family f;
    f.name = "bert";
    f.hf_class = "BertForPreTraining";
    f.hf_model_types = {"bert"};
    f.hf_classes_read = {"BertForPreTraining", "BertForMaskedLM"};
    f.scheme = HfScheme::Bert;
    f.pins = {when("bert", [](const C& c) { return c.bert; }, "a BERT model"), is("t5", false), is("causal", false),
              is("normalization", "LayerNorm"),
              when("mlp", [](const C& c) { return c.mlp == MlpKind::GeluTanh || c.mlp == MlpKind::GeluErf; },
                   "a GELU MLP (no --swiglu)"),
              is("position_embedding", "learned_absolute"), is("untie_embeddings", false), is("add_bias_linear", true),
              plain("num_query_groups", "no --group-query-attention"), plain("kv_channels", "no --kv-channels")};
    f.hf_pins = {when("post_ln", [](const C& c) { return c.post_ln; }, "the post-LN block order (--bert-post-ln)"),
                 when("binary_head", [](const C& c) { return c.binary_head; }, "the binary head (no --bert-no-binary-head)"),
                 is("num_classes", 0),
                 when("num_tokentypes", [](const C& c) { return c.num_tokentypes >= 1; }, "token types")};
    f.hf_defaults = [](C& c) {  // BertConfig's defaults where a key is absent
      c.bert = true, c.causal = false, c.post_ln = true, c.binary_head = true, c.num_tokentypes = 2;
      c.max_position_embeddings = c.seq_length = 512;
      c.layernorm_epsilon = 1e-12f;
      c.mlp = MlpKind::GeluErf;
    };
    f.hf_keys = bert_keys();
    f.hf_buffers = {"bert.embeddings.position_ids", "bert.embeddings.token_type_ids"};
    f.hf_aliases = {{"LayerNorm.weight", "LayerNorm.gamma"}, {"LayerNorm.bias", "LayerNorm.beta"}};  // TF-era names
    v.push_back(f);
  }
  {
    Family f;
    f.name = "t5";
    f.hf_class = "T5ForConditionalGeneration";
    f.hf_model_types = {"t5"};
    f.hf_classes_read = {"T5ForConditionalGeneration"};
    f.scheme = HfScheme::T5;
    f.pins = {when("t5", [](const C& c) { return c.t5; }, "a T5 model (pretrain_t5)"),
              is("normalization", "RMSNorm"), is("position_embedding", "relative"),
              when("mlp", [](const C& c) { return c.mlp == MlpKind::ReLU || c.mlp == MlpKind::GeGLU; },
                   "a ReLU or GeGLU MLP (--relu or --geglu)"),
              is("add_bias_linear", false), plain("num_query_groups", "no --group-query-attention"),
              is("num_experts", 0), is("layernorm_1p", false), is("scale_embeddings", false)};
    f.hf_defaults = [](C& c) {  // T5Config's defaults where a key is absent
      c.t5 = true, c.normalization = Normalization::RMSNorm, c.mlp = MlpKind::ReLU;
      c.position_embedding = PositionEmbedding::Relative, c.add_bias_linear = false, c.layernorm_epsilon = 1e-6f;
      c.vocab_size = 32128, c.hidden_size = 512, c.kv_channels = 64, c.ffn_hidden_size = 2048, c.num_attention_heads = 8;
      c.encoder_num_layers = 6, c.num_layers = 12;
      c.max_position_embeddings = c.seq_length = c.decoder_seq_length = 512;
    };
    f.hf_keys = t5_keys();
    v.push_back(f);
  }
  {
    Family f;
    f.name = "gpt2";
    f.hf_class = "GPT2LMHeadModel";
    f.hf_model_types = {"gpt2"};
    f.hf_classes_read = {"GPT2LMHeadModel", "GPT2Model"};
    f.scheme = HfScheme::Gpt2;
    f.pins = join(decoder, {is("normalization", "LayerNorm"),
                            when("mlp", [](const C& c) { return c.mlp == MlpKind::GeluTanh || c.mlp == MlpKind::GeluErf; },
                                 "a GELU MLP (no --swiglu)"),
                            is("position_embedding", "learned_absolute"), is("untie_embeddings", false),
                            is("add_bias_linear", true), plain("num_query_groups", "no --group-query-attention"),
                            plain("kv_channels", "no --kv-channels"), plain_ends[0], plain_ends[1]});
    f.hf_defaults = [](C&) {};  // TransformerConfig's defaults are GPT-2's
    f.hf_keys = gpt2_keys();
    f.hf_prefixes = {"transformer.", ""};  // GPT2LMHeadModel's, and GPT2Model's / the hub's gpt2 file
    f.hf_buffers = {".attn.bias", ".attn.masked_bias"};  // the causal mask buffers
    f.hf_lm_head_copy = true;
    f.hf_single_file = true;
    v.push_back(f);
  }
  {
    Family f;
    f.name = "llama";
    f.hf_class = "LlamaForCausalLM";
    f.hf_model_types = {"llama"};
    f.hf_classes_read = {"LlamaForCausalLM"};
    f.scheme = HfScheme::Llama;
    f.pins = join(join(join(decoder, llama_like), no_qkv_bias), plain_ends);
    f.hf_defaults = [](C& c) { llama_config_defaults(c, 2048); };  // LlamaConfig's
    f.hf_keys = llama_keys();
    f.hf_buffers = llama_buffers;
    v.push_back(f);
  }
  {
    Family f;
    f.name = "qwen2";
    f.hf_class = "Qwen2ForCausalLM";
    f.hf_model_types = {"qwen2"};
    f.hf_classes_read = {"Qwen2ForCausalLM"};
    f.scheme = HfScheme::Llama;
    f.pins = join(join(join(decoder, llama_like), plain_ends), {is("add_bias_linear", false), is("add_qkv_bias", true)});
    f.hf_defaults = [](C& c) {  // Qwen2Config's
      llama_config_defaults(c, 32768);
      c.add_qkv_bias = true;
    };
    f.hf_keys = qwen2_keys();
    f.hf_buffers = llama_buffers;
    v.push_back(f);
  }
  {
    // Llama with a sliding window. A Mistral without one (sliding_window null, as v0.2+) imports
    // here and trains as a Llama: family_of() tries llama first, so it exports as LlamaForCausalLM,
    // the same function.
    Family f;
    f.name = "mistral";
    f.hf_class = "MistralForCausalLM";
    f.hf_model_types = {"mistral"};
    f.hf_classes_read = {"MistralForCausalLM"};
    f.scheme = HfScheme::Llama;
    f.pins = join(join(join(any_window, llama_like), plain_ends),
                  {is("add_bias_linear", false), is("add_qkv_bias", false),
                   when("window_size", [](const C& c) { return c.window_size > 0; }, "--window-size")});
    f.hf_defaults = [](C& c) {  // MistralConfig's (sliding_window: its key's `absent`)
      llama_config_defaults(c, 4096 * 32);
      c.num_query_groups = 8;
    };
    f.hf_keys = mistral_keys();
    f.hf_buffers = llama_buffers;
    v.push_back(f);
  }
  {
    Family f;
    f.name = "gemma";
    f.hf_class = "GemmaForCausalLM";
    f.hf_model_types = {"gemma"};
    f.hf_classes_read = {"GemmaForCausalLM"};
    f.scheme = HfScheme::Llama;
    f.pins = join(decoder, {is("normalization", "RMSNorm"), is("mlp", "geglu"), is("position_embedding", "rope"),
                            is("rotary_percent", 1.0), is("layernorm_1p", true), is("scale_embeddings", true),
                            is("add_bias_linear", false), is("add_qkv_bias", false)});
    f.hf_defaults = [](C& c) {  // GemmaConfig's defaults where a key is absent
      c.normalization = Normalization::RMSNorm, c.mlp = MlpKind::GeGLU, c.position_embedding = PositionEmbedding::Rope;
      c.layernorm_1p = true, c.scale_embeddings = true, c.add_bias_linear = false, c.layernorm_epsilon = 1e-6f;
      c.kv_channels = 256;
      c.max_position_embeddings = c.seq_length = 8192;
    };
    f.hf_keys = gemma_keys();
    f.hf_buffers = llama_buffers;
    v.push_back(f);
  }
  // Mixture of Experts: SwiGLU experts in the MLP of (every, or some) layer, softmax router.
  const FamilyPin moe = when("num_experts", [](const C& c) { return c.num_experts > 0; }, "--num-experts");
  const std::vector<FamilyPin> moe_router = {is("moe_router_score_function", "softmax"),
                                             is("moe_router_topk_scaling_factor", 1.0)};
  {
    Family f;
    f.name = "mixtral";
    f.hf_class = "MixtralForCausalLM";
    f.hf_model_types = {"mixtral"};
    f.hf_classes_read = {"MixtralForCausalLM"};
    f.scheme = HfScheme::Llama;
    f.hf_moe = {"block_sparse_moe.", "gate", "w1", "w3", "w2", "", ""};
    f.pins = join(join(join(join(decoder_base, llama_like), plain_ends), moe_router),
                  {moe, is("add_bias_linear", false), is("add_qkv_bias", false), is("moe_router_pre_softmax", false),
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
    f.hf_buffers = llama_buffers;
    v.push_back(f);
  }
  {
    Family f;
    f.name = "qwen2_moe";
    f.hf_class = "Qwen2MoeForCausalLM";
    f.hf_model_types = {"qwen2_moe"};
    f.hf_classes_read = {"Qwen2MoeForCausalLM"};
    f.scheme = HfScheme::Llama;
    f.hf_moe = {"mlp.", "gate", "gate_proj", "up_proj", "down_proj", "shared_expert.", "shared_expert_gate"};
    f.pins = join(join(join(join(join(decoder_base, {is("window_size", 0)}), llama_like), plain_ends), moe_router),
                  {moe, is("add_bias_linear", false), is("add_qkv_bias", true),
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
    f.hf_buffers = llama_buffers;
    v.push_back(f);
  }
  return v;
}

}  // namespace

const std::vector<Family>& families() {
  static const std::vector<Family> rows = build();
  return rows;
}

const Family& find_family(const std::string& name) {
  std::string names;
  for (const Family& f : families()) {
    if (f.name == name) return f;
    names += (names.empty() ? "" : ", ") + f.name;
  }
  MPT_THROW(str("model family ", name, " is not known"), str("the families are ", names));
}

const Family* family_of(const TransformerConfig& c) {
  for (const Family& f : families())
    if (family_misses(f, c).empty()) return &f;
  return nullptr;
}

std::string family_misses(const Family& f, const TransformerConfig& c, bool hf) {
  std::string out;
  for (const std::vector<FamilyPin>* pins : {&f.pins, &f.hf_pins}) {
    if (pins == &f.hf_pins && !hf) break;
    for (const FamilyPin& p : *pins)
      if (!p.ok(c)) out += (out.empty() ? "" : " ") + p.need;
  }
  return out;
}

const Family& closest_family(const TransformerConfig& c) {
  const Family* best = nullptr;
  size_t fewest = 0;
  for (const Family& f : families()) {
    size_t n = 0;
    for (const std::vector<FamilyPin>* pins : {&f.pins, &f.hf_pins})
      for (const FamilyPin& p : *pins) n += p.ok(c) ? 0 : 1;
    if (!best || n < fewest) best = &f, fewest = n;
  }
  return *best;
}

}  // namespace mpitron

namespace mpitron {

const Family& hf_family(const nlohmann::json& config) {
  if (config.contains("model_type") && config["model_type"].is_string()) {
    const std::string t = config["model_type"].get<std::string>();
    for (const Family& f : families())
      for (const std::string& m : f.hf_model_types)
        if (m == t) return f;
    std::string known;
    for (const Family& f : families()) known += (known.empty() ? "" : ", ") + f.hf_model_types[0];
    MPT_THROW(str("HF config.json model_type ", t, " is not a family mpitron converts"),
              str("the model types it converts: ", known, " (docs/model-families.md)"));
  }
  if (config.contains("architectures") && config["architectures"].is_array() && !config["architectures"].empty() &&
      config["architectures"][0].is_string()) {
    const std::string a = config["architectures"][0].get<std::string>();
    for (const Family& f : families())
      for (const std::string& k : f.hf_classes_read)
        if (k == a) return f;
    std::string known;
    for (const Family& f : families())
      for (const std::string& k : f.hf_classes_read) known += (known.empty() ? "" : ", ") + k;
    MPT_THROW(str("HF config.json has no model_type and architecture ", a, " is not known"),
              str("mpitron converts ", known));
  }
  MPT_THROW("HF config.json has neither model_type nor architectures", "is it a Hugging Face config.json?");
}

double hf_short_float(float f) {
  for (int p = 6; p < 10; ++p) {
    char b[32];
    std::snprintf(b, sizeof b, "%.*g", p, static_cast<double>(f));
    if (std::strtof(b, nullptr) == f) return std::strtod(b, nullptr);
  }
  return f;
}

}  // namespace mpitron
