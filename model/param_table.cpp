#include "model/param_table.h"

#include <cmath>

#include "core/error.h"
#include "model/families.h"
#include "model/layers/layer_spec.h"
#include "model/param_rows.h"

namespace mpitron {

bool is_embedding_or_output(ParamRole r) {
  using R = ParamRole;
  for (const R e : {R::WordEmbedding, R::PositionEmbedding, R::TokentypeEmbedding, R::EncoderRelativeBias,
                    R::DecoderRelativeBias, R::OutputWeight, R::BinaryHeadWeight, R::ClassificationHeadWeight})
    if (r == e) return true;
  return false;
}

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
    case ParamRole::Norm1PostWeight: return "norm1_post.weight";
    case ParamRole::Norm1PostBias: return "norm1_post.bias";
    case ParamRole::Norm2PostWeight: return "norm2_post.weight";
    case ParamRole::Norm2PostBias: return "norm2_post.bias";
    case ParamRole::QNormWeight: return "q_norm.weight";
    case ParamRole::KNormWeight: return "k_norm.weight";
    case ParamRole::MlaQDownWeight: return "mla.q_down.weight";
    case ParamRole::MlaQDownNormWeight: return "mla.q_down_norm.weight";
    case ParamRole::MlaQUpWeight: return "mla.q_up.weight";
    case ParamRole::MlaQWeight: return "mla.q.weight";
    case ParamRole::MlaKvDownWeight: return "mla.kv_down.weight";
    case ParamRole::MlaKvDownNormWeight: return "mla.kv_down_norm.weight";
    case ParamRole::MlaKvUpWeight: return "mla.kv_up.weight";
    case ParamRole::MtpEmbedNormWeight: return "mtp.enorm.weight";
    case ParamRole::MtpHiddenNormWeight: return "mtp.hnorm.weight";
    case ParamRole::MtpProjWeight: return "mtp.eh_proj.weight";
    case ParamRole::MtpFinalNormWeight: return "mtp.final_norm.weight";
  }
  return "?";
}

namespace {

using mpitron::param_row;
ParamSpec row(std::string name, ParamRole role, Shape shape, ParamInit init, ParamPlace place, int64_t layer = -1) {
  return param_row(std::move(name), role, std::move(shape), init, place, layer);
}

// The family the configuration's Hugging Face names come from (none: a mix no family has).
const Family* names_family(const GPTConfig& c) { return config_family(c); }

void named(const GPTConfig& c, std::vector<ParamSpec>& rows) {
  if (const Family* f = names_family(c)) hf_name_rows(*f, c, rows);
}

}  // namespace

std::vector<ParamSpec> block_param_table(const GPTConfig& c, int64_t l) {
  std::vector<ParamSpec> v = layer_spec(c, l)->rows();
  named(c, v);
  return v;
}

