#include "model/param_table.h"

#include <cmath>

#include "core/error.h"
#include "model/families.h"

namespace mpitron {

const char* to_string(ParamRole r) {
  switch (r) {
    case ParamRole::WordEmbedding: return "word_embedding";
    case ParamRole::PositionEmbedding: return "position_embedding";
    case ParamRole::Norm1Weight: return "norm1.weight";
    case ParamRole::Norm1Bias: return "norm1.bias";
    case ParamRole::QkvWeight: return "qkv.weight";
    case ParamRole::QkvBias: return "qkv.bias";
    case ParamRole::ProjWeight: return "proj.weight";
    case ParamRole::ProjBias: return "proj.bias";
    case ParamRole::Norm2Weight: return "norm2.weight";
    case ParamRole::Norm2Bias: return "norm2.bias";
    case ParamRole::FcWeight: return "fc.weight";
    case ParamRole::FcBias: return "fc.bias";
    case ParamRole::MlpProjWeight: return "mlp_proj.weight";
    case ParamRole::MlpProjBias: return "mlp_proj.bias";
    case ParamRole::FinalNormWeight: return "final_norm.weight";
    case ParamRole::FinalNormBias: return "final_norm.bias";
    case ParamRole::OutputWeight: return "output.weight";
    case ParamRole::TokentypeEmbedding: return "tokentype_embedding";
    case ParamRole::EmbeddingNormWeight: return "embedding_norm.weight";
    case ParamRole::EmbeddingNormBias: return "embedding_norm.bias";
    case ParamRole::LmHeadDenseWeight: return "lm_head.dense.weight";
    case ParamRole::LmHeadDenseBias: return "lm_head.dense.bias";
    case ParamRole::LmHeadNormWeight: return "lm_head.norm.weight";
    case ParamRole::LmHeadNormBias: return "lm_head.norm.bias";
    case ParamRole::LmHeadBias: return "lm_head.bias";
    case ParamRole::PoolerWeight: return "pooler.weight";
    case ParamRole::PoolerBias: return "pooler.bias";
    case ParamRole::BinaryHeadWeight: return "binary_head.weight";
    case ParamRole::BinaryHeadBias: return "binary_head.bias";
    case ParamRole::ClassificationHeadWeight: return "classification_head.weight";
    case ParamRole::ClassificationHeadBias: return "classification_head.bias";
    case ParamRole::RouterWeight: return "router.weight";
    case ParamRole::ExpertFcWeight: return "expert.fc.weight";
    case ParamRole::ExpertFcBias: return "expert.fc.bias";
    case ParamRole::ExpertProjWeight: return "expert.proj.weight";
    case ParamRole::ExpertProjBias: return "expert.proj.bias";
    case ParamRole::SharedFcWeight: return "shared.fc.weight";
    case ParamRole::SharedProjWeight: return "shared.proj.weight";
    case ParamRole::SharedGateWeight: return "shared.gate.weight";
    case ParamRole::Norm3Weight: return "norm3.weight";
    case ParamRole::Norm3Bias: return "norm3.bias";
    case ParamRole::CrossQWeight: return "cross_q.weight";
    case ParamRole::CrossQBias: return "cross_q.bias";
    case ParamRole::CrossKvWeight: return "cross_kv.weight";
    case ParamRole::CrossKvBias: return "cross_kv.bias";
    case ParamRole::CrossProjWeight: return "cross_proj.weight";
    case ParamRole::CrossProjBias: return "cross_proj.bias";
    case ParamRole::EncoderFinalNormWeight: return "encoder_final_norm.weight";
    case ParamRole::EncoderFinalNormBias: return "encoder_final_norm.bias";
    case ParamRole::EncoderRelativeBias: return "encoder_relative_bias";
    case ParamRole::DecoderRelativeBias: return "decoder_relative_bias";
  }
  return "?";
}

namespace {

ParamSpec row(std::string name, ParamRole role, Shape shape, ParamInit init, ParamPlace place, int64_t layer = -1) {
  ParamSpec s;
  s.name = std::move(name);
  s.role = role;
  s.global_shape = std::move(shape);
  s.init = init;
  s.place = place;
  s.layer = layer;
  s.weight_decay = init == ParamInit::Normal || init == ParamInit::OutputNormal;  // matrices and embeddings
  return s;
}

ParamSpec split(ParamSpec s, int axis, std::vector<int64_t> parts = {}) {
  s.tp_axis = axis;
  s.tp_parts = std::move(parts);
  return s;
}

ParamSpec matmul(ParamSpec s) {
  s.matmul = true;
  return s;
}

ParamSpec vocab(ParamSpec s) {
  s.vocab = true;
  return s;
}

// One scheme's entry of the HF column: the names ("{l}" is the layer), the transform, tied names.
struct HfAlt {
  HfScheme scheme;
  std::vector<std::string> names;
  HfTransform transform = HfTransform::Copy;
  std::vector<std::string> tied = {};
  std::vector<double> factor = {};
};

// The row with the HF column of `fam`'s scheme (none: the configuration has no family).
ParamSpec hf(ParamSpec s, const Family* fam, int64_t layer, std::initializer_list<HfAlt> alts) {
  if (!fam) return s;
  for (const HfAlt& a : alts) {
    if (a.scheme != fam->scheme) continue;
    for (std::string n : a.names) {
      const size_t at = n.find("{l}");
      if (at != std::string::npos) n.replace(at, 3, std::to_string(layer));
      s.hf.push_back(n);
    }
    s.hf_transform = a.transform;
    s.hf_tied = a.tied;
    s.hf_factor = a.factor;
  }
  return s;
}

// T5's cross-attention rows (a decoder layer's; model/layers/cross_attention_layer.h). t: the layer's HF
// prefix ("decoder.block.{j}.").
std::vector<ParamSpec> cross_rows(const GPTConfig& c, int64_t l, const Family* fam, const std::string& t) {
  const int64_t C = c.hidden_size, HD = c.head_dim(), q = c.num_attention_heads * HD, kv = c.query_groups() * HD;
  const bool ln_bias = c.norm_has_bias(), bias = c.add_bias_linear;
  const std::string p = str("layers.", l, ".");
  const std::string a = t + "layer.1.EncDecAttention.";
  using R = ParamRole;
  using I = ParamInit;
  const HfScheme S = HfScheme::T5;
  const ParamPlace L = ParamPlace::Layer;
  std::vector<ParamSpec> v;
  v.push_back(hf(row(p + "ln3.weight", R::Norm3Weight, {C}, I::Ones, L, l), fam, l, {{S, {t + "layer.1.layer_norm.weight"}}}));
  if (ln_bias) v.push_back(row(p + "ln3.bias", R::Norm3Bias, {C}, I::Zeros, L, l));
  v.push_back(hf(matmul(split(row(p + "xattn.q.weight", R::CrossQWeight, {q, C}, I::Normal, L, l), 0)), fam, l,
                 {{S, {a + "q.weight"}, HfTransform::Copy, {}, {std::sqrt(static_cast<double>(HD))}}}));
  if (bias) v.push_back(split(row(p + "xattn.q.bias", R::CrossQBias, {q}, I::Zeros, L, l), 0));
  v.push_back(hf(matmul(split(row(p + "xattn.kv.weight", R::CrossKvWeight, {2 * kv, C}, I::Normal, L, l), 0, {kv, kv})),
                 fam, l, {{S, {a + "k.weight", a + "v.weight"}}}));
  if (bias) v.push_back(split(row(p + "xattn.kv.bias", R::CrossKvBias, {2 * kv}, I::Zeros, L, l), 0, {kv, kv}));
  v.push_back(hf(matmul(split(row(p + "xattn.proj.weight", R::CrossProjWeight, {C, q}, I::OutputNormal, L, l), 1)), fam,
                 l, {{S, {a + "o.weight"}}}));
  if (bias) v.push_back(row(p + "xattn.proj.bias", R::CrossProjBias, {C}, I::Zeros, L, l));
  return v;
}

ParamSpec expert(ParamSpec s, int64_t e) {
  s.expert = e;
  return s;
}

// An MoE layer's MLP rows (model/layers/moe_layer.h): the router, the routed experts kind by kind
// (each kind's E rows consecutive), the shared experts.
std::vector<ParamSpec> moe_rows(const GPTConfig& c, int64_t l, const Family* fam) {
  const int64_t C = c.hidden_size, E = c.num_experts, Fe = c.moe_ffn(), Fs = c.moe_shared_expert_intermediate_size;
  const bool gated = mlp_gated(c.mlp), bias = c.add_bias_linear;
  const std::vector<int64_t> fc_parts = gated ? std::vector<int64_t>{Fe, Fe} : std::vector<int64_t>{};
  const std::string p = str("layers.", l, ".mlp.");
  using R = ParamRole;
  using I = ParamInit;
  const ParamPlace L = ParamPlace::Layer;
  // The HF column: the family's MoE names (model/families.h, HfMoeNames), when it has them.
  const HfMoeNames* n = fam && !fam->hf_moe.block.empty() ? &fam->hf_moe : nullptr;
  const std::string m = n ? str("model.layers.", l, ".", n->block) : std::string();
  auto named = [n](ParamSpec s, std::vector<std::string> names) {
    if (n) s.hf = std::move(names);
    return s;
  };
  auto ex = [&](int64_t e, const std::string& which) { return str(m, "experts.", e, ".", which, ".weight"); };
  std::vector<ParamSpec> v;
  v.push_back(named(matmul(row(p + "router.weight", R::RouterWeight, {E, C}, I::Normal, L, l)),
                    {n ? m + n->router + ".weight" : ""}));
  for (int64_t e = 0; e < E; ++e)
    v.push_back(named(expert(matmul(split(row(str(p, "experts.", e, ".fc.weight"), R::ExpertFcWeight,
                                              {c.expert_fc_rows(), C}, I::Normal, L, l), 0, fc_parts)), e),
                      {n ? ex(e, n->gate) : "", n ? ex(e, n->up) : ""}));
  if (bias)
    for (int64_t e = 0; e < E; ++e)
      v.push_back(expert(split(row(str(p, "experts.", e, ".fc.bias"), R::ExpertFcBias, {c.expert_fc_rows()}, I::Zeros, L, l),
                               0, fc_parts), e));
  for (int64_t e = 0; e < E; ++e)
    v.push_back(named(expert(matmul(split(row(str(p, "experts.", e, ".proj.weight"), R::ExpertProjWeight, {C, Fe},
                                              I::OutputNormal, L, l), 1)), e),
                      {n ? ex(e, n->down) : ""}));
  if (bias)
    for (int64_t e = 0; e < E; ++e)
      v.push_back(expert(row(str(p, "experts.", e, ".proj.bias"), R::ExpertProjBias, {C}, I::Zeros, L, l), e));
  if (Fs > 0) {
    const std::vector<int64_t> sparts = gated ? std::vector<int64_t>{Fs, Fs} : std::vector<int64_t>{};
    const std::string sh = n ? m + n->shared : std::string();
    v.push_back(named(matmul(split(row(p + "shared.fc.weight", R::SharedFcWeight, {c.shared_fc_rows(), C}, I::Normal, L, l),
                                   0, sparts)),
                      {n ? sh + n->gate + ".weight" : "", n ? sh + n->up + ".weight" : ""}));
    v.push_back(named(matmul(split(row(p + "shared.proj.weight", R::SharedProjWeight, {C, Fs}, I::OutputNormal, L, l), 1)),
                      {n ? sh + n->down + ".weight" : ""}));
    if (c.moe_shared_expert_gate)
      v.push_back(named(matmul(row(p + "shared.gate.weight", R::SharedGateWeight, {1, C}, I::Normal, L, l)),
                        {n ? m + n->shared_gate + ".weight" : ""}));
  }
  return v;
}

}  // namespace

std::vector<ParamSpec> block_param_table(const GPTConfig& c, int64_t l) {
  const int64_t C = c.hidden_size, F = c.ffn(), HD = c.head_dim();
  const int64_t q = c.num_attention_heads * HD, kv = c.query_groups() * HD;
  const std::vector<int64_t> qkv_parts{q, kv, kv};
  const std::vector<int64_t> fc_parts = mlp_gated(c.mlp) ? std::vector<int64_t>{F, F} : std::vector<int64_t>{};
  const std::string p = str("layers.", l, ".");
  const bool ln_bias = c.norm_has_bias(), bias = c.add_bias_linear;
  const Family* fam = family_of(c);
  using R = ParamRole;
  using I = ParamInit;
  using S = HfScheme;
  const HfTransform T = HfTransform::Transpose;
  const ParamPlace L = ParamPlace::Layer;
  const I norm_w = c.layernorm_1p ? I::Zeros : I::Ones;  // --apply-layernorm-1p: w of (1 + w)
  // The HF column: GPT-2 (GPT2LMHeadModel, after "transformer."), Llama and the families
  // built on it (model.layers.*), BERT (BertForPreTraining; post-LN, so its attention's
  // output LayerNorm is our ln1).
  const std::string g = "h.{l}.", m = "model.layers.{l}.", b = "bert.encoder.layer.{l}.";
  // T5 (T5ForConditionalGeneration): the encoder's block l, or the decoder's block l − Le, whose MLP is
  // its third sublayer (layer.2) after the cross-attention (layer.1); the queries carry √HD (hf_factor).
  const bool dec = c.is_decoder_layer(l);
  const std::string t = dec ? str("decoder.block.", l - c.encoder_num_layers, ".") : str("encoder.block.", l, ".");
  const std::string tm = t + (dec ? "layer.2." : "layer.1."), ta = t + "layer.0.SelfAttention.";
  const std::string wi = tm + "DenseReluDense.wi";
  const std::vector<std::string> t5_fc = mlp_gated(c.mlp) ? std::vector<std::string>{wi + "_0.weight", wi + "_1.weight"}
                                                          : std::vector<std::string>{wi + ".weight"};
  const double rhd = std::sqrt(static_cast<double>(HD));
  std::vector<ParamSpec> v;
  v.push_back(hf(row(p + "ln1.weight", R::Norm1Weight, {C}, norm_w, L, l), fam, l,
                 {{S::Gpt2, {g + "ln_1.weight"}}, {S::Llama, {m + "input_layernorm.weight"}},
                  {S::Bert, {b + "attention.output.LayerNorm.weight"}}, {S::T5, {t + "layer.0.layer_norm.weight"}}}));
  if (ln_bias)
    v.push_back(hf(row(p + "ln1.bias", R::Norm1Bias, {C}, I::Zeros, L, l), fam, l,
                   {{S::Gpt2, {g + "ln_1.bias"}}, {S::Bert, {b + "attention.output.LayerNorm.bias"}}}));
  v.push_back(hf(matmul(split(row(p + "attn.qkv.weight", R::QkvWeight, {q + 2 * kv, C}, I::Normal, L, l), 0, qkv_parts)),
                 fam, l,
                 {{S::Gpt2, {g + "attn.c_attn.weight"}, T},
                  {S::Llama, {m + "self_attn.q_proj.weight", m + "self_attn.k_proj.weight", m + "self_attn.v_proj.weight"}},
                  {S::Bert, {b + "attention.self.query.weight", b + "attention.self.key.weight",
                             b + "attention.self.value.weight"}},
                  {S::T5, {ta + "q.weight", ta + "k.weight", ta + "v.weight"}, HfTransform::Copy, {}, {rhd, 1.0, 1.0}}}));
  if (c.qkv_bias())
    v.push_back(hf(split(row(p + "attn.qkv.bias", R::QkvBias, {q + 2 * kv}, I::Zeros, L, l), 0, qkv_parts), fam, l,
                   {{S::Gpt2, {g + "attn.c_attn.bias"}},
                    {S::Llama, {m + "self_attn.q_proj.bias", m + "self_attn.k_proj.bias", m + "self_attn.v_proj.bias"}},
                    {S::Bert, {b + "attention.self.query.bias", b + "attention.self.key.bias",
                               b + "attention.self.value.bias"}}}));
  v.push_back(hf(matmul(split(row(p + "attn.proj.weight", R::ProjWeight, {C, q}, I::OutputNormal, L, l), 1)), fam, l,
                 {{S::Gpt2, {g + "attn.c_proj.weight"}, T}, {S::Llama, {m + "self_attn.o_proj.weight"}},
                  {S::Bert, {b + "attention.output.dense.weight"}}, {S::T5, {ta + "o.weight"}}}));
  if (bias)
    v.push_back(hf(row(p + "attn.proj.bias", R::ProjBias, {C}, I::Zeros, L, l), fam, l,
                   {{S::Gpt2, {g + "attn.c_proj.bias"}}, {S::Llama, {m + "self_attn.o_proj.bias"}},
                    {S::Bert, {b + "attention.output.dense.bias"}}}));
  if (dec)
    for (ParamSpec& s : cross_rows(c, l, fam, t)) v.push_back(std::move(s));
  v.push_back(hf(row(p + "ln2.weight", R::Norm2Weight, {C}, norm_w, L, l), fam, l,
                 {{S::Gpt2, {g + "ln_2.weight"}}, {S::Llama, {m + "post_attention_layernorm.weight"}},
                  {S::Bert, {b + "output.LayerNorm.weight"}}, {S::T5, {tm + "layer_norm.weight"}}}));
  if (ln_bias)
    v.push_back(hf(row(p + "ln2.bias", R::Norm2Bias, {C}, I::Zeros, L, l), fam, l,
                   {{S::Gpt2, {g + "ln_2.bias"}}, {S::Bert, {b + "output.LayerNorm.bias"}}}));
  if (c.is_moe_layer(l)) {
    for (ParamSpec& s : moe_rows(c, l, fam)) v.push_back(std::move(s));
    return v;
  }
  v.push_back(hf(matmul(split(row(p + "mlp.fc.weight", R::FcWeight, {c.fc_rows(), C}, I::Normal, L, l), 0, fc_parts)),
                 fam, l,
                 {{S::Gpt2, {g + "mlp.c_fc.weight"}, T}, {S::Llama, {m + "mlp.gate_proj.weight", m + "mlp.up_proj.weight"}},
                  {S::Bert, {b + "intermediate.dense.weight"}}, {S::T5, t5_fc}}));
  if (bias)
    v.push_back(hf(split(row(p + "mlp.fc.bias", R::FcBias, {c.fc_rows()}, I::Zeros, L, l), 0, fc_parts), fam, l,
                   {{S::Gpt2, {g + "mlp.c_fc.bias"}}, {S::Llama, {m + "mlp.gate_proj.bias", m + "mlp.up_proj.bias"}},
                    {S::Bert, {b + "intermediate.dense.bias"}}}));
  v.push_back(hf(matmul(split(row(p + "mlp.proj.weight", R::MlpProjWeight, {C, F}, I::OutputNormal, L, l), 1)), fam, l,
                 {{S::Gpt2, {g + "mlp.c_proj.weight"}, T}, {S::Llama, {m + "mlp.down_proj.weight"}},
                  {S::Bert, {b + "output.dense.weight"}}, {S::T5, {tm + "DenseReluDense.wo.weight"}}}));
  if (bias)
    v.push_back(hf(row(p + "mlp.proj.bias", R::MlpProjBias, {C}, I::Zeros, L, l), fam, l,
                   {{S::Gpt2, {g + "mlp.c_proj.bias"}}, {S::Llama, {m + "mlp.down_proj.bias"}},
                    {S::Bert, {b + "output.dense.bias"}}}));
  return v;
}

std::vector<ParamSpec> outer_param_table(const GPTConfig& c) {
  const int64_t C = c.hidden_size, V = c.padded_vocab_size;
  const Family* fam = family_of(c);
  using R = ParamRole;
  using I = ParamInit;
  using S = HfScheme;
  std::vector<ParamSpec> v;
  ParamSpec wte = split(row("wte", R::WordEmbedding, {V, C}, I::Normal,
                            c.tied_output() ? ParamPlace::FirstAndLast : ParamPlace::FirstStage),
                        0);
  wte.matmul = c.tied_output();  // the tied head's matmul
  const std::vector<std::string> tied_head = c.untie_embeddings ? std::vector<std::string>{}
                                                                : std::vector<std::string>{"lm_head.weight"};
  std::vector<std::string> t5_tied = {"encoder.embed_tokens.weight", "decoder.embed_tokens.weight"};
  if (!c.untie_embeddings) t5_tied.push_back("lm_head.weight");
  v.push_back(hf(vocab(wte), fam, 0,
                 {{S::Gpt2, {"wte.weight"}, HfTransform::Copy, {"lm_head.weight"}},
                  {S::Llama, {"model.embed_tokens.weight"}, HfTransform::Copy, tied_head},
                  {S::Bert, {"bert.embeddings.word_embeddings.weight"}, HfTransform::Copy,
                   {"cls.predictions.decoder.weight"}},
                  {S::T5, {"shared.weight"}, HfTransform::Copy, t5_tied}}));
  const ParamPlace first = ParamPlace::FirstStage, last = ParamPlace::LastStage;
  if (c.learned_positions())
    v.push_back(hf(row("wpe", R::PositionEmbedding, {c.max_position_embeddings, C}, I::Normal, first), fam, 0,
                   {{S::Gpt2, {"wpe.weight"}}, {S::Bert, {"bert.embeddings.position_embeddings.weight"}}}));
  if (c.num_tokentypes > 0)
    v.push_back(hf(row("tokentype_embeddings", R::TokentypeEmbedding, {c.num_tokentypes, C}, I::Normal, first), fam, 0,
                   {{S::Bert, {"bert.embeddings.token_type_embeddings.weight"}}}));
  if (c.post_ln) {  // the original BERT: LayerNorm on the embeddings, none after the last block
    v.push_back(hf(row("emb_ln.weight", R::EmbeddingNormWeight, {C}, I::Ones, first), fam, 0,
                   {{S::Bert, {"bert.embeddings.LayerNorm.weight"}}}));
    v.push_back(hf(row("emb_ln.bias", R::EmbeddingNormBias, {C}, I::Zeros, first), fam, 0,
                   {{S::Bert, {"bert.embeddings.LayerNorm.bias"}}}));
  } else {
    if (c.t5) {  // the relative position tables (buckets, NH), split by heads, and the encoder's final norm
      if (c.relative_positions()) {
        const std::string rb = "block.0.layer.0.SelfAttention.relative_attention_bias.weight";
        for (const bool enc : {true, false})
          v.push_back(hf(split(row(enc ? "enc_rel_bias.weight" : "dec_rel_bias.weight",
                                   enc ? R::EncoderRelativeBias : R::DecoderRelativeBias,
                                   {c.relative_attention_num_buckets, c.num_attention_heads}, I::Normal, first), 1),
                         fam, 0, {{S::T5, {(enc ? "encoder." : "decoder.") + rb}}}));
      }
      v.push_back(hf(row("enc_lnf.weight", R::EncoderFinalNormWeight, {C}, I::Ones, first), fam, 0,
                     {{S::T5, {"encoder.final_layer_norm.weight"}}}));
      if (c.norm_has_bias()) v.push_back(row("enc_lnf.bias", R::EncoderFinalNormBias, {C}, I::Zeros, first));
    }
    // The tied T5 scales the decoder's output by C^−½ before the head (HF): our final norm carries it.
    const std::vector<double> t5_lnf = c.untie_embeddings ? std::vector<double>{}
                                                          : std::vector<double>{1.0 / std::sqrt(static_cast<double>(C))};
    v.push_back(hf(row("lnf.weight", R::FinalNormWeight, {C}, c.layernorm_1p ? I::Zeros : I::Ones, last), fam, 0,
                   {{S::Gpt2, {"ln_f.weight"}}, {S::Llama, {"model.norm.weight"}},
                    {S::T5, {"decoder.final_layer_norm.weight"}, HfTransform::Copy, {}, t5_lnf}}));
    if (c.norm_has_bias())
      v.push_back(hf(row("lnf.bias", R::FinalNormBias, {C}, I::Zeros, last), fam, 0, {{S::Gpt2, {"ln_f.bias"}}}));
  }
  if (c.bert && c.num_classes > 0) {  // Megatron's Classification: pooler tanh(dense([CLS])), then dropout and a K-way linear
    v.push_back(matmul(row("pooler.dense.weight", R::PoolerWeight, {C, C}, I::Normal, last)));
    v.push_back(row("pooler.dense.bias", R::PoolerBias, {C}, I::Zeros, last));
    v.push_back(matmul(row("classification_head.weight", R::ClassificationHeadWeight, {c.num_classes, C}, I::Normal, last)));
    v.push_back(row("classification_head.bias", R::ClassificationHeadBias, {c.num_classes}, I::Zeros, last));
  } else if (c.bert) {
    // MLM head: dense + gelu + LayerNorm (replicated, computed on every TP rank),
    // then the tied decoder wte (vocab-parallel) with its own bias (vocab-parallel).
    const std::string t = "cls.predictions.transform.";
    v.push_back(hf(matmul(row("lm_head.dense.weight", R::LmHeadDenseWeight, {C, C}, I::Normal, last)), fam, 0,
                   {{S::Bert, {t + "dense.weight"}}}));
    v.push_back(hf(row("lm_head.dense.bias", R::LmHeadDenseBias, {C}, I::Zeros, last), fam, 0,
                   {{S::Bert, {t + "dense.bias"}}}));
    v.push_back(hf(row("lm_head.ln.weight", R::LmHeadNormWeight, {C}, I::Ones, last), fam, 0,
                   {{S::Bert, {t + "LayerNorm.weight"}}}));
    v.push_back(hf(row("lm_head.ln.bias", R::LmHeadNormBias, {C}, I::Zeros, last), fam, 0,
                   {{S::Bert, {t + "LayerNorm.bias"}}}));
    v.push_back(hf(vocab(split(row("lm_head.bias", R::LmHeadBias, {V}, I::Zeros, last), 0)), fam, 0,
                   {{S::Bert, {"cls.predictions.bias"}, HfTransform::Copy, {"cls.predictions.decoder.bias"}}}));
    if (c.binary_head) {  // pooler tanh(dense([CLS])) and the 2-way sentence-order classifier
      v.push_back(hf(matmul(row("pooler.dense.weight", R::PoolerWeight, {C, C}, I::Normal, last)), fam, 0,
                     {{S::Bert, {"bert.pooler.dense.weight"}}}));
      v.push_back(hf(row("pooler.dense.bias", R::PoolerBias, {C}, I::Zeros, last), fam, 0,
                     {{S::Bert, {"bert.pooler.dense.bias"}}}));
      v.push_back(hf(matmul(row("binary_head.weight", R::BinaryHeadWeight, {2, C}, I::Normal, last)), fam, 0,
                     {{S::Bert, {"cls.seq_relationship.weight"}}}));
      v.push_back(hf(row("binary_head.bias", R::BinaryHeadBias, {2}, I::Zeros, last), fam, 0,
                     {{S::Bert, {"cls.seq_relationship.bias"}}}));
    }
  }
  if (c.untie_embeddings)
    v.push_back(hf(vocab(matmul(split(row("head.weight", R::OutputWeight, {V, C}, I::Normal, ParamPlace::LastStage), 0))),
                   fam, 0, {{S::Llama, {"lm_head.weight"}}, {S::T5, {"lm_head.weight"}}}));
  return v;
}

std::vector<ParamSpec> param_table(const GPTConfig& c) {
  std::vector<ParamSpec> outer = outer_param_table(c), v;
  for (ParamSpec& s : outer)
    if (s.place != ParamPlace::LastStage) v.push_back(std::move(s));
  for (int64_t l = 0; l < c.num_layers; ++l)
    for (ParamSpec& s : block_param_table(c, l)) v.push_back(std::move(s));
  for (ParamSpec& s : outer)
    if (s.place == ParamPlace::LastStage) v.push_back(std::move(s));
  return v;
}

}  // namespace mpitron
