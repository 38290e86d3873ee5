// BERT (BertForPreTraining): the post-LN encoder with its MLM and sentence-order heads.
#include "core/error.h"
#include "model/arch_fields.h"
#include "model/families/kit.h"
#include "model/families/rows.h"

namespace mpitron {

using namespace family_kit;

namespace {

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

// BertForPreTraining's (post-LN: the attention's output LayerNorm is our ln1).
HfNames bert_names() {
  using R = ParamRole;
  const std::string b = "bert.encoder.layer.{l}.", e = "bert.embeddings.", t = "cls.predictions.transform.";
  return {{R::WordEmbedding, nm({e + "word_embeddings.weight"}, HfTransform::Copy, {"cls.predictions.decoder.weight"})},
          {R::PositionEmbedding, nm({e + "position_embeddings.weight"})},
          {R::TokentypeEmbedding, nm({e + "token_type_embeddings.weight"})},
          {R::EmbeddingNormWeight, nm({e + "LayerNorm.weight"})}, {R::EmbeddingNormBias, nm({e + "LayerNorm.bias"})},
          {R::Norm1Weight, nm({b + "attention.output.LayerNorm.weight"})},
          {R::Norm1Bias, nm({b + "attention.output.LayerNorm.bias"})},
          {R::QkvWeight, nm({b + "attention.self.query.weight", b + "attention.self.key.weight", b + "attention.self.value.weight"})},
          {R::QkvBias, nm({b + "attention.self.query.bias", b + "attention.self.key.bias", b + "attention.self.value.bias"})},
          {R::ProjWeight, nm({b + "attention.output.dense.weight"})}, {R::ProjBias, nm({b + "attention.output.dense.bias"})},
          {R::Norm2Weight, nm({b + "output.LayerNorm.weight"})}, {R::Norm2Bias, nm({b + "output.LayerNorm.bias"})},
          {R::FcWeight, nm({b + "intermediate.dense.weight"})}, {R::FcBias, nm({b + "intermediate.dense.bias"})},
          {R::MlpProjWeight, nm({b + "output.dense.weight"})}, {R::MlpProjBias, nm({b + "output.dense.bias"})},
          {R::LmHeadDenseWeight, nm({t + "dense.weight"})}, {R::LmHeadDenseBias, nm({t + "dense.bias"})},
          {R::LmHeadNormWeight, nm({t + "LayerNorm.weight"})}, {R::LmHeadNormBias, nm({t + "LayerNorm.bias"})},
          {R::LmHeadBias, nm({"cls.predictions.bias"}, HfTransform::Copy, {"cls.predictions.decoder.bias"})},
          {R::PoolerWeight, nm({"bert.pooler.dense.weight"})}, {R::PoolerBias, nm({"bert.pooler.dense.bias"})},
          {R::BinaryHeadWeight, nm({"cls.seq_relationship.weight"})}, {R::BinaryHeadBias, nm({"cls.seq_relationship.bias"})}};
}

}  // namespace

Family bert_family() {
  Family f;
  f.name = "bert";
  f.hf_class = "BertForPreTraining";
  f.hf_model_types = {"bert"};
  f.hf_classes_read = {"BertForPreTraining", "BertForMaskedLM"};
  f.hf_names = bert_names();
  f.pins = {when("bert", [](const C& c) { return c.bert; }, "a BERT model"), is("t5", false), is("causal", false),
            is("normalization", "LayerNorm"),
            when("mlp", [](const C& c) { return c.mlp == MlpKind::GeluTanh || c.mlp == MlpKind::GeluErf; },
                 "a GELU MLP (no --swiglu)"),
            is("position_embedding", "learned_absolute"), is("untie_embeddings", false), is("add_bias_linear", true),
            plain("num_query_groups", "no --group-query-attention"), plain("kv_channels", "no --kv-channels"),
            is("rope_scaling", nullptr)};
  f.pins = join(f.pins, plain_attention());
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
  return f;
}

}  // namespace mpitron