std::vector<ParamSpec> outer_param_table(const GPTConfig& c) {
  const int64_t C = c.hidden_size, V = c.padded_vocab_size;
  using R = ParamRole;
  using I = ParamInit;
  std::vector<ParamSpec> v;
  ParamSpec wte = tp_split(row("wte", R::WordEmbedding, {V, C}, I::Normal,
                               c.embedding_on_last_stage() ? ParamPlace::FirstAndLast : ParamPlace::FirstStage),
                           0);
  wte.matmul = c.tied_output();  // the tied head's matmul
  v.push_back(vocab_row(wte));
  const ParamPlace first = ParamPlace::FirstStage, last = ParamPlace::LastStage;
  if (c.learned_positions())
    v.push_back(row("wpe", R::PositionEmbedding, {c.max_position_embeddings, C}, I::Normal, first));
  if (c.num_tokentypes > 0)
    v.push_back(row("tokentype_embeddings", R::TokentypeEmbedding, {c.num_tokentypes, C}, I::Normal, first));
  if (c.post_ln) {  // the original BERT: LayerNorm on the embeddings, none after the last block
    v.push_back(row("emb_ln.weight", R::EmbeddingNormWeight, {C}, I::Ones, first));
    v.push_back(row("emb_ln.bias", R::EmbeddingNormBias, {C}, I::Zeros, first));
  } else {
    if (c.t5) {  // the relative position tables (buckets, NH), split by heads, and the encoder's final norm
      if (c.relative_positions())
        for (const bool enc : {true, false})
          v.push_back(tp_split(row(enc ? "enc_rel_bias.weight" : "dec_rel_bias.weight",
                                   enc ? R::EncoderRelativeBias : R::DecoderRelativeBias,
                                   {c.relative_attention_num_buckets, c.num_attention_heads}, I::Normal, first), 1));
      v.push_back(row("enc_lnf.weight", R::EncoderFinalNormWeight, {C}, I::Ones, first));
      if (c.norm_has_bias()) v.push_back(row("enc_lnf.bias", R::EncoderFinalNormBias, {C}, I::Zeros, first));
    }
    v.push_back(row("lnf.weight", R::FinalNormWeight, {C}, c.layernorm_1p ? I::Zeros : I::Ones, last));
    if (c.norm_has_bias()) v.push_back(row("lnf.bias", R::FinalNormBias, {C}, I::Zeros, last));
  }
  if (c.bert && c.num_classes > 0) {  // Megatron's Classification: pooler tanh(dense([CLS])), then dropout and a K-way linear
    v.push_back(matmul_row(row("pooler.dense.weight", R::PoolerWeight, {C, C}, I::Normal, last)));
    v.push_back(row("pooler.dense.bias", R::PoolerBias, {C}, I::Zeros, last));
    v.push_back(matmul_row(row("classification_head.weight", R::ClassificationHeadWeight, {c.num_classes, C}, I::Normal, last)));
    v.push_back(row("classification_head.bias", R::ClassificationHeadBias, {c.num_classes}, I::Zeros, last));
  } else if (c.bert) {
    // MLM head: dense + gelu + LayerNorm (replicated, computed on every TP rank),
    // then the tied decoder wte (vocab-parallel) with its own bias (vocab-parallel).
    v.push_back(matmul_row(row("lm_head.dense.weight", R::LmHeadDenseWeight, {C, C}, I::Normal, last)));
    v.push_back(row("lm_head.dense.bias", R::LmHeadDenseBias, {C}, I::Zeros, last));
    v.push_back(row("lm_head.ln.weight", R::LmHeadNormWeight, {C}, I::Ones, last));
    v.push_back(row("lm_head.ln.bias", R::LmHeadNormBias, {C}, I::Zeros, last));
    v.push_back(vocab_row(tp_split(row("lm_head.bias", R::LmHeadBias, {V}, I::Zeros, last), 0)));
    if (c.binary_head) {  // pooler tanh(dense([CLS])) and the 2-way sentence-order classifier
      v.push_back(matmul_row(row("pooler.dense.weight", R::PoolerWeight, {C, C}, I::Normal, last)));
      v.push_back(row("pooler.dense.bias", R::PoolerBias, {C}, I::Zeros, last));
      v.push_back(matmul_row(row("binary_head.weight", R::BinaryHeadWeight, {2, C}, I::Normal, last)));
      v.push_back(row("binary_head.bias", R::BinaryHeadBias, {2}, I::Zeros, last));
    }
  }
  if (c.untie_embeddings)
    v.push_back(vocab_row(matmul_row(tp_split(row("head.weight", R::OutputWeight, {V, C}, I::Normal, last), 0))));
  named(c, v);
  if (c.bert && c.num_classes > 0)  // Megatron's classifier's head has no HF names (no HF class is written)
    for (ParamSpec& r : v)
      if (r.role == R::PoolerWeight || r.role == R::PoolerBias) r.hf.clear();
  return v;
}

std::string mtp_prefix(int64_t k) { return str("mtp.", k - 1, "."); }

std::vector<ParamSpec> mtp_param_table(const GPTConfig& c, int64_t k) {
  const int64_t C = c.hidden_size, l = c.num_layers + k - 1;
  using R = ParamRole;
  const std::string p = mtp_prefix(k);
  const ParamPlace last = ParamPlace::LastStage;
  std::vector<ParamSpec> v = {param_row(p + "enorm.weight", R::MtpEmbedNormWeight, {C}, ParamInit::Ones, last, l),
                              param_row(p + "hnorm.weight", R::MtpHiddenNormWeight, {C}, ParamInit::Ones, last, l),
                              matmul_row(param_row(p + "eh_proj.weight", R::MtpProjWeight, {C, 2 * C}, ParamInit::Normal, last, l))};
  for (ParamSpec& s : block_param_table(c, l)) v.push_back(std::move(s));
  v.push_back(param_row(p + "final_norm.weight", R::MtpFinalNormWeight, {C}, ParamInit::Ones, last, l));
  named(c, v);
  return v;
}

std::vector<ParamSpec> param_table(const GPTConfig& c) {
  std::vector<ParamSpec> outer = outer_param_table(c), v;
  for (ParamSpec& s : outer)
    if (s.place != ParamPlace::LastStage) v.push_back(std::move(s));
  for (int64_t l = 0; l < c.num_layers; ++l)
    for (ParamSpec& s : block_param_table(c, l)) v.push_back(std::move(s));
  for (int64_t k = 1; k <= c.mtp_num_layers; ++k)
    for (ParamSpec& s : mtp_param_table(c, k)) v.push_back(std::move(s));
  for (ParamSpec& s : outer)
    if (s.place == ParamPlace::LastStage) v.push_back(std::move(s));
  return v;
}

}  // namespace mpitron
