#include "model/layers/layer_spec.h"

#include <cmath>

#include "core/error.h"
#include "model/layers/attention_layer.h"
#include "model/layers/cross_attention_layer.h"
#include "model/layers/mla_layer.h"
#include "model/layers/mlp_layer.h"
#include "model/layers/moe_layer.h"
#include "model/param_rows.h"

namespace mpitron {

const char* to_string(NormPlace p) {
  switch (p) {
    case NormPlace::Pre: return "pre";
    case NormPlace::Sandwich: return "sandwich";
    case NormPlace::Output: return "output";
    case NormPlace::AfterResidual: return "post_ln";
  }
  return "?";
}

namespace {

void norm_rows(const LayerSpec& l, const Branch& b, const BranchNorm& n, std::vector<ParamSpec>& v) {
  const ParamPlace L = ParamPlace::Layer;
  const std::string p = str("layers.", l.layer, ".", n.name);
  v.push_back(param_row(p + ".weight", n.weight, {l.hidden}, b.spec.one_plus ? ParamInit::Zeros : ParamInit::Ones, L, l.layer));
  if (b.spec.kind == Normalization::LayerNorm)
    v.push_back(param_row(p + ".bias", n.bias, {l.hidden}, ParamInit::Zeros, L, l.layer));
}

// The self-attention of layer l: its mask (a sliding layer's window), its rope (Gemma 3's sliding
// layers: their own base, unscaled), its scale, soft-cap and QK-norm.
AttentionSpec self_attention_spec(const TransformerConfig& c, int64_t l) {
  AttentionSpec a;
  a.heads = c.num_attention_heads;
  a.groups = c.query_groups();
  a.head_dim = c.head_dim();
  a.mask = c.attention_mask(l);
  a.window = a.mask == AttentionMaskKind::SlidingWindow ? c.window_size : 0;
  a.rope = c.position_embedding == PositionEmbedding::Rope;
  a.rope_args.base = c.rotary_base;
  a.rope_args.percent = c.rotary_percent;
  a.rope_args.scaling = c.rope_scaling;
  if (a.window > 0 && c.rotary_base_local > 0) {
    a.rope_args.base = c.rotary_base_local;
    a.rope_args.scaling = RopeScaling{};
  }
  const float base = c.query_pre_attn_scalar > 0 ? c.query_pre_attn_scalar : static_cast<float>(a.head_dim);
  a.scale = 1.0f / std::sqrt(base);
  a.softcap = c.attn_logit_softcapping;
  a.qk_norm = c.qk_norm;
  a.qk_norm_spec = NormSpec{Normalization::RMSNorm, c.layernorm_epsilon, c.layernorm_1p};
  a.qkv_bias = c.qkv_bias();
  a.proj_bias = c.add_bias_linear;
  return a;
}

// Multi-latent attention of layer l: the scale is Dqk^−½, times YaRN's mscale² (its mscale_all_dim) with yarn
// scaling, as transformers' and Megatron's DeepSeek attention.
std::shared_ptr<const Sublayer> mla_sublayer(const TransformerConfig& c, int64_t l) {
  MlaSpec m;
  m.heads = c.num_attention_heads;
  m.q_lora_rank = c.q_lora_rank;
  m.kv_lora_rank = c.kv_lora_rank;
  m.qk_nope = c.qk_head_dim, m.qk_rope = c.qk_pos_emb_head_dim, m.v_dim = c.v_head_dim;
  m.rope_args.base = c.rotary_base;
  m.rope_args.scaling = c.rope_scaling;
  double scale = 1.0 / std::sqrt(static_cast<double>(m.qk_dim()));
  if (c.rope_scaling.type == RopeScalingType::Yarn && c.rope_scaling.mscale_all_dim != 0) {
    const double ms = rope_yarn_mscale(c.rope_scaling.factor, c.rope_scaling.mscale_all_dim);
    scale *= ms * ms;
  }
  m.scale = static_cast<float>(scale);
  m.latent_norm = NormSpec{Normalization::RMSNorm, c.layernorm_epsilon, c.layernorm_1p};
  return std::make_shared<MultiLatentAttention>(m, l, c.hidden_size);
}

std::shared_ptr<const Sublayer> mlp_sublayer(const TransformerConfig& c, int64_t l) {
  const MlpSpec mlp{c.mlp, c.ffn(), c.add_bias_linear};
  if (!c.is_moe_layer(l)) return std::make_shared<DenseMlp>(mlp, l, c.hidden_size);
  MoeShape m;
  m.experts = c.num_experts;
  m.topk = c.moe_router_topk;
  m.ffn = c.moe_ffn();
  m.shared_ffn = c.moe_shared_expert_intermediate_size;
  m.shared_gate = c.moe_shared_expert_gate;
  m.score = c.moe_router_score_function;
  m.pre_softmax = c.moe_router_pre_softmax;
  m.scaling = c.moe_router_topk_scaling_factor;
  m.num_groups = c.moe_router_num_groups, m.group_topk = c.moe_router_group_topk;
  m.group_score_topk = c.moe_router_group_score_topk;
  return std::make_shared<MoeMlp>(m, mlp, l, c.hidden_size);
}

Branch branch(std::shared_ptr<const Sublayer> op, NormPlace place, const NormSpec& spec, BranchNorm norm, BranchNorm out,
              int slot) {
  Branch b;
  b.op = std::move(op);
  b.place = place;
  b.spec = spec;
  b.norm = std::move(norm);
  b.out = std::move(out);
  b.dropout_slot = slot;
  return b;
}

}  // namespace

std::vector<ParamSpec> LayerSpec::rows() const {
  std::vector<ParamSpec> v;
  for (const Branch& b : branches) {
    if (!b.output_norm() || b.input_norm()) norm_rows(*this, b, b.norm, v);  // Output places only the output norm
    b.op->rows(v);
    if (b.output_norm()) norm_rows(*this, b, b.out, v);
  }
  return v;
}

const Sublayer* LayerSpec::find(const std::string& kind) const {
  for (const Branch& b : branches)
    if (kind == b.op->kind()) return b.op.get();
  return nullptr;
}

std::shared_ptr<const LayerSpec> layer_spec(const TransformerConfig& c, int64_t l) {
  auto spec = std::make_shared<LayerSpec>();
  spec->layer = l;
  spec->hidden = c.hidden_size;
  const NormSpec norm{c.normalization, c.layernorm_epsilon, c.layernorm_1p};
  const NormPlace place = c.post_ln                                        ? NormPlace::AfterResidual
                          : c.norm_placement == NormPlacement::Sandwich ? NormPlace::Sandwich
                          : c.norm_placement == NormPlacement::Output   ? NormPlace::Output
                                                                        : NormPlace::Pre;
  using R = ParamRole;
  const AttentionSpec attn = self_attention_spec(c, l);
  std::shared_ptr<const Sublayer> self = c.multi_latent_attention
                                             ? mla_sublayer(c, l)
                                             : std::shared_ptr<const Sublayer>(std::make_shared<SelfAttention>(attn, l, c.hidden_size));
  spec->branches.push_back(branch(self, place, norm,
                                  {R::Norm1Weight, R::Norm1Bias, "ln1"}, {R::Norm1PostWeight, R::Norm1PostBias, "ln1_post"}, 0));
  if (c.is_decoder_layer(l)) {  // T5: cross-attention over the encoder's output, between attention and MLP
    AttentionSpec x = attn;
    x.qkv_bias = c.add_bias_linear;
    spec->branches.push_back(branch(std::make_shared<CrossAttention>(x, l, c.hidden_size), NormPlace::Pre, norm,
                                    {R::Norm3Weight, R::Norm3Bias, "ln3"}, {}, 2));
  }
  spec->branches.push_back(branch(mlp_sublayer(c, l), place, norm, {R::Norm2Weight, R::Norm2Bias, "ln2"},
                                  {R::Norm2PostWeight, R::Norm2PostBias, "ln2_post"}, 1));
  return spec;
}

}  // namespace mpitron
