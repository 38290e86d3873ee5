// The architecture-field table (model/arch_fields.h) and the family table (model/families.h):
//  * every family's configuration survives model_config JSON both ways, and a checkpoint
//    written before a key existed reads as it meant (swiglu / gelu_exact → the MLP kind);
//  * a value of the wrong type or out of bounds is refused naming the key (not truncated);
//  * the differences a run and a checkpoint have are named as flags with both values;
//  * reconcile_with_checkpoint: --use-checkpoint-args fills what is not given, a given Run
//    field (--seq-length) wins, a given Shape/Choice field must agree;
//  * each family is recognised from its configuration, and what a mix lacks is named;
//  * model/ (but for its training/ flag layer) includes no Boost.Program_options.
#include <doctest/doctest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "model/arch_fields.h"
#include "model/families.h"
#include "tests/error_of.h"

using namespace mpitron;
using mpitron::testing_util::error_of;
using nlohmann::json;

namespace {

bool has(const std::string& s, const std::string& t) { return s.find(t) != std::string::npos; }

TransformerConfig llama() {
  TransformerConfig c;
  c.num_layers = 2, c.hidden_size = 32, c.num_attention_heads = 4, c.num_query_groups = 2, c.ffn_hidden_size = 48;
  c.seq_length = 16, c.max_position_embeddings = 32, c.vocab_size = 100, c.padded_vocab_size = 128;
  c.normalization = Normalization::RMSNorm, c.mlp = MlpKind::SwiGLU, c.position_embedding = PositionEmbedding::Rope;
  c.rotary_base = 500000, c.untie_embeddings = true, c.add_bias_linear = false, c.layernorm_epsilon = 1e-6f;
  return c;
}

TransformerConfig bert() {
  TransformerConfig c;
  c.num_layers = 2, c.hidden_size = 48, c.num_attention_heads = 4, c.seq_length = 16, c.max_position_embeddings = 16;
  c.bert = true, c.causal = false, c.post_ln = true, c.num_tokentypes = 2, c.mlp = MlpKind::GeluErf;
  return c;
}

std::vector<std::pair<std::string, TransformerConfig>> examples() {
  TransformerConfig gqa_kv = llama();
  gqa_kv.kv_channels = 16;  // NH·HD = 64 ≠ C = 32
  gqa_kv.mlp = MlpKind::GeluTanh;  // RMSNorm with a GELU MLP: no family's
  return {{"gpt2", TransformerConfig{}}, {"llama", llama()}, {"bert", bert()}, {"custom", gqa_kv}};
}

}  // namespace

TEST_CASE("model_config JSON: every family round-trips; old checkpoints read as they meant") {
  for (const auto& [name, c] : examples()) {
    CAPTURE(name);
    CHECK(c.family() == name);
    const json j = config_to_json(c);
    CHECK(j["family"] == name);
    for (const ArchField& f : arch_fields()) CHECK_MESSAGE(j.contains(f.key), f.key);
    const TransformerConfig back = config_from_json(j, "test");
    CHECK(field_differences(back, c, {FieldKind::Shape, FieldKind::Choice, FieldKind::Run}).empty());
    CHECK(config_to_json(back) == j);
  }
  // Before the "mlp" and "kv_channels" keys: swiglu / gelu_exact said the MLP.
  json old = config_to_json(llama());
  old.erase("mlp");
  old.erase("kv_channels");
  old["swiglu"] = true;
  CHECK(config_from_json(old, "old").mlp == MlpKind::SwiGLU);
  CHECK(config_from_json(old, "old").head_dim() == 8);
  old["swiglu"] = false;
  old["gelu_exact"] = true;
  CHECK(config_from_json(old, "old").mlp == MlpKind::GeluErf);
  old.erase("gelu_exact");
  CHECK(config_from_json(old, "old").mlp == MlpKind::GeluTanh);
}

