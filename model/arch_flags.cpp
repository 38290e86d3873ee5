#include "model/arch_flags.h"
#include "model/flag_given.h"

#include <cmath>

#include "core/error.h"

namespace po = boost::program_options;

namespace mpitron {

namespace {
const char* kFlags[] = {"normalization", "norm-epsilon", "swiglu", "position-embedding-type", "rotary-base",
                        "rotary-percent", "use-rotary-position-embeddings", "no-position-embedding",
                        "group-query-attention", "num-query-groups", "untie-embeddings-and-output-weights",
                        "disable-bias-linear", "exact-gelu", "openai-gelu"};
}  // namespace

void add_architecture_flags(po::options_description& d, ArchFlags& f) {
  po::options_description g("Architecture (model family; docs/model-families.md)");
  g.add_options()
      ("normalization", po::value(&f.normalization), "LayerNorm (default) or RMSNorm")
      ("norm-epsilon", po::value(&f.norm_epsilon), "epsilon of either norm (= --layernorm-epsilon)")
      ("swiglu", po::bool_switch(&f.swiglu), "SwiGLU MLP: fc is (2F, C) = [gate | up], silu(gate)·up")
      ("position-embedding-type", po::value(&f.position_embedding_type),
       "learned_absolute (default), rope or none")
      ("use-rotary-position-embeddings", po::bool_switch(&f.rope), "= --position-embedding-type rope")
      ("rotary-base", po::value(&f.rotary_base), "rope's base θ (default 10000; Llama 3: 500000)")
      ("rotary-percent", po::value(&f.rotary_percent), "fraction of each head's dims that rope rotates (default 1)")
      ("no-position-embedding", po::bool_switch(&f.no_position_embedding),
       "no learned position table (with learned_absolute: position type none)")
      ("group-query-attention", po::bool_switch(&f.gqa), "grouped-query attention (with --num-query-groups)")
      ("num-query-groups", po::value(&f.num_query_groups),
       "key/value heads with --group-query-attention (default 1: multi-query)")
      ("untie-embeddings-and-output-weights", po::bool_switch(&f.untie), "an output layer of its own (head.weight)")
      ("disable-bias-linear", po::bool_switch(&f.no_bias), "no biases in the attention and MLP linears")
      ("exact-gelu", po::bool_switch(&f.exact_gelu),
       "GELU is x·Φ(x) with erf (HF BERT's \"gelu\", torch's F.gelu; Megatron's unfused path) instead of the tanh "
       "approximation (the default: GPT-2, Megatron's fused bias_gelu)")
      ("openai-gelu", po::bool_switch(&f.openai_gelu), "the tanh-approximation GELU (Megatron's name; the default here)");
  d.add(g);
}

bool architecture_flags_given(const po::variables_map& vm) {
  for (const char* flag : kFlags)
    if (flag_given(vm, flag) && (vm[flag].value().type() != typeid(bool) || vm[flag].as<bool>())) return true;
  return false;
}

void apply_architecture_flags(const po::variables_map& vm, const ArchFlags& f, GPTConfig& m) {
  m.normalization = parse_normalization(f.normalization);
  if (flag_given(vm, "norm-epsilon")) {
    MPT_CHECK(!flag_given(vm, "layernorm-epsilon") || vm["layernorm-epsilon"].as<float>() == f.norm_epsilon,
              str("--norm-epsilon ", f.norm_epsilon, " and --layernorm-epsilon ", vm["layernorm-epsilon"].as<float>(),
                  " disagree"),
              "they are one setting: give one of them");
    MPT_CHECK(std::isfinite(f.norm_epsilon) && f.norm_epsilon > 0, str("--norm-epsilon must be > 0, got ", f.norm_epsilon),
              "Llama uses 1e-5 or 1e-6");
    m.layernorm_epsilon = f.norm_epsilon;
  }
  m.swiglu = f.swiglu;
  PositionEmbedding pe = parse_position_embedding(f.position_embedding_type);
  if (f.rope) {
    MPT_CHECK(!flag_given(vm, "position-embedding-type") || pe == PositionEmbedding::Rope,
              str("--use-rotary-position-embeddings with --position-embedding-type ", f.position_embedding_type),
              "rope replaces learned positions: drop one of the two");
    pe = PositionEmbedding::Rope;
  }
  if (f.no_position_embedding && pe == PositionEmbedding::Learned) pe = PositionEmbedding::None;
  m.position_embedding = pe;
  const bool rope = pe == PositionEmbedding::Rope;
  for (const char* flag : {"rotary-base", "rotary-percent"})
    MPT_CHECK(rope || !flag_given(vm, flag), str("--", flag, " applies to rotary positions, but the position type is ",
                                            to_string(pe)),
              "add --position-embedding-type rope, or drop the flag");
  MPT_CHECK(std::isfinite(f.rotary_base) && f.rotary_base > 0, str("--rotary-base must be > 0, got ", f.rotary_base), "");
  MPT_CHECK(std::isfinite(f.rotary_percent) && f.rotary_percent > 0 && f.rotary_percent <= 1,
            str("--rotary-percent must be in (0, 1], got ", f.rotary_percent), "");
  m.rotary_base = f.rotary_base;
  m.rotary_percent = f.rotary_percent;
  MPT_CHECK(f.gqa || !flag_given(vm, "num-query-groups"), "--num-query-groups is given without --group-query-attention",
            "add --group-query-attention (Megatron ignores the groups without it)");
  if (f.gqa) {
    MPT_CHECK(f.num_query_groups >= 1 && m.num_attention_heads % f.num_query_groups == 0,
              str("--num-query-groups ", f.num_query_groups, " must divide --num-attention-heads ", m.num_attention_heads),
              "each group serves heads / groups query heads, e.g. 32 heads with 8 groups");
    m.num_query_groups = f.num_query_groups;
  } else {
    m.num_query_groups = 0;
  }
  m.untie_embeddings = f.untie;
  m.add_bias_linear = !f.no_bias;
  MPT_CHECK(!(f.exact_gelu && f.openai_gelu), "--exact-gelu and --openai-gelu both given",
            "--openai-gelu is the tanh approximation, --exact-gelu the erf form: give one");
  m.gelu_exact = f.exact_gelu;
}

void copy_architecture(const GPTConfig& from, GPTConfig& to) {
  to.normalization = from.normalization;
  to.layernorm_epsilon = from.layernorm_epsilon;
  to.swiglu = from.swiglu;
  to.position_embedding = from.position_embedding;
  to.rotary_base = from.rotary_base;
  to.rotary_percent = from.rotary_percent;
  to.num_query_groups = from.num_query_groups;
  to.untie_embeddings = from.untie_embeddings;
  to.add_bias_linear = from.add_bias_linear;
  to.gelu_exact = from.gelu_exact;
}

std::string architecture_differences(const GPTConfig& a, const GPTConfig& b) {
  std::string out;
  auto diff = [&](bool differs, const std::string& item) {
    if (differs) out += (out.empty() ? "" : ", ") + item;
  };
  diff(a.normalization != b.normalization,
       str("--normalization ", to_string(a.normalization), " (checkpoint: ", to_string(b.normalization), ")"));
  diff(a.swiglu != b.swiglu, str("--swiglu ", a.swiglu ? "on" : "off", " (checkpoint: ", b.swiglu ? "on" : "off", ")"));
  diff(a.position_embedding != b.position_embedding,
       str("--position-embedding-type ", to_string(a.position_embedding), " (checkpoint: ",
           to_string(b.position_embedding), ")"));
  diff(a.rotary_base != b.rotary_base, str("--rotary-base ", a.rotary_base, " (checkpoint: ", b.rotary_base, ")"));
  diff(a.rotary_percent != b.rotary_percent,
       str("--rotary-percent ", a.rotary_percent, " (checkpoint: ", b.rotary_percent, ")"));
  diff(a.query_groups() != b.query_groups(),
       str("--num-query-groups ", a.query_groups(), " (checkpoint: ", b.query_groups(), ")"));
  diff(a.untie_embeddings != b.untie_embeddings,
       str("--untie-embeddings-and-output-weights ", a.untie_embeddings ? "on" : "off", " (checkpoint: ",
           b.untie_embeddings ? "on" : "off", ")"));
  diff(a.add_bias_linear != b.add_bias_linear,
       str("--disable-bias-linear ", a.add_bias_linear ? "off" : "on", " (checkpoint: ", b.add_bias_linear ? "off" : "on",
           ")"));
  diff(a.gelu_exact != b.gelu_exact,
       str("--exact-gelu ", a.gelu_exact ? "on" : "off", " (checkpoint: ", b.gelu_exact ? "on" : "off", ")"));
  return out;
}

}  // namespace mpitron
