#include "model/param_table.h"

#include "core/error.h"

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

}  // namespace

std::vector<ParamSpec> block_param_table(const GPTConfig& c, int64_t l) {
  const int64_t C = c.hidden_size, F = c.ffn(), HD = c.head_dim();
  const int64_t q = c.num_attention_heads * HD, kv = c.query_groups() * HD;
  const std::vector<int64_t> qkv_parts{q, kv, kv};
  const std::vector<int64_t> fc_parts = c.swiglu ? std::vector<int64_t>{F, F} : std::vector<int64_t>{};
  const std::string p = str("layers.", l, ".");
  const bool ln_bias = c.norm_has_bias(), bias = c.add_bias_linear;
  using R = ParamRole;
  using I = ParamInit;
  const ParamPlace L = ParamPlace::Layer;
  std::vector<ParamSpec> v;
  v.push_back(row(p + "ln1.weight", R::Norm1Weight, {C}, I::Ones, L, l));
  if (ln_bias) v.push_back(row(p + "ln1.bias", R::Norm1Bias, {C}, I::Zeros, L, l));
  v.push_back(matmul(split(row(p + "attn.qkv.weight", R::QkvWeight, {q + 2 * kv, C}, I::Normal, L, l), 0, qkv_parts)));
  if (bias) v.push_back(split(row(p + "attn.qkv.bias", R::QkvBias, {q + 2 * kv}, I::Zeros, L, l), 0, qkv_parts));
  v.push_back(matmul(split(row(p + "attn.proj.weight", R::ProjWeight, {C, q}, I::OutputNormal, L, l), 1)));
  if (bias) v.push_back(row(p + "attn.proj.bias", R::ProjBias, {C}, I::Zeros, L, l));
  v.push_back(row(p + "ln2.weight", R::Norm2Weight, {C}, I::Ones, L, l));
  if (ln_bias) v.push_back(row(p + "ln2.bias", R::Norm2Bias, {C}, I::Zeros, L, l));
  v.push_back(matmul(split(row(p + "mlp.fc.weight", R::FcWeight, {c.fc_rows(), C}, I::Normal, L, l), 0, fc_parts)));
  if (bias) v.push_back(split(row(p + "mlp.fc.bias", R::FcBias, {c.fc_rows()}, I::Zeros, L, l), 0, fc_parts));
  v.push_back(matmul(split(row(p + "mlp.proj.weight", R::MlpProjWeight, {C, F}, I::OutputNormal, L, l), 1)));
  if (bias) v.push_back(row(p + "mlp.proj.bias", R::MlpProjBias, {C}, I::Zeros, L, l));
  return v;
}

std::vector<ParamSpec> outer_param_table(const GPTConfig& c) {
  const int64_t C = c.hidden_size, V = c.padded_vocab_size;
  using R = ParamRole;
  using I = ParamInit;
  std::vector<ParamSpec> v;
  const bool classifier = c.bert && c.num_classes > 0;  // no LM head: wte is only the embedding
  ParamSpec wte = split(row("wte", R::WordEmbedding, {V, C}, I::Normal,
                            c.untie_embeddings || classifier ? ParamPlace::FirstStage : ParamPlace::FirstAndLast),
                        0);
  wte.matmul = !c.untie_embeddings && !classifier;  // the tied head's matmul
  v.push_back(wte);
  const ParamPlace first = ParamPlace::FirstStage, last = ParamPlace::LastStage;
  if (c.learned_positions())
    v.push_back(row("wpe", R::PositionEmbedding, {c.max_position_embeddings, C}, I::Normal, first));
  if (c.num_tokentypes > 0)
    v.push_back(row("tokentype_embeddings", R::TokentypeEmbedding, {c.num_tokentypes, C}, I::Normal, first));
  if (c.post_ln) {  // the original BERT: LayerNorm on the embeddings, none after the last block
    v.push_back(row("emb_ln.weight", R::EmbeddingNormWeight, {C}, I::Ones, first));
    v.push_back(row("emb_ln.bias", R::EmbeddingNormBias, {C}, I::Zeros, first));
  } else {
    v.push_back(row("lnf.weight", R::FinalNormWeight, {C}, I::Ones, last));
    if (c.norm_has_bias()) v.push_back(row("lnf.bias", R::FinalNormBias, {C}, I::Zeros, last));
  }
  if (classifier) {  // Megatron's Classification: pooler tanh(dense([CLS])), then dropout and a K-way linear
    v.push_back(matmul(row("pooler.dense.weight", R::PoolerWeight, {C, C}, I::Normal, last)));
    v.push_back(row("pooler.dense.bias", R::PoolerBias, {C}, I::Zeros, last));
    v.push_back(matmul(row("classification_head.weight", R::ClassificationHeadWeight, {c.num_classes, C}, I::Normal, last)));
    v.push_back(row("classification_head.bias", R::ClassificationHeadBias, {c.num_classes}, I::Zeros, last));
  } else if (c.bert) {
    // MLM head: dense + gelu + LayerNorm (replicated, computed on every TP rank),
    // then the tied decoder wte (vocab-parallel) with its own bias (vocab-parallel).
    v.push_back(matmul(row("lm_head.dense.weight", R::LmHeadDenseWeight, {C, C}, I::Normal, last)));
    v.push_back(row("lm_head.dense.bias", R::LmHeadDenseBias, {C}, I::Zeros, last));
    v.push_back(row("lm_head.ln.weight", R::LmHeadNormWeight, {C}, I::Ones, last));
    v.push_back(row("lm_head.ln.bias", R::LmHeadNormBias, {C}, I::Zeros, last));
    v.push_back(split(row("lm_head.bias", R::LmHeadBias, {V}, I::Zeros, last), 0));
    if (c.binary_head) {  // pooler tanh(dense([CLS])) and the 2-way sentence-order classifier
      v.push_back(matmul(row("pooler.dense.weight", R::PoolerWeight, {C, C}, I::Normal, last)));
      v.push_back(row("pooler.dense.bias", R::PoolerBias, {C}, I::Zeros, last));
      v.push_back(matmul(row("binary_head.weight", R::BinaryHeadWeight, {2, C}, I::Normal, last)));
      v.push_back(row("binary_head.bias", R::BinaryHeadBias, {2}, I::Zeros, last));
    }
  }
  if (c.untie_embeddings)
    v.push_back(matmul(split(row("head.weight", R::OutputWeight, {V, C}, I::Normal, ParamPlace::LastStage), 0)));
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
