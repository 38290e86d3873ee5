// T5 (T5ForConditionalGeneration): the encoder-decoder with relative positions.
#include <cmath>

#include "core/error.h"
#include "model/arch_fields.h"
#include "model/families/kit.h"
#include "model/families/rows.h"

namespace mpitron {

using namespace family_kit;

namespace {

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

// T5ForConditionalGeneration's: {t} is the layer's block (encoder.block.{j}. or decoder.block.{j}.),
// {m} its MLP sublayer (layer.1. in the encoder, layer.2. in the decoder, after the cross-attention).
// transformers does not scale the scores: our query rows carry √HD; a tied T5 scales the decoder's
// output by C^−½ before the head: our final norm carries it.
HfNames t5_names() {
  using R = ParamRole;
  const std::string a = "{t}layer.0.SelfAttention.", x = "{t}layer.1.EncDecAttention.", d = "{t}{m}DenseReluDense.";
  const auto root_hd = [](const TransformerConfig& c) { return std::sqrt(static_cast<double>(c.head_dim())); };
  HfName qkv = nm({a + "q.weight", a + "k.weight", a + "v.weight"});
  qkv.adjust = [root_hd](const TransformerConfig& c, const ParamSpec&, HfName& n) { n.factor = {root_hd(c), 1.0, 1.0}; };
  HfName xq = nm({x + "q.weight"});
  xq.adjust = [root_hd](const TransformerConfig& c, const ParamSpec&, HfName& n) { n.factor = {root_hd(c)}; };
  HfName fc = nm({d + "wi.weight"});
  fc.adjust = [d](const TransformerConfig& c, const ParamSpec&, HfName& n) {
    if (mlp_gated(c.mlp)) n.names = {d + "wi_0.weight", d + "wi_1.weight"};
  };
  HfName wte = nm({"shared.weight"}, HfTransform::Copy, {"encoder.embed_tokens.weight", "decoder.embed_tokens.weight"});
  wte.adjust = [](const TransformerConfig& c, const ParamSpec&, HfName& n) {
    if (!c.untie_embeddings) n.tied.push_back("lm_head.weight");
  };
  HfName lnf = nm({"decoder.final_layer_norm.weight"});
  lnf.adjust = [](const TransformerConfig& c, const ParamSpec&, HfName& n) {
    if (!c.untie_embeddings) n.factor = {1.0 / std::sqrt(static_cast<double>(c.hidden_size))};
  };
  const std::string rb = "block.0.layer.0.SelfAttention.relative_attention_bias.weight";
  return {{R::WordEmbedding, wte},
          {R::Norm1Weight, nm({"{t}layer.0.layer_norm.weight"})},
          {R::QkvWeight, qkv},
          {R::ProjWeight, nm({a + "o.weight"})},
          {R::Norm3Weight, nm({"{t}layer.1.layer_norm.weight"})},
          {R::CrossQWeight, xq},
          {R::CrossKvWeight, nm({x + "k.weight", x + "v.weight"})},
          {R::CrossProjWeight, nm({x + "o.weight"})},
          {R::Norm2Weight, nm({"{t}{m}layer_norm.weight"})},
          {R::FcWeight, fc},
          {R::MlpProjWeight, nm({d + "wo.weight"})},
          {R::EncoderRelativeBias, nm({"encoder." + rb})},
          {R::DecoderRelativeBias, nm({"decoder." + rb})},
          {R::EncoderFinalNormWeight, nm({"encoder.final_layer_norm.weight"})},
          {R::FinalNormWeight, lnf},
          {R::OutputWeight, nm({"lm_head.weight"})}};
}

std::string t5_var(const TransformerConfig& c, int64_t l, const std::string& var) {
  const bool dec = c.is_decoder_layer(l);
  if (var == "t") return dec ? str("decoder.block.", l - c.encoder_num_layers, ".") : str("encoder.block.", l, ".");
  if (var == "m") return dec ? "layer.2." : "layer.1.";
  MPT_THROW(str("T5's HF names have no {", var, "}"), "");
}

}  // namespace

Family t5_family() {
  Family f;
  f.name = "t5";
  f.hf_class = "T5ForConditionalGeneration";
  f.hf_model_types = {"t5"};
  f.hf_classes_read = {"T5ForConditionalGeneration"};
  f.hf_names = t5_names();
  f.hf_var = t5_var;
  f.pins = {when("t5", [](const C& c) { return c.t5; }, "a T5 model (pretrain_t5)"),
            is("normalization", "RMSNorm"), is("position_embedding", "relative"),
            when("mlp", [](const C& c) { return c.mlp == MlpKind::ReLU || c.mlp == MlpKind::GeGLU; },
                 "a ReLU or GeGLU MLP (--relu or --geglu)"),
            is("add_bias_linear", false), plain("num_query_groups", "no --group-query-attention"),
            is("num_experts", 0), is("layernorm_1p", false), is("scale_embeddings", false)};
  f.pins = join(f.pins, plain_attention());
  f.hf_defaults = [](C& c) {  // T5Config's defaults where a key is absent
    c.t5 = true, c.normalization = Normalization::RMSNorm, c.mlp = MlpKind::ReLU;
    c.position_embedding = PositionEmbedding::Relative, c.add_bias_linear = false, c.layernorm_epsilon = 1e-6f;
    c.vocab_size = 32128, c.hidden_size = 512, c.kv_channels = 64, c.ffn_hidden_size = 2048, c.num_attention_heads = 8;
    c.encoder_num_layers = 6, c.num_layers = 12;
    c.max_position_embeddings = c.seq_length = c.decoder_seq_length = 512;
  };
  f.hf_keys = t5_keys();
  return f;
}

}  // namespace mpitron
