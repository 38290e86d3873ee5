#include "model/arch_fields.h"

#include <cmath>
#include <limits>
#include <set>
#include <tuple>

#include "core/error.h"

namespace mpitron {

namespace {

using json = nlohmann::json;
using C = TransformerConfig;

constexpr int64_t kBig = int64_t{1} << 40;  // any size a run could have, with room to multiply

// The largest value of each size field, checked as the flag (or a checkpoint's model_config) is
// read, before anything is built from it. Every bound is far above any model trained (DeepSeek-V3:
// 61 layers, hidden 7168, 128 heads, 256 experts; Llama 3.1: 128K positions) and far below what would
// take minutes or the host's memory to build and refuse: the parameter table holds a row per routed
// expert, and loops run over the layers and the router's groups. What a size costs in memory is the
// memory check's (model/memory.h: closed form, with the numbers, before any allocation); this
// table only keeps a size from being absurd. A size field without a row here is bounded by kBig.
int64_t max_of(const std::string& key) {
  constexpr int64_t k16 = int64_t{1} << 16, k20 = int64_t{1} << 20, k24 = int64_t{1} << 24;
  static const std::map<std::string, int64_t> limits = {
      {"num_layers", k16}, {"encoder_num_layers", k16}, {"mtp_num_layers", k16},
      {"hidden_size", k20}, {"ffn_hidden_size", k24}, {"moe_ffn_hidden_size", k24},
      {"moe_shared_expert_intermediate_size", k24},
      {"num_attention_heads", k16}, {"num_query_groups", k16}, {"kv_channels", k20},
      {"q_lora_rank", k20}, {"kv_lora_rank", k20}, {"qk_head_dim", k20}, {"qk_pos_emb_head_dim", k20}, {"v_head_dim", k20},
      {"seq_length", k24}, {"max_position_embeddings", k24}, {"decoder_seq_length", k24}, {"window_size", k24},
      {"original_max_position_embeddings", k24},
      {"vocab_size", (int64_t{1} << 31) - 1}, {"padded_vocab_size", (int64_t{1} << 31) - 1},  // int32 token ids
      {"num_experts", k16}, {"moe_router_topk", k16}, {"moe_router_num_groups", k16}, {"moe_router_group_topk", k16},
      {"moe_router_group_score_topk", k16}, {"moe_layer_freq", k16}, {"window_attn_skip_freq", k16},
      {"relative_attention_num_buckets", k16}, {"relative_attention_max_distance", k24},
      {"num_tokentypes", k16}, {"num_classes", k20}};
  const auto it = limits.find(key);
  return it == limits.end() ? kBig : it->second;
}

std::string dump(const json& v) { return v.is_string() ? v.get<std::string>() : v.dump(); }

int64_t as_int(const json& v, const std::string& what, int64_t lo, int64_t hi) {
  MPT_CHECK(v.is_number_integer(), str(what, " must be an integer, got ", v.dump()),
            "give a whole number (a fraction is refused, not truncated)");
  MPT_CHECK(!(v.is_number_unsigned() && v.get<uint64_t>() > static_cast<uint64_t>(hi)) && v.get<int64_t>() >= lo &&
                v.get<int64_t>() <= hi,
            str(what, " must be in [", lo, ", ", hi, "], got ", v.dump()), "");
  return v.get<int64_t>();
}

double as_num(const json& v, const std::string& what, double lo, double hi, bool lo_open, bool hi_open) {
  MPT_CHECK(v.is_number(), str(what, " must be a number, got ", v.dump()), "");
  const double x = v.get<double>();
  const bool in = std::isfinite(x) && (lo_open ? x > lo : x >= lo) && (hi_open ? x < hi : x <= hi);
  MPT_CHECK(in, str(what, " must be a finite number in ", lo_open ? "(" : "[", lo, ", ", hi, hi_open ? ")" : "]",
                    ", got ", v.dump()),
            "");
  return x;
}

bool as_bool(const json& v, const std::string& what) {
  MPT_CHECK(v.is_boolean(), str(what, " must be true or false, got ", v.dump()), "");
  return v.get<bool>();
}

std::string as_text(const json& v, const std::string& what) {
  MPT_CHECK(v.is_string(), str(what, " must be a string, got ", v.dump()), "");
  return v.get<std::string>();
}

bool on(const GivenFlags& g, const std::string& flag) {
  const auto it = g.find(flag);
  return it != g.end() && (!it->second.is_boolean() || it->second.get<bool>());
}

const json* given(const GivenFlags& g, const std::string& flag) {
  const auto it = g.find(flag);
  return it == g.end() ? nullptr : &it->second;
}

// An integer member set by one value flag.
ArchField int_row(std::string key, FieldKind kind, std::string flag, std::string help, int64_t C::*m, int64_t lo,
                  std::string meaning, std::string inference) {
  ArchField f;
  f.key = key;
  f.kind = kind;
  f.scope = FlagScope::Model;
  f.flags = {{flag, FlagType::Int, help}};
  f.meaning = std::move(meaning);
  f.inference = std::move(inference);
  f.get = [m](const C& c) { return json(c.*m); };
  f.set = [m, lo, hi = max_of(key)](C& c, const json& v, const std::string& what) { c.*m = as_int(v, what, lo, hi); };
  f.reset = [m](C& c) { c.*m = C{}.*m; };
  f.apply = [f](const GivenFlags& g, C& c) { f.set(c, *given(g, f.flags[0].name), "--" + f.flags[0].name); };
  f.text = [flag](const json& v) { return str("--", flag, " ", dump(v)); };
  f.required = true;
  return f;
}

// A bool member set by a switch (`inverted`: the switch turns it off, as --disable-bias-linear).
ArchField switch_row(std::string key, FlagScope scope, std::string flag, std::string help, bool C::*m, bool inverted,
                     std::string meaning, std::string inference) {
  ArchField f;
  f.key = key;
  f.kind = FieldKind::Choice;
  f.scope = scope;
  f.flags = {{flag, FlagType::Switch, help}};
  f.meaning = std::move(meaning);
  f.inference = std::move(inference);
  f.get = [m](const C& c) { return json(c.*m); };
  f.set = [m](C& c, const json& v, const std::string& what) { c.*m = as_bool(v, what); };
  f.reset = [m](C& c) { c.*m = C{}.*m; };
  f.apply = [m, inverted](const GivenFlags&, C& c) { c.*m = !inverted; };
  f.text = [flag, inverted](const json& v) { return (v.get<bool>() != inverted ? "--" : "no --") + flag; };
  return f;
}

// A member with no flag: set by the tool (pretrain_bert, finetune) or the importer.
template <class T>
ArchField plain_row(std::string key, FieldKind kind, T C::*m, std::string meaning, bool required = false) {
  ArchField f;
  f.key = key;
  f.kind = kind;
  f.scope = FlagScope::None;
  f.meaning = std::move(meaning);
  f.inference = "from the checkpoint";
  f.get = [m](const C& c) { return json(c.*m); };
  f.set = [m, key](C& c, const json& v, const std::string& what) {
    if constexpr (std::is_same_v<T, bool>) c.*m = as_bool(v, what);
    else c.*m = as_int(v, what, 0, max_of(key));
  };
  f.reset = [m](C& c) { c.*m = C{}.*m; };
  f.apply = [](const GivenFlags&, C&) {};
  f.text = [key](const json& v) { return str(key, " ", v.dump()); };
  f.required = required;
  return f;
}

// A float (or double) member set by one value flag, in [lo, hi] (0 meaning "none" where lo is 0).
template <class T>
ArchField float_row(std::string key, FieldKind kind, std::string flag, std::string help, T C::*m, double lo, double hi,
                    std::string meaning, std::string inference) {
  ArchField f;
  f.key = key;
  f.kind = kind;
  f.scope = FlagScope::Model;
  f.flags = {{flag, FlagType::Float, help}};
  f.meaning = std::move(meaning);
  f.inference = std::move(inference);
  f.get = [m](const C& c) { return json(static_cast<double>(c.*m)); };
  f.set = [m, lo, hi](C& c, const json& v, const std::string& what) { c.*m = static_cast<T>(as_num(v, what, lo, hi, false, false)); };
  f.reset = [m](C& c) { c.*m = C{}.*m; };
  f.apply = [f](const GivenFlags& g, C& c) { f.set(c, *given(g, f.flags[0].name), "--" + f.flags[0].name); };
  f.text = [flag](const json& v) { return v.get<double>() == 0 ? str("no --", flag) : str("--", flag, " ", v.get<double>()); };
  return f;
}

// Rope scaling as transformers writes it in config.json (null: none).
json rope_scaling_json(const RopeScaling& r) {
  if (r.type == RopeScalingType::None) return json(nullptr);
  json j = {{"rope_type", to_string(r.type)}, {"factor", r.factor}};
  if (r.type == RopeScalingType::Llama3) j["low_freq_factor"] = r.low_freq_factor, j["high_freq_factor"] = r.high_freq_factor;
  if (r.type == RopeScalingType::Llama3 || r.type == RopeScalingType::Yarn || r.type == RopeScalingType::Dynamic)
    j["original_max_position_embeddings"] = r.original_max_position_embeddings;
  if (r.type == RopeScalingType::Yarn) {
    j["beta_fast"] = r.beta_fast, j["beta_slow"] = r.beta_slow;
    if (r.attention_factor > 0) j["attention_factor"] = r.attention_factor;
    if (r.mscale != 0) j["mscale"] = r.mscale;
    if (r.mscale_all_dim != 0) j["mscale_all_dim"] = r.mscale_all_dim;
    if (!r.truncate) j["truncate"] = false;
  }
  return j;
}

}  // namespace

RopeScaling rope_scaling_from_json(const json& v, const std::string& what) {
  RopeScaling r;
  if (v.is_null()) return r;
  MPT_CHECK(v.is_object(), str(what, " must be an object with rope_type (or null), got ", v.dump()), "");
  const json* t = v.contains("rope_type") ? &v["rope_type"] : v.contains("type") ? &v["type"] : nullptr;
  MPT_CHECK(t && t->is_string(), str(what, " ", v.dump(), " has no rope_type"), "");
  const std::string type = t->get<std::string>();
  if (type == "default") return r;
  if (type == "linear") r.type = RopeScalingType::Linear;
  else if (type == "dynamic") r.type = RopeScalingType::Dynamic;
  else if (type == "llama3") r.type = RopeScalingType::Llama3;
  else if (type == "yarn") r.type = RopeScalingType::Yarn;
  else
    MPT_THROW(str(what, " rope_type ", type, " is not built"),
              "mpitron scales rope as linear, dynamic, llama3 and yarn (longrope, su and mrope are not built)");
  std::set<std::string> known = {"rope_type", "type", "factor"};
  const auto num = [&](const char* key, double lo, double hi, bool open_lo, double& out) {
    known.insert(key);
    if (v.contains(key) && !v[key].is_null()) out = as_num(v[key], str(what, " ", key), lo, hi, open_lo, false);
  };
  num("factor", 1.0, 1e9, false, r.factor);
  MPT_CHECK(v.contains("factor"), str(what, " ", v.dump(), " has no factor"), "");
  if (r.type == RopeScalingType::Llama3) {
    num("low_freq_factor", 0, 1e9, true, r.low_freq_factor);
    num("high_freq_factor", 0, 1e9, true, r.high_freq_factor);
    MPT_CHECK(r.high_freq_factor > r.low_freq_factor,
              str(what, " high_freq_factor ", r.high_freq_factor, " must exceed low_freq_factor ", r.low_freq_factor), "");
  }
  if (r.type == RopeScalingType::Yarn) {
    num("beta_fast", 0, 1e9, true, r.beta_fast);
    num("beta_slow", 0, 1e9, true, r.beta_slow);
    num("attention_factor", 0, 1e9, true, r.attention_factor);
    num("mscale", 0, 1e9, false, r.mscale);
    num("mscale_all_dim", 0, 1e9, false, r.mscale_all_dim);
    known.insert("truncate");
    if (v.contains("truncate")) r.truncate = as_bool(v["truncate"], str(what, " truncate"));
  }
  if (r.type != RopeScalingType::Linear) {
    known.insert("original_max_position_embeddings");
    MPT_CHECK(v.contains("original_max_position_embeddings"),
              str(what, " ", type, " needs original_max_position_embeddings"), "");
    r.original_max_position_embeddings = as_int(v["original_max_position_embeddings"], str(what, " original_max_position_embeddings"), 1, max_of("original_max_position_embeddings"));
  }
  for (auto it = v.begin(); it != v.end(); ++it)
    MPT_CHECK(known.count(it.key()), str(what, " key ", it.key(), " is not read for rope_type ", type),
              "a key that changes rope cannot be ignored");
  return r;
}

namespace {

std::vector<ArchField> build() {
  std::vector<ArchField> v;
  const std::string checked = "must equal the checkpoint's when given";
  v.push_back(int_row("num_layers", FieldKind::Shape, "num-layers", "transformer blocks", &C::num_layers, 1,
                      "transformer blocks", checked));
  v.push_back(int_row("hidden_size", FieldKind::Shape, "hidden-size", "residual stream width C", &C::hidden_size, 1,
                      "C, the residual stream width", checked));
  v.push_back(int_row("num_attention_heads", FieldKind::Shape, "num-attention-heads", "attention heads NH",
                      &C::num_attention_heads, 1, "NH query heads", checked));
  {
    ArchField f = int_row("kv_channels", FieldKind::Shape, "kv-channels",
                          "each attention head's width HD (default hidden / heads; Gemma 7B: 256)", &C::kv_channels, 1,
                          "HD, each head's width (default C / NH)", checked);
    f.get = [](const C& c) { return json(c.head_dim()); };
    f.required = false;
    v.push_back(f);
  }
  {
    ArchField f = int_row("num_query_groups", FieldKind::Shape, "num-query-groups",
                          "key/value heads with --group-query-attention (default 1: multi-query)", &C::num_query_groups,
                          1, "G key/value heads (default NH: multi-head attention)", checked);
    f.flags.insert(f.flags.begin(), {"group-query-attention", FlagType::Switch,
                                     "grouped-query attention (with --num-query-groups)"});
    f.get = [](const C& c) { return json(c.query_groups()); };
    f.apply = [](const GivenFlags& g, C& c) {
      const json* n = given(g, "num-query-groups");
      MPT_CHECK(on(g, "group-query-attention") || !n, "--num-query-groups is given without --group-query-attention",
                "add --group-query-attention (Megatron ignores the groups without it)");
      if (!on(g, "group-query-attention")) return;
      const int64_t groups = n ? as_int(*n, "--num-query-groups", 1, max_of("num_query_groups")) : 1;
      MPT_CHECK(c.num_attention_heads % groups == 0,
                str("--num-query-groups ", groups, " must divide --num-attention-heads ", c.num_attention_heads),
                "each group serves heads / groups query heads, e.g. 32 heads with 8 groups");
      c.num_query_groups = groups;
    };
    f.text = [](const json& v) { return str("--num-query-groups ", v.dump()); };
    f.required = true;
    v.push_back(f);
  }
  {
    ArchField f = int_row("ffn_hidden_size", FieldKind::Shape, "ffn-hidden-size", "MLP width F (default 4 x hidden)",
                          &C::ffn_hidden_size, 1, "F, the MLP width (default 4·C)", checked);
    f.get = [](const C& c) { return json(c.ffn()); };
    v.push_back(f);
  }
  v.push_back(int_row("seq_length", FieldKind::Run, "seq-length", "tokens per sample T", &C::seq_length, 1,
                      "T, tokens per training sample",
                      "must equal the checkpoint's when given (evaluate's --seq-length is its window)"));
  {
    ArchField f = int_row("max_position_embeddings", FieldKind::Shape, "max-position-embeddings",
                          "position table rows (default seq-length); the longest sequence",
                          &C::max_position_embeddings, 1,
                          "P, rows of wpe with learned positions; the longest sequence the model takes", checked);
    f.sizes_weights = [](const C& c) { return c.learned_positions(); };
    v.push_back(f);
  }
  {
    ArchField f = plain_row("vocab_size", FieldKind::Run, &C::vocab_size, "the tokenizer's vocabulary", true);
    v.push_back(f);
  }
  {
    ArchField f = plain_row("padded_vocab_size", FieldKind::Shape, &C::padded_vocab_size,
                            "V, the vocabulary padded to --make-vocab-size-divisible-by x TP (wte's rows)", true);
    f.hint = "the padded vocabulary depends on --make-vocab-size-divisible-by x --tensor-model-parallel-size: pick a "
             "--make-vocab-size-divisible-by that gives the saved size";
    v.push_back(f);
  }
  {
    ArchField f;
    f.key = "layernorm_epsilon";
    f.kind = FieldKind::Choice;
    f.scope = FlagScope::Model;
    f.flags = {{"layernorm-epsilon", FlagType::Float, "epsilon of either norm (default 1e-5; = --norm-epsilon)"},
               {"norm-epsilon", FlagType::Float, "epsilon of either norm (= --layernorm-epsilon)"}};
    f.meaning = "the epsilon of every norm";
    f.inference = checked;
    f.get = [](const C& c) { return json(static_cast<double>(c.layernorm_epsilon)); };
    f.set = [](C& c, const json& v, const std::string& what) {
      c.layernorm_epsilon = static_cast<float>(as_num(v, what, 0, 1, true, false));
      MPT_CHECK(c.layernorm_epsilon > 0, str(what, " must be > 0 in float, got ", v.dump()), "");
    };
    f.reset = [](C& c) { c.layernorm_epsilon = C{}.layernorm_epsilon; };
    f.apply = [f](const GivenFlags& g, C& c) {
      const json *a = given(g, "layernorm-epsilon"), *b = given(g, "norm-epsilon");
      MPT_CHECK(!a || !b || static_cast<float>(a->get<double>()) == static_cast<float>(b->get<double>()),
                str("--norm-epsilon ", dump(*b), " and --layernorm-epsilon ", a ? dump(*a) : "", " disagree"),
                "they are one setting: give one of them");
      f.set(c, a ? *a : *b, a ? "--layernorm-epsilon" : "--norm-epsilon");
    };
    f.text = [](const json& v) { return str("--layernorm-epsilon ", static_cast<float>(v.get<double>())); };
    f.required = true;
    v.push_back(f);
  }
  {
    ArchField f;
    f.key = "normalization";
    f.kind = FieldKind::Choice;
    f.scope = FlagScope::Model;
    f.flags = {{"normalization", FlagType::Text, "LayerNorm (default) or RMSNorm"}};
    f.meaning = "LayerNorm or RMSNorm, in every block and the final norm";
    f.inference = checked;
    f.get = [](const C& c) { return json(to_string(c.normalization)); };
    f.set = [](C& c, const json& v, const std::string& what) {
      const std::string s = as_text(v, what);
      MPT_CHECK(s == "LayerNorm" || s == "RMSNorm", str(what, " ", s, " is not known"), "use LayerNorm or RMSNorm");
      c.normalization = parse_normalization(s);
    };
    f.reset = [](C& c) { c.normalization = C{}.normalization; };
    f.apply = [f](const GivenFlags& g, C& c) { f.set(c, *given(g, "normalization"), "--normalization"); };
    f.text = [](const json& v) { return "--normalization " + dump(v); };
    v.push_back(f);
  }
  {
    ArchField f;
    f.key = "mlp";
    f.kind = FieldKind::Choice;
    f.scope = FlagScope::Model;
    f.flags = {{"swiglu", FlagType::Switch, "SwiGLU MLP: fc is (2F, C) = [gate | up], silu(gate)·up"},
               {"geglu", FlagType::Switch, "GeGLU MLP (Gemma): fc is (2F, C) = [gate | up], gelu(gate)·up with the tanh GELU"},
               {"exact-gelu", FlagType::Switch,
                "GELU is x·Φ(x) with erf (HF BERT's \"gelu\", torch's F.gelu; Megatron's unfused path) instead of "
                "the tanh approximation (the default: GPT-2, Megatron's fused bias_gelu)"},
               {"openai-gelu", FlagType::Switch, "the tanh-approximation GELU (Megatron's name; the default here)"},
               {"relu", FlagType::Switch, "ReLU MLP: max(fc, 0) (the original T5's DenseReluDense)"}};
    f.meaning = "the MLP: gelu (tanh), gelu_erf, swiglu, geglu or relu";
    f.inference = checked;
    f.get = [](const C& c) { return json(to_string(c.mlp)); };
    f.set = [](C& c, const json& v, const std::string& what) {
      try {
        c.mlp = parse_mlp_kind(as_text(v, what));
      } catch (const Error& e) {
        MPT_THROW(str(what, ": ", e.what()), "");
      }
    };
    f.reset = [](C& c) { c.mlp = C{}.mlp; };
    f.apply = [](const GivenFlags& g, C& c) {
      const bool sw = on(g, "swiglu"), ge = on(g, "geglu"), erf = on(g, "exact-gelu"), tanh = on(g, "openai-gelu");
      const bool relu = on(g, "relu");
      MPT_CHECK(!relu || !(sw || ge || erf || tanh), "--relu with --swiglu, --geglu, --exact-gelu or --openai-gelu",
                "the MLP has one activation: give one");
      MPT_CHECK(!(erf && tanh), "--exact-gelu and --openai-gelu both given",
                "--openai-gelu is the tanh approximation, --exact-gelu the erf form: give one");
      MPT_CHECK(!(sw && ge), "--swiglu and --geglu both given", "a gated MLP has one activation: give one");
      MPT_CHECK(!(sw && (erf || tanh)), "--exact-gelu / --openai-gelu with --swiglu: the SwiGLU MLP has no GELU",
                "drop the GELU flag");
      MPT_CHECK(!(ge && erf), "--exact-gelu with --geglu: the GeGLU MLP's GELU is the tanh approximation",
                "drop --exact-gelu");
      c.mlp = relu ? MlpKind::ReLU : sw ? MlpKind::SwiGLU : ge ? MlpKind::GeGLU : erf ? MlpKind::GeluErf : MlpKind::GeluTanh;
    };
    f.text = [](const json& v) {
      const MlpKind k = parse_mlp_kind(v.get<std::string>());
      return std::string(k == MlpKind::SwiGLU   ? "--swiglu"
                         : k == MlpKind::GeGLU   ? "--geglu"
                         : k == MlpKind::GeluErf ? "--exact-gelu"
                         : k == MlpKind::ReLU    ? "--relu"
                                                 : "--openai-gelu (the tanh GELU MLP)");
    };
    // Before the key: "swiglu" true, "gelu_exact" true, or the tanh GELU.
    f.legacy = [](const json& j) {
      if (j.value("swiglu", false)) return json("swiglu");
      return json(j.value("gelu_exact", false) ? "gelu_erf" : "gelu");
    };
    v.push_back(f);
  }
  {
    ArchField f;
    f.key = "position_embedding";
    f.kind = FieldKind::Choice;
    f.scope = FlagScope::Model;
    f.flags = {{"position-embedding-type", FlagType::Text, "learned_absolute (default), rope, none, or relative (T5)"},
               {"use-rotary-position-embeddings", FlagType::Switch, "= --position-embedding-type rope"},
               {"no-position-embedding", FlagType::Switch,
                "no learned position table (with learned_absolute: position type none)"}};
    f.meaning = "learned_absolute (wpe), rope, none or relative (T5's bucketed bias)";
    f.inference = checked;
    f.get = [](const C& c) { return json(to_string(c.position_embedding)); };
    f.set = [](C& c, const json& v, const std::string& what) {
      const std::string s = as_text(v, what);
      MPT_CHECK(s == "learned_absolute" || s == "rope" || s == "none" || s == "relative", str(what, " ", s, " is not known"),
                "use learned_absolute, rope, none or relative (T5)");
      c.position_embedding = parse_position_embedding(s);
    };
    f.reset = [](C& c) { c.position_embedding = C{}.position_embedding; };
    f.apply = [](const GivenFlags& g, C& c) {
      const json* type = given(g, "position-embedding-type");
      PositionEmbedding pe =
          type ? parse_position_embedding(as_text(*type, "--position-embedding-type")) : c.position_embedding;
      if (on(g, "use-rotary-position-embeddings")) {
        MPT_CHECK(!type || pe == PositionEmbedding::Rope,
                  str("--use-rotary-position-embeddings with --position-embedding-type ", dump(*type)),
                  "rope replaces learned positions: drop one of the two");
        pe = PositionEmbedding::Rope;
      }
      if (on(g, "no-position-embedding") && pe == PositionEmbedding::Learned) pe = PositionEmbedding::None;
      c.position_embedding = pe;
    };
    f.text = [](const json& v) { return "--position-embedding-type " + dump(v); };
    v.push_back(f);
  }
  for (const bool base : {true, false}) {
    ArchField f;
    f.key = base ? "rotary_base" : "rotary_percent";
    f.kind = FieldKind::Choice;
    f.scope = FlagScope::Model;
    const std::string flag = base ? "rotary-base" : "rotary-percent";
    f.flags = {{flag, FlagType::Float,
                base ? "rope's base θ (default 10000; Llama 3: 500000)"
                     : "fraction of each head's dims that rope rotates (default 1)"}};
    f.meaning = base ? "rope's θ base" : "the fraction of each head's dims rope rotates (rotate-half convention)";
    f.inference = checked;
    double C::*m = base ? &C::rotary_base : &C::rotary_percent;
    f.get = [m](const C& c) { return json(c.*m); };
    f.set = [m, base](C& c, const json& v, const std::string& what) {
      c.*m = base ? as_num(v, what, 0, 1e12, true, false) : as_num(v, what, 0, 1, true, false);
    };
    f.reset = [m](C& c) { c.*m = C{}.*m; };
    f.apply = [f, flag](const GivenFlags& g, C& c) {
      MPT_CHECK(c.position_embedding == PositionEmbedding::Rope,
                str("--", flag, " applies to rotary positions, but the position type is ", to_string(c.position_embedding)),
                "add --position-embedding-type rope, or drop the flag");
      f.set(c, *given(g, flag), "--" + flag);
    };
    f.text = [flag](const json& v) { return str("--", flag, " ", v.get<double>()); };
    v.push_back(f);
  }
  v.push_back(switch_row("untie_embeddings", FlagScope::Model, "untie-embeddings-and-output-weights",
                         "an output layer of its own (head.weight)", &C::untie_embeddings, false,
                         "an output layer head.weight of its own instead of the tied wte", checked));
  v.push_back(switch_row("add_bias_linear", FlagScope::Model, "disable-bias-linear",
                         "no biases in the attention and MLP linears", &C::add_bias_linear, true,
                         "biases on the qkv, attention output and both MLP linears", checked));
  v.push_back(switch_row("add_qkv_bias", FlagScope::Model, "add-qkv-bias",
                         "a bias on the qkv projection even with --disable-bias-linear (Qwen2)", &C::add_qkv_bias, false,
                         "a qkv bias when the other linears have none (Qwen2)", checked));
  v.push_back(switch_row("layernorm_1p", FlagScope::Model, "apply-layernorm-1p",
                         "every norm scales by (1 + w), w initialised to 0 (Gemma's RMSNorm)", &C::layernorm_1p, false,
                         "norms scale by (1 + w) (Megatron's --apply-layernorm-1p; Gemma)", checked));
  v.push_back(switch_row("scale_embeddings", FlagScope::Model, "scale-embeddings",
                         "multiply the word embeddings by sqrt(hidden) (Gemma; the tied head is unscaled)",
                         &C::scale_embeddings, false, "the word embeddings times sqrt(C) (Gemma)", checked));
  {
    // Megatron's --window-size is the (left, right) pair of flash attention's window; mpitron's
    // decoders are causal, so right is 0: "W", "W,0" and "(W, 0)" all give W.
    ArchField f;
    f.key = "window_size";
    f.kind = FieldKind::Choice;
    f.scope = FlagScope::Model;
    f.flags = {{"window-size", FlagType::Text,
                "sliding-window attention: W or W,0 (Megatron's (left, right)); query i sees keys i-W..i (Mistral)"}};
    f.meaning = "sliding-window attention: query i sees keys i − W … i (0: every earlier key)";
    f.inference = checked;
    f.get = [](const C& c) { return json(c.window_size); };
    f.set = [](C& c, const json& v, const std::string& what) { c.window_size = as_int(v, what, 0, max_of("window_size")); };
    f.reset = [](C& c) { c.window_size = 0; };
    f.apply = [](const GivenFlags& g, C& c) {
      std::string s = as_text(*given(g, "window-size"), "--window-size");
      std::string t;
      for (char ch : s)
        if (ch != ' ' && ch != '(' && ch != ')') t += ch;
      const size_t comma = t.find(',');
      const std::string left = t.substr(0, comma), right = comma == std::string::npos ? "0" : t.substr(comma + 1);
      const auto number = [&](const std::string& x) {
        MPT_CHECK(!x.empty() && x.find_first_not_of("-0123456789") == std::string::npos && x.size() < 12,
                  str("--window-size ", s, " is not W or W,0"), "give the window as a count of earlier keys, e.g. 4096");
        return std::stoll(x);
      };
      const int64_t l = number(left), r = number(right);
      MPT_CHECK(r == 0, str("--window-size ", s, ": the right bound must be 0"),
                "mpitron's decoders are causal: a query sees no later key");
      MPT_CHECK(l >= 1, str("--window-size ", s, ": the left bound must be >= 1 (give no --window-size for none)"), "");
      c.window_size = l;
    };
    f.text = [](const json& v) { return v.get<int64_t>() > 0 ? str("--window-size ", v.get<int64_t>()) : std::string("no --window-size"); };
    v.push_back(f);
  }
  {
    // Megatron-Core's window_attn_skip_freq: N (every N-th layer attends globally) or a 0/1 list (1: sliding).
    ArchField f;
    f.key = "window_attn_skip_freq";
    f.kind = FieldKind::Choice;
    f.scope = FlagScope::Model;
    f.flags = {{"window-attn-skip-freq", FlagType::Text,
                "with --window-size, which layers slide: N (layers l with (l+1) % N == 0 attend globally, the others "
                "slide; Gemma 2: 2, Gemma 3: 6) or a list of 1 (sliding) / 0 (global) per layer; default: all slide"}};
    f.meaning = "which layers slide: every N-th attends globally, or a 1/0 pattern per layer (0: every layer slides)";
    f.inference = checked;
    f.get = [](const C& c) {
      if (c.window_layer_pattern.empty()) return json(c.window_attn_skip_freq);
      json a = json::array();
      for (const uint8_t b : c.window_layer_pattern) a.push_back(static_cast<int>(b));
      return a;
    };
    f.set = [](C& c, const json& v, const std::string& what) {
      c.window_layer_pattern.clear();
      c.window_attn_skip_freq = 0;
      if (v.is_array()) {
        MPT_CHECK(!v.empty(), str(what, " is an empty list"), "give one 0/1 per layer, or an integer N");
        for (const json& e : v) c.window_layer_pattern.push_back(static_cast<uint8_t>(as_int(e, what + " entry", 0, 1)));
      } else {
        c.window_attn_skip_freq = as_int(v, what, 0, max_of("window_attn_skip_freq"));
      }
    };
    f.reset = [](C& c) {
      c.window_attn_skip_freq = 0;
      c.window_layer_pattern.clear();
    };
    f.apply = [f](const GivenFlags& g, C& c) {
      std::string t;
      for (const char ch : as_text(*given(g, "window-attn-skip-freq"), "--window-attn-skip-freq"))
        if (ch != ' ') t += ch;
      json parsed;
      if (!t.empty() && t.front() == '[') {
        parsed = json::parse(t, nullptr, false);
        MPT_CHECK(parsed.is_array(), str("--window-attn-skip-freq ", t, " is not a list of 0 and 1"),
                  "give an integer N or a list such as [1,1,1,1,1,0] (one entry per layer)");
      } else {
        MPT_CHECK(!t.empty() && t.size() < 12 && t.find_first_not_of("0123456789") == std::string::npos,
                  str("--window-attn-skip-freq ", t, " is neither an integer nor a list"),
                  "give an integer N or a list such as [1,1,1,1,1,0]");
        parsed = std::stoll(t);
      }
      f.set(c, parsed, "--window-attn-skip-freq");
    };
    f.text = [](const json& v) { return str("--window-attn-skip-freq ", v.dump()); };
    v.push_back(f);
  }
  v.push_back(float_row("rotary_base_local", FieldKind::Choice, "local-rotary-base",
                        "the sliding layers' rope base, unscaled (Gemma 3's rope_local_base_freq: 10000); "
                        "default: the global rope",
                        &C::rotary_base_local, 0, 1e12, "the sliding layers' rope base (0: the global rope's)", checked));
  {
    // Rope scaling: one row, the value as transformers' rope_scaling object ({"rope_type": …}; null: none).
    ArchField f;
    f.key = "rope_scaling";
    f.kind = FieldKind::Choice;
    f.scope = FlagScope::Model;
    f.flags = {{"use-rope-scaling", FlagType::Switch,
                "Llama 3.1's rope scaling (llama3: factor --rope-scaling-factor, default 8; low/high frequency "
                "factors 1 and 4; original context 8192)"},
               {"rope-scaling-type", FlagType::Text, "rope scaling as transformers' rope_type: linear, dynamic, llama3, yarn"},
               {"rope-scaling-factor", FlagType::Float, "the rope scaling factor (Megatron's default 8 with --use-rope-scaling)"},
               {"rotary-scaling-factor", FlagType::Float, "the same as --rope-scaling-factor (Megatron-Core's YaRN name)"},
               {"original-max-position-embeddings", FlagType::Int,
                "llama3, yarn, dynamic: the context the model was pre-trained with (llama3 default 8192)"},
               {"rope-scaling-low-freq-factor", FlagType::Float, "llama3: low_freq_factor (default 1)"},
               {"rope-scaling-high-freq-factor", FlagType::Float, "llama3: high_freq_factor (default 4)"},
               {"beta-fast", FlagType::Float, "yarn: beta_fast (default 32)"},
               {"beta-slow", FlagType::Float, "yarn: beta_slow (default 1)"},
               {"mscale", FlagType::Float, "yarn: mscale (with --mscale-all-dim: the attention factor's ratio)"},
               {"mscale-all-dim", FlagType::Float, "yarn: mscale_all_dim"},
               {"rope-attention-factor", FlagType::Float, "yarn: attention_factor (default: 0.1·ln(factor) + 1)"}};
    f.meaning = "rope's frequency scaling, as transformers' rope_scaling (llama3, linear, dynamic, yarn; null: none)";
    f.inference = checked;
    f.get = [](const C& c) { return rope_scaling_json(c.rope_scaling); };
    f.set = [](C& c, const json& v, const std::string& what) { c.rope_scaling = rope_scaling_from_json(v, what); };
    f.reset = [](C& c) { c.rope_scaling = RopeScaling{}; };
    f.apply = [f](const GivenFlags& g, C& c) {
      MPT_CHECK(c.position_embedding == PositionEmbedding::Rope, "rope scaling flags apply to rotary positions",
                "add --position-embedding-type rope, or drop them");
      json r = rope_scaling_json(c.rope_scaling);
      if (r.is_null()) r = json::object();
      const json* type = given(g, "rope-scaling-type");
      if (on(g, "use-rope-scaling")) {
        MPT_CHECK(!type || as_text(*type, "--rope-scaling-type") == "llama3",
                  str("--use-rope-scaling (llama3) with --rope-scaling-type ", dump(*type)), "give one of the two");
        r["rope_type"] = "llama3";
        r["factor"] = 8.0, r["low_freq_factor"] = 1.0, r["high_freq_factor"] = 4.0;  // Megatron's apply_rope_scaling
        r["original_max_position_embeddings"] = 8192;
      } else if (type) {
        r["rope_type"] = as_text(*type, "--rope-scaling-type");
      }
      MPT_CHECK(r.contains("rope_type"), "a rope scaling flag without --use-rope-scaling or --rope-scaling-type",
                "add --rope-scaling-type linear|dynamic|llama3|yarn (or --use-rope-scaling for Llama 3.1's)");
      const std::pair<const char*, const char*> nums[] = {
          {"rope-scaling-factor", "factor"}, {"rotary-scaling-factor", "factor"},
          {"original-max-position-embeddings", "original_max_position_embeddings"},
          {"rope-scaling-low-freq-factor", "low_freq_factor"}, {"rope-scaling-high-freq-factor", "high_freq_factor"},
          {"beta-fast", "beta_fast"}, {"beta-slow", "beta_slow"}, {"mscale", "mscale"}, {"mscale-all-dim", "mscale_all_dim"},
          {"rope-attention-factor", "attention_factor"}};
      for (const auto& [flag, key] : nums)
        if (const json* x = given(g, flag)) r[key] = *x;
      if (r["rope_type"] == "dynamic" && !r.contains("original_max_position_embeddings"))
        r["original_max_position_embeddings"] = c.max_position_embeddings;
      f.set(c, r, "the rope scaling flags");
    };
    f.text = [](const json& v) { return v.is_null() ? std::string("no rope scaling") : str("rope scaling ", v.dump()); };
    v.push_back(f);
  }
  {
    ArchField f;
    f.key = "qk_norm";
    f.kind = FieldKind::Choice;
    f.scope = FlagScope::Model;
    f.flags = {{"qk-layernorm", FlagType::Switch,
                "QK-norm: normalise each query and key head (one weight of the head width; Qwen3, Gemma 3), with "
                "the --normalization kind"},
               {"qk-layernorm-full-width", FlagType::Switch,
                "QK-norm over each token's whole query and key widths (OLMo-2)"}};
    f.meaning = "QK-norm: none, per_head (Qwen3, Gemma 3) or full_width (OLMo-2)";
    f.inference = checked;
    f.get = [](const C& c) { return json(to_string(c.qk_norm)); };
    f.set = [](C& c, const json& v, const std::string& what) {
      const std::string s = as_text(v, what);
      MPT_CHECK(s == "none" || s == "per_head" || s == "full_width", str(what, " ", s, " is not known"),
                "use none, per_head or full_width");
      c.qk_norm = s == "none" ? QkNorm::None : s == "per_head" ? QkNorm::PerHead : QkNorm::FullWidth;
    };
    f.reset = [](C& c) { c.qk_norm = QkNorm::None; };
    f.apply = [](const GivenFlags& g, C& c) {
      c.qk_norm = on(g, "qk-layernorm-full-width") ? QkNorm::FullWidth : QkNorm::PerHead;
    };
    f.text = [](const json& v) {
      return v == "none" ? std::string("no --qk-layernorm")
                         : v == "per_head" ? std::string("--qk-layernorm") : std::string("--qk-layernorm-full-width");
    };
    v.push_back(f);
  }
  {
    ArchField f;
    f.key = "norm_placement";
    f.kind = FieldKind::Choice;
    f.scope = FlagScope::Model;
    f.flags = {{"norm-placement", FlagType::Text,
                "where the block's norms sit: pre (into each sublayer; default), sandwich (also on each sublayer's "
                "output before the residual add: Gemma 2/3), output (only on the output: OLMo-2)"}};
    f.meaning = "the block's norms: pre, sandwich (pre and on each sublayer's output) or output";
    f.inference = checked;
    f.get = [](const C& c) { return json(to_string(c.norm_placement)); };
    f.set = [](C& c, const json& v, const std::string& what) {
      const std::string s = as_text(v, what);
      MPT_CHECK(s == "pre" || s == "sandwich" || s == "output", str(what, " ", s, " is not known"),
                "use pre, sandwich or output");
      c.norm_placement = s == "pre" ? NormPlacement::Pre : s == "sandwich" ? NormPlacement::Sandwich : NormPlacement::Output;
    };
    f.reset = [](C& c) { c.norm_placement = NormPlacement::Pre; };
    f.apply = [f](const GivenFlags& g, C& c) { f.set(c, *given(g, "norm-placement"), "--norm-placement"); };
    f.text = [](const json& v) { return "--norm-placement " + dump(v); };
    v.push_back(f);
  }
  v.push_back(float_row("attn_logit_softcapping", FieldKind::Choice, "attn-logit-softcapping",
                        "attention scores ← cap·tanh(scores/cap) after scaling, before the mask (Gemma 2: 50); default none",
                        &C::attn_logit_softcapping, 0, 1e30, "the attention scores' soft cap (0: none)", checked));
  v.push_back(float_row("final_logit_softcapping", FieldKind::Choice, "final-logit-softcapping",
                        "output logits ← cap·tanh(logits/cap) (Gemma 2: 30); default none", &C::final_logit_softcapping,
                        0, 1e30, "the output logits' soft cap (0: none)", checked));
  v.push_back(float_row("query_pre_attn_scalar", FieldKind::Choice, "query-pre-attn-scalar",
                        "attention scores scaled by this to the −½ (Gemma 2/3); default the head width",
                        &C::query_pre_attn_scalar, 0, 1e30, "the attention scale's base: scores × s^−½ (0: the head width)",
                        checked));
  // Multi-latent attention (model/layers/mla_layer.h): Megatron's flags; the sizes weigh only with it on.
  v.push_back(switch_row("multi_latent_attention", FlagScope::Model, "multi-latent-attention",
                         "multi-latent attention (DeepSeek-V2/V3): keys and values from a per-token latent",
                         &C::multi_latent_attention, false, "multi-latent attention (DeepSeek)", checked));
  for (const auto& [key, flag, help, m, lo] :
       std::vector<std::tuple<std::string, std::string, std::string, int64_t C::*, int64_t>>{
           {"q_lora_rank", "q-lora-rank", "MLA: the query's latent width (default none: a plain query projection)",
            &C::q_lora_rank, 0},
           {"kv_lora_rank", "kv-lora-rank", "MLA: the key/value latent's width (default 512)", &C::kv_lora_rank, 1},
           {"qk_head_dim", "qk-head-dim", "MLA: each head's query/key dims without rope (default 128)", &C::qk_head_dim, 1},
           {"qk_pos_emb_head_dim", "qk-pos-emb-head-dim", "MLA: the rope dims of queries and the shared key (default 64)",
            &C::qk_pos_emb_head_dim, 2},
           {"v_head_dim", "v-head-dim", "MLA: each head's value width (default 128)", &C::v_head_dim, 1}}) {
    ArchField f = int_row(key, FieldKind::Shape, flag, help, m, lo, "MLA: " + help.substr(5), checked);
    f.sizes_weights = [](const C& c) { return c.multi_latent_attention; };
    f.required = false;
    v.push_back(f);
  }
  // Mixture of Experts (model/layers/moe_layer.h). Checkpoints from before these keys are dense.
  {
    ArchField f = int_row("num_experts", FieldKind::Shape, "num-experts",
                          "Mixture of Experts: routed experts per MoE layer (default: dense MLPs)", &C::num_experts, 0,
                          "E routed experts in each MoE layer (0: dense MLPs)", checked);
    f.apply = [](const GivenFlags& g, C& c) { c.num_experts = as_int(*given(g, "num-experts"), "--num-experts", 1, max_of("num_experts")); };
    f.text = [](const json& v) { return v.get<int64_t>() > 0 ? str("--num-experts ", v.get<int64_t>()) : std::string("no --num-experts"); };
    f.required = false;
    v.push_back(f);
  }
  {
    ArchField f = int_row("moe_router_topk", FieldKind::Choice, "moe-router-topk", "experts per token (default 2)",
                          &C::moe_router_topk, 1, "k, the experts each token is routed to", checked);
    f.required = false;
    v.push_back(f);
  }
  {
    ArchField f = int_row("moe_ffn_hidden_size", FieldKind::Shape, "moe-ffn-hidden-size",
                          "each routed expert's MLP width (default --ffn-hidden-size)", &C::moe_ffn_hidden_size, 0,
                          "Fe, each expert's MLP width (default F; 0 in a dense model)", checked);
    f.get = [](const C& c) { return json(c.moe() ? c.moe_ffn() : 0); };
    f.apply = [](const GivenFlags& g, C& c) {
      c.moe_ffn_hidden_size = as_int(*given(g, "moe-ffn-hidden-size"), "--moe-ffn-hidden-size", 1, max_of("moe_ffn_hidden_size"));
    };
    f.sizes_weights = [](const C& c) { return c.moe(); };
    f.required = false;
    v.push_back(f);
  }
  {
    // Megatron's --moe-layer-freq: an integer N (every N-th layer, from layer 0) or a list "[1,1,0,0]".
    ArchField f;
    f.key = "moe_layer_freq";
    f.kind = FieldKind::Shape;
    f.scope = FlagScope::Model;
    f.flags = {{"moe-layer-freq", FlagType::Text,
                "which layers are MoE: N (layers 0, N, 2N, …; default 1: all) or a list of 0/1 per layer, e.g. [1,1,0,0]"}};
    f.meaning = "the MoE layers: every N-th from layer 0, or a 0/1 pattern per layer";
    f.inference = checked;
    f.get = [](const C& c) {
      if (c.moe_layer_pattern.empty()) return json(c.moe_layer_freq);
      json a = json::array();
      for (const uint8_t b : c.moe_layer_pattern) a.push_back(static_cast<int>(b));
      return a;
    };
    f.set = [](C& c, const json& v, const std::string& what) {
      if (v.is_array()) {
        // An empty list would leave the pattern empty, which reads as "every layer": refused, not replaced.
        MPT_CHECK(!v.empty(), str(what, " is an empty list"),
                  "give one 0/1 per layer (e.g. [1,1,0,0]), or an integer N (every N-th layer)");
        c.moe_layer_pattern.clear();
        for (const json& e : v) c.moe_layer_pattern.push_back(static_cast<uint8_t>(as_int(e, what + " entry", 0, 1)));
        c.moe_layer_freq = 1;
      } else {
        c.moe_layer_freq = as_int(v, what, 1, max_of("moe_layer_freq"));
        c.moe_layer_pattern.clear();
      }
    };
    f.reset = [](C& c) {
      c.moe_layer_freq = 1;
      c.moe_layer_pattern.clear();
    };
    f.apply = [f](const GivenFlags& g, C& c) {
      std::string t;
      for (const char ch : as_text(*given(g, "moe-layer-freq"), "--moe-layer-freq"))
        if (ch != ' ') t += ch;
      json parsed;
      if (!t.empty() && t.front() == '[') {
        parsed = json::parse(t, nullptr, false);
        MPT_CHECK(parsed.is_array(), str("--moe-layer-freq ", t, " is not a list of 0 and 1"),
                  "give an integer N or a list such as [1,1,0,0] (one entry per layer)");
      } else {
        MPT_CHECK(!t.empty() && t.size() < 12 && t.find_first_not_of("0123456789") == std::string::npos,
                  str("--moe-layer-freq ", t, " is neither an integer nor a list"),
                  "give an integer N or a list such as [1,1,0,0] (Megatron's Python expressions are not read)");
        parsed = std::stoll(t);
      }
      f.set(c, parsed, "--moe-layer-freq");
    };
    f.text = [](const json& v) { return str("--moe-layer-freq ", v.dump()); };
    f.sizes_weights = [](const C& c) { return c.moe(); };
    v.push_back(f);
  }
  {
    ArchField f;
    f.key = "moe_router_score_function";
    f.kind = FieldKind::Choice;
    f.scope = FlagScope::Model;
    f.flags = {{"moe-router-score-function", FlagType::Text, "softmax (default) or sigmoid"}};
    f.meaning = "the router's scores: softmax or sigmoid";
    f.inference = checked;
    f.get = [](const C& c) { return json(to_string(c.moe_router_score_function)); };
    f.set = [](C& c, const json& v, const std::string& what) {
      const std::string s = as_text(v, what);
      MPT_CHECK(s == "softmax" || s == "sigmoid", str(what, " ", s, " is not known"), "use softmax or sigmoid");
      c.moe_router_score_function = parse_moe_score(s);
    };
    f.reset = [](C& c) { c.moe_router_score_function = C{}.moe_router_score_function; };
    f.apply = [f](const GivenFlags& g, C& c) {
      f.set(c, *given(g, "moe-router-score-function"), "--moe-router-score-function");
    };
    f.text = [](const json& v) { return "--moe-router-score-function " + dump(v); };
    v.push_back(f);
  }
  v.push_back(switch_row("moe_router_enable_expert_bias", FlagScope::Model, "moe-router-enable-expert-bias",
                         "aux-loss-free balancing (DeepSeek-V3): a per-expert bias added to the sigmoid scores for "
                         "selection only, moved after every step toward the mean load (token counts summed over all ranks)",
                         &C::moe_router_enable_expert_bias, false,
                         "a per-expert bias on the selection scores (kept in the checkpoint's buffers)", checked));
  v.back().kind = FieldKind::Run;  // checkpoints from before the key hold the buffers: the flag given wins
  for (const bool groups : {true, false}) {
    ArchField f = int_row(groups ? "moe_router_num_groups" : "moe_router_group_topk", FieldKind::Choice,
                          groups ? "moe-router-num-groups" : "moe-router-group-topk",
                          groups ? "group-limited routing: the experts in G equal groups (DeepSeek-V3: 8)"
                                 : "group-limited routing: top-k among the g best groups (DeepSeek-V3: 4)",
                          groups ? &C::moe_router_num_groups : &C::moe_router_group_topk, 0,
                          groups ? "the routing groups (0: none)" : "the groups a token's experts come from (0: any)", checked);
    f.required = false;
    v.push_back(f);
  }
  v.push_back(plain_row("moe_router_group_score_topk", FieldKind::Choice, &C::moe_router_group_score_topk,
                        "a routing group's score: the sum of its best this-many scores (0: topk / group-topk, "
                        "Megatron's; DeepSeek-V3's transformers code: 2)"));
  // Multi-token prediction (model/gpt_mtp.cpp). A Run field: a checkpoint with or without the MTP layers
  // loads into a run without or with them (their weights dropped, or initialised, with a warning).
  {
    ArchField f = int_row("mtp_num_layers", FieldKind::Run, "mtp-num-layers",
                          "multi-token prediction: D more layers on the last stage, layer k predicting token i + 1 + k "
                          "(DeepSeek-V3: 1)",
                          &C::mtp_num_layers, 0, "the multi-token prediction depth D (0: none)",
                          "ignored: generation reads the main head");
    f.required = false;
    v.push_back(f);
  }
  v.push_back(float_row("mtp_loss_scaling_factor", FieldKind::Run, "mtp-loss-scaling-factor",
                        "the MTP losses' weight: loss = lm + factor / D · Σ mtp_k (default 0.1)",
                        &C::mtp_loss_scaling_factor, 0, 1e6, "the MTP losses' weight λ", "ignored"));
  v.push_back(switch_row("moe_router_pre_softmax", FlagScope::Model, "moe-router-pre-softmax",
                         "the top-k of the softmax over all experts, unnormalised (Qwen2-MoE); default: the softmax "
                         "of the k chosen logits (Mixtral)",
                         &C::moe_router_pre_softmax, false, "top-k after the softmax over all experts", checked));
  {
    ArchField f;
    f.key = "moe_router_topk_scaling_factor";
    f.kind = FieldKind::Choice;
    f.scope = FlagScope::Model;
    f.flags = {{"moe-router-topk-scaling-factor", FlagType::Float, "the routing probabilities times this (default 1)"}};
    f.meaning = "the routing probabilities' factor";
    f.inference = checked;
    f.get = [](const C& c) { return json(static_cast<double>(c.moe_router_topk_scaling_factor)); };
    f.set = [](C& c, const json& v, const std::string& what) {
      c.moe_router_topk_scaling_factor = static_cast<float>(as_num(v, what, 0, 1e6, true, false));
    };
    f.reset = [](C& c) { c.moe_router_topk_scaling_factor = 1.0f; };
    f.apply = [f](const GivenFlags& g, C& c) {
      f.set(c, *given(g, "moe-router-topk-scaling-factor"), "--moe-router-topk-scaling-factor");
    };
    f.text = [](const json& v) { return str("--moe-router-topk-scaling-factor ", v.get<double>()); };
    v.push_back(f);
  }
  {
    ArchField f = int_row("moe_shared_expert_intermediate_size", FieldKind::Shape, "moe-shared-expert-intermediate-size",
                          "the shared experts' total MLP width (default: no shared experts)",
                          &C::moe_shared_expert_intermediate_size, 0, "Fs, the shared experts' width (0: none)", checked);
    f.required = false;
    v.push_back(f);
  }
  v.push_back(switch_row("moe_shared_expert_gate", FlagScope::Model, "moe-shared-expert-gate",
                         "the shared experts' output times sigmoid(x · wgᵀ) (Qwen2-MoE's shared_expert_gate)",
                         &C::moe_shared_expert_gate, false, "a sigmoid gate on the shared experts", checked));
  // BERT (model/bert.h): set by pretrain_bert / finetune and their own flags.
  v.push_back(plain_row("bert", FieldKind::Choice, &C::bert, "a BERT encoder with its heads"));
  v.push_back(plain_row("causal", FieldKind::Choice, &C::causal, "causal attention (false: BERT's bidirectional)"));
  v.push_back(switch_row("post_ln", FlagScope::Bert, "bert-post-ln",
                         "the original BERT's post-LN blocks and embedding LayerNorm (Hugging Face checkpoints); "
                         "default pre-LN with a final LayerNorm, as Megatron's BERT",
                         &C::post_ln, false, "post-LN blocks and an embedding LayerNorm (the original BERT)",
                         "from the checkpoint"));
  v.push_back(switch_row("binary_head", FlagScope::Bert, "bert-no-binary-head",
                         "no pooler and sentence-order head (one segment per sample, no token types)", &C::binary_head,
                         true, "BERT's pooler and sentence-order head", "from the checkpoint"));
  v.push_back(plain_row("num_tokentypes", FieldKind::Shape, &C::num_tokentypes, "token-type embedding rows (BERT)"));
  v.push_back(plain_row("num_classes", FieldKind::Shape, &C::num_classes, "classes of a fine-tuned BERT classifier"));
  // T5 (model/t5.h): set by pretrain_t5 and its flags. Checkpoints from before these keys are not T5.
  v.push_back(plain_row("t5", FieldKind::Choice, &C::t5, "a T5 encoder-decoder"));
  {
    // Megatron's --encoder-num-layers / --decoder-num-layers; --num-layers alone gives both stacks that many
    // (pretrain_t5 sums them into num_layers before this row: model/training/arguments.cpp).
    ArchField f = int_row("encoder_num_layers", FieldKind::Shape, "encoder-num-layers",
                          "T5: the encoder's blocks (default --num-layers)", &C::encoder_num_layers, 0,
                          "T5: Le, the encoder's blocks (layers 0 … Le−1; the rest are the decoder's)", checked);
    f.scope = FlagScope::T5;
    f.flags.push_back({"decoder-num-layers", FlagType::Int, "T5: the decoder's blocks (default --num-layers)"});
    f.apply = [](const GivenFlags&, C&) {};  // pretrain_t5 resolves the pair with --num-layers (t5_layer_flags)
    f.text = [](const json& v) { return str("--encoder-num-layers ", dump(v)); };
    f.required = false;
    v.push_back(f);
  }
  {
    ArchField f = int_row("decoder_seq_length", FieldKind::Run, "decoder-seq-length",
                          "T5: the decoder's tokens per sample (--seq-length is the encoder's)", &C::decoder_seq_length,
                          0, "T5: Td, the decoder's tokens per sample", checked);
    f.scope = FlagScope::T5;
    f.required = false;
    v.push_back(f);
  }
  for (const bool buckets : {true, false}) {
    ArchField f = int_row(buckets ? "relative_attention_num_buckets" : "relative_attention_max_distance",
                          FieldKind::Choice,
                          buckets ? "relative-attention-num-buckets" : "relative-attention-max-distance",
                          buckets ? "T5's relative position buckets (default 32)"
                                  : "T5's distance where the buckets stop growing (default 128)",
                          buckets ? &C::relative_attention_num_buckets : &C::relative_attention_max_distance, 2,
                          buckets ? "T5's relative position buckets" : "T5's relative positions' maximum distance",
                          checked);
    f.scope = FlagScope::T5;
    f.kind = buckets ? FieldKind::Shape : FieldKind::Choice;
    f.sizes_weights = [](const C& c) { return c.relative_positions(); };
    f.required = false;
    v.push_back(f);
  }
  return v;
}

// "--hidden-size 64 (checkpoint: 32)", "--swiglu (checkpoint: --openai-gelu …)".
std::string difference(const ArchField& f, const json& run, const json& saved) {
  const std::string a = f.text(run);
  std::string b = f.text(saved);
  const size_t sp = a.find(' ');
  if (a.rfind("--", 0) == 0 && sp != std::string::npos && b.rfind(a.substr(0, sp + 1), 0) == 0) b = b.substr(sp + 1);
  return str(a, " (checkpoint: ", b, ")");
}

}  // namespace

bool ArchField::flag_given(const GivenFlags& g) const {
  for (const ArchFlag& f : flags)
    if (on(g, f.name)) return true;
  return false;
}

const std::vector<ArchField>& arch_fields() {
  static const std::vector<ArchField> rows = build();
  return rows;
}

const ArchField& arch_field(const std::string& key) {
  for (const ArchField& f : arch_fields())
    if (f.key == key) return f;
  MPT_THROW(str("internal: no architecture field ", key), "");
}

json config_to_json(const TransformerConfig& c) {
  json j = json::object();
  for (const ArchField& f : arch_fields()) j[f.key] = f.get(c);
  j["family"] = c.family();
  return j;
}

TransformerConfig config_from_json(const json& j, const std::string& where) {
  TransformerConfig c;
  MPT_CHECK(j.is_object(), str(where, ": model_config ", j.dump(), " is not a JSON object"), "");
  for (const ArchField& f : arch_fields()) {
    const std::string what = str(where, ": model_config key ", f.key);
    try {
      if (j.contains(f.key)) f.set(c, j.at(f.key), what);
      else if (f.legacy) f.set(c, f.legacy(j), what + " (from the older keys)");
      else MPT_CHECK(!f.required, str(where, ": model_config ", j.dump(), " is incomplete: no ", f.key), "");
    } catch (const Error& e) {
      MPT_THROW(e.what(), "was it written by a newer mpitron?");
    }
  }
  // The family the checkpoint was written as (checked against its pins where it is used: families.h).
  if (j.contains("family") && j["family"].is_string() && j["family"] != "custom") c.family_name = j["family"].get<std::string>();
  // Written as the effective values: the defaults read back as their implicit form.
  if (c.kv_channels * c.num_attention_heads == c.hidden_size) c.kv_channels = 0;
  if (c.num_query_groups == c.num_attention_heads) c.num_query_groups = 0;
  c.hidden_dropout = 0.0f;
  c.attention_dropout = 0.0f;
  return c;
}

void apply_model_flags(const GivenFlags& given, TransformerConfig& c, const std::set<FlagScope>& scopes) {
  for (const ArchField& f : arch_fields())
    if (scopes.count(f.scope) && f.flag_given(given)) f.apply(given, c);
}

std::string field_differences(const TransformerConfig& run, const TransformerConfig& saved,
                              const std::set<FieldKind>& kinds, const std::set<std::string>& skip) {
  std::string out;
  for (const ArchField& f : arch_fields()) {
    if (!kinds.count(f.kind_for(saved)) || skip.count(f.key)) continue;
    const json a = f.get(run), b = f.get(saved);
    if (a != b) out += str(out.empty() ? "" : ", ", difference(f, a, b));
  }
  return out;
}

void reconcile_with_checkpoint(const GivenFlags& given, const TransformerConfig& saved, TransformerConfig& m,
                               bool fill, const std::string& where, const std::set<std::string>& skip) {
  MPT_CHECK(saved.bert == m.bert && saved.t5 == m.t5,
            str("checkpoint ", where, " holds a ", saved.kind(), " (", saved.tool(), ") but this run builds a ", m.kind()),
            str("load it with ", saved.tool()));
  std::string wrong, hint;
  for (const ArchField& f : arch_fields()) {
    if (f.scope == FlagScope::None || skip.count(f.key)) continue;
    if (!f.flag_given(given)) {
      if (fill) f.set(m, f.get(saved), str("checkpoint ", where, " ", f.key));
      continue;
    }
    if (fill && f.kind_for(saved) == FieldKind::Run) continue;  // the run's own: the given flag wins
    const json a = f.get(m), b = f.get(saved);
    if (a == b) continue;
    wrong += str(wrong.empty() ? "" : ", ", difference(f, a, b));
    if (hint.empty()) hint = f.hint;
  }
  if (m.family_name.empty()) m.family_name = saved.family_name;  // the model keeps its identity (where it is still one)
  if (fill) {  // the implicit forms, as config_from_json
    if (m.kv_channels * m.num_attention_heads == m.hidden_size) m.kv_channels = 0;
    if (m.num_query_groups == m.num_attention_heads) m.num_query_groups = 0;
  }
  MPT_CHECK(wrong.empty(), str("the model flags disagree with the checkpoint ", where, ": ", wrong),
            hint.empty() ? "give the values the checkpoint was trained with, or drop them (--use-checkpoint-args fills them)"
                         : hint);
}

}  // namespace mpitron