TEST_CASE("model_config JSON: wrong types and bounds are refused naming the key, never truncated") {
  const json good = config_to_json(llama());
  const auto bad = [&](const std::string& key, const json& v) {
    json j = good;
    j[key] = v;
    return error_of([&] { config_from_json(j, "ckpt"); });
  };
  CHECK(has(bad("num_query_groups", 2.5), "num_query_groups must be an integer, got 2.5"));
  CHECK(has(bad("num_layers", "2"), "num_layers"));
  CHECK(has(bad("hidden_size", 0), "hidden_size must be in [1, "));
  CHECK(has(bad("max_position_embeddings", 1e15), "max_position_embeddings"));
  CHECK(has(bad("max_position_embeddings", int64_t{1} << 50), "must be in [1, "));
  CHECK(has(bad("normalization", "BatchNorm"), "BatchNorm"));
  CHECK(has(bad("mlp", "relu6"), "relu6"));
  CHECK(has(bad("rotary_percent", 1.5), "rotary_percent"));
  CHECK(has(bad("untie_embeddings", 1), "untie_embeddings"));
  json j = good;
  j.erase("num_layers");
  CHECK(has(error_of([&] { config_from_json(j, "ckpt"); }), "no num_layers"));
}

TEST_CASE("field_differences and reconcile_with_checkpoint name flags with both values") {
  const TransformerConfig saved = llama();
  TransformerConfig run = saved;
  run.hidden_size = 64;
  run.mlp = MlpKind::GeluTanh;
  run.seq_length = 8;
  const std::string d = field_differences(run, saved);
  CHECK(has(d, "--hidden-size 64 (checkpoint: 32)"));
  CHECK(has(d, "(checkpoint: --swiglu)"));
  CHECK(!has(d, "--seq-length"));  // a Run field

  // --use-checkpoint-args: what is not given comes from the checkpoint; a given --seq-length wins.
  TransformerConfig m;
  GivenFlags given{{"seq-length", 8}};
  apply_model_flags(given, m);
  reconcile_with_checkpoint(given, saved, m, /*fill=*/true, "ck");
  CHECK(m.seq_length == 8);
  CHECK(m.max_position_embeddings == 32);
  CHECK(field_differences(m, saved, {FieldKind::Shape, FieldKind::Choice}, {"padded_vocab_size"}).empty());
  CHECK(m.family() == "llama");
  m.validate();
  // The inference tools (no fill): a given --seq-length must be the training one.
  TransformerConfig i;
  apply_model_flags(given, i);
  CHECK(has(error_of([&] { reconcile_with_checkpoint(given, saved, i, false, "ck"); }), "--seq-length 8 (checkpoint: 16)"));
  CHECK(error_of([&] { reconcile_with_checkpoint(given, saved, i, false, "ck", {"seq_length"}); }).empty());
  // A given Shape or Choice flag must agree, filled or not.
  for (const bool fill : {true, false}) {
    TransformerConfig w;
    GivenFlags g{{"hidden-size", 64}, {"normalization", "LayerNorm"}, {"num-layers", 2}};
    apply_model_flags(g, w);
    const std::string e = error_of([&] { reconcile_with_checkpoint(g, saved, w, fill, "ck"); });
    CHECK(has(e, "--hidden-size 64 (checkpoint: 32)"));
    CHECK(has(e, "--normalization LayerNorm (checkpoint: RMSNorm)"));
    CHECK(!has(e, "--num-layers"));  // it agrees
  }
  // A BERT checkpoint is not a decoder's.
  TransformerConfig gpt;
  CHECK(has(error_of([&] { reconcile_with_checkpoint({}, bert(), gpt, true, "ck"); }), "holds a BERT"));
}

TEST_CASE("model flags: spellings, conflicts and bounds are the table's") {
  TransformerConfig c;
  apply_model_flags({{"normalization", "RMSNorm"}, {"swiglu", true}, {"use-rotary-position-embeddings", true},
                     {"rotary-base", 1e6}, {"group-query-attention", true}, {"num-query-groups", 4},
                     {"disable-bias-linear", true}, {"untie-embeddings-and-output-weights", true}, {"norm-epsilon", 1e-6}},
                    c);
  CHECK(c.family() == "llama");
  CHECK(c.query_groups() == 4);
  CHECK(c.layernorm_epsilon == 1e-6f);
  CHECK(c.rotary_base == 1e6);
  const auto err = [](GivenFlags g) {
    TransformerConfig c;
    return error_of([&] { apply_model_flags(g, c); });
  };
  CHECK(has(err({{"num-query-groups", 2}}), "without --group-query-attention"));
  CHECK(has(err({{"group-query-attention", true}, {"num-query-groups", 5}}), "must divide --num-attention-heads"));
  CHECK(has(err({{"rotary-base", 10.0}}), "--rotary-base applies to rotary positions"));
  CHECK(has(err({{"swiglu", true}, {"exact-gelu", true}}), "--swiglu"));
  CHECK(has(err({{"exact-gelu", true}, {"openai-gelu", true}}), "both given"));
  CHECK(has(err({{"norm-epsilon", 1e-6}, {"layernorm-epsilon", 1e-5}}), "disagree"));
  CHECK(has(err({{"num-layers", 0}}), "--num-layers must be in [1, "));
  CHECK(has(err({{"kv-channels", -3}}), "--kv-channels"));
  CHECK(has(err({{"position-embedding-type", "alibi"}}), "alibi"));
  CHECK(has(err({{"use-rotary-position-embeddings", true}, {"position-embedding-type", "learned_absolute"}}),
            "drop one of the two"));
  // --window-size: W, Megatron's (left, right) with right 0; a llama with a window is a mistral.
  for (const char* w : {"5", "5,0", "(5, 0)"}) {
    TransformerConfig m = llama();
    apply_model_flags({{"window-size", w}}, m);
    CHECK(m.window_size == 5);
    CHECK(m.family() == "mistral");
    CHECK(m.attention_mask() == AttentionMaskKind::SlidingWindow);
  }
  CHECK(has(err({{"window-size", "5,3"}}), "the right bound must be 0"));
  CHECK(has(err({{"window-size", "0"}}), "must be >= 1"));
  CHECK(has(err({{"window-size", "x"}}), "is not W or W,0"));
  TransformerConfig windowed_bert = bert();
  windowed_bert.window_size = 4;
  CHECK(has(error_of([&] { windowed_bert.validate(); }), "--window-size"));
}

TEST_CASE("attended keys (FLOPs): a sliding window counts min(i, W) + 1/2 keys per query") {
  TransformerConfig c = llama();
  c.seq_length = c.max_position_embeddings = 64;
  for (int64_t w : {0, 1, 5, 63, 64, 1000}) {
    c.window_size = w;
    double sum = 0;  // brute force: query i sees min(i, W) + 1 keys (all i + 1 without a window), the diagonal half
    for (int64_t i = 0; i < 64; ++i) sum += static_cast<double>(w > 0 ? std::min(i, w) : i) + 0.5;
    CHECK(c.attended_keys() == doctest::Approx(sum / 64).epsilon(1e-12));
  }
  c.window_size = 0;
  CHECK(c.attended_keys() == 32.0);  // T/2: the causal convention (llm.c, Megatron)
}

TEST_CASE("families: recognised from their fields; what a mix lacks is named as flags") {
  for (const Family& f : families()) CHECK(&find_family(f.name) == &f);
  CHECK(has(error_of([] { find_family("falcon"); }), "gpt2"));
  TransformerConfig c = llama();
  c.mlp = MlpKind::GeluTanh;
  CHECK(c.family() == "custom");
  CHECK(&closest_family(c) == &find_family("llama"));
  CHECK(family_misses(find_family("llama"), c) == "--swiglu");
  CHECK(has(family_misses(find_family("bert"), llama()), "--normalization LayerNorm"));
  // BERT's HF class needs more than pretrain_bert trains.
  TransformerConfig pre = bert();
  pre.post_ln = false;
  CHECK(pre.family() == "bert");
  CHECK(has(family_misses(find_family("bert"), pre, /*hf=*/true), "--bert-post-ln"));
  TransformerConfig rot = llama();
  rot.rotary_percent = 0.5;
  CHECK(has(family_misses(find_family("llama"), rot), "--rotary-percent 1"));
}

TEST_CASE("model/ has no Boost.Program_options outside its flag layers (model/flags/, model/training/)") {
  namespace fs = std::filesystem;
  int files = 0;
  for (const auto& e : fs::recursive_directory_iterator(std::string(MPITRON_SOURCE_DIR) + "/model")) {
    const std::string p = e.path().string();
    if (!e.is_regular_file() || p.find("/model/training/") != std::string::npos ||
        p.find("/model/flags/") != std::string::npos)
      continue;
    if (e.path().extension() != ".h" && e.path().extension() != ".cpp") continue;
    std::ifstream f(p);
    std::stringstream ss;
    ss << f.rdbuf();
    ++files;
    CHECK_MESSAGE(!has(ss.str(), "program_options"), p);
  }
  CHECK(files > 20);
}
