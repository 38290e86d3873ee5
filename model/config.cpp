#include "model/config.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "tensor/rope.h"

namespace mpitron {

const char* to_string(Normalization n) { return n == Normalization::RMSNorm ? "RMSNorm" : "LayerNorm"; }

const char* to_string(PositionEmbedding p) {
  switch (p) {
    case PositionEmbedding::Learned: return "learned_absolute";
    case PositionEmbedding::Rope: return "rope";
    case PositionEmbedding::None: return "none";
    case PositionEmbedding::Relative: return "relative";
  }
  return "?";
}

const char* to_string(MlpKind k) {
  switch (k) {
    case MlpKind::GeluTanh: return "gelu";
    case MlpKind::GeluErf: return "gelu_erf";
    case MlpKind::SwiGLU: return "swiglu";
    case MlpKind::GeGLU: return "geglu";
    case MlpKind::ReLU: return "relu";
  }
  return "?";
}

const char* to_string(AttentionMaskKind k) {
  switch (k) {
    case AttentionMaskKind::Causal: return "causal";
    case AttentionMaskKind::Padding: return "padding";
    case AttentionMaskKind::SlidingWindow: return "sliding_window";
  }
  return "?";
}

MlpKind parse_mlp_kind(const std::string& s) {
  for (MlpKind k : {MlpKind::GeluTanh, MlpKind::GeluErf, MlpKind::SwiGLU, MlpKind::GeGLU, MlpKind::ReLU})
    if (s == to_string(k)) return k;
  MPT_THROW(str("MLP kind ", s, " is not known"), "use gelu, gelu_erf, swiglu, geglu or relu");
}

const char* to_string(MoeScore s) { return s == MoeScore::Sigmoid ? "sigmoid" : "softmax"; }

MoeScore parse_moe_score(const std::string& s) {
  if (s == "softmax") return MoeScore::Softmax;
  if (s == "sigmoid") return MoeScore::Sigmoid;
  MPT_THROW(str("--moe-router-score-function ", s, " is not known"), "use softmax or sigmoid");
}

bool mlp_gated(MlpKind k) { return k == MlpKind::SwiGLU || k == MlpKind::GeGLU; }

Normalization parse_normalization(const std::string& s) {
  if (s == "LayerNorm") return Normalization::LayerNorm;
  if (s == "RMSNorm") return Normalization::RMSNorm;
  MPT_THROW(str("--normalization ", s, " is not known"), "use LayerNorm or RMSNorm");
}

PositionEmbedding parse_position_embedding(const std::string& s) {
  if (s == "learned_absolute") return PositionEmbedding::Learned;
  if (s == "rope") return PositionEmbedding::Rope;
  if (s == "none") return PositionEmbedding::None;
  if (s == "relative") return PositionEmbedding::Relative;
  MPT_THROW(str("--position-embedding-type ", s, " is not known"), "use learned_absolute, rope, none or relative (T5)");
}

void TransformerConfig::validate_t5() const {
  MPT_CHECK(!bert && causal && !post_ln && num_tokentypes == 0, "a T5 configuration is not also a BERT one", "");
  MPT_CHECK(encoder_num_layers >= 1 && encoder_num_layers < num_layers,
            str("T5 needs >= 1 encoder and >= 1 decoder layer: --encoder-num-layers ", encoder_num_layers,
                " of ", num_layers, " layers in all"),
            "give --encoder-num-layers and --decoder-num-layers (or --num-layers for both)");
  MPT_CHECK(decoder_seq_length >= 1, str("--decoder-seq-length must be >= 1, got ", decoder_seq_length), "");
  MPT_CHECK(!learned_positions() || decoder_seq_length <= max_position_embeddings,
            str("--decoder-seq-length (", decoder_seq_length, ") exceeds --max-position-embeddings (",
                max_position_embeddings, ")"),
            "raise --max-position-embeddings or lower --decoder-seq-length");
  MPT_CHECK(position_embedding == PositionEmbedding::Learned || relative_positions(),
            str("T5 takes --position-embedding-type learned_absolute or relative, got ", to_string(position_embedding)),
            "");
  MPT_CHECK(!relative_positions() || (relative_attention_num_buckets >= 2 && relative_attention_max_distance >= 2),
            str("--relative-attention-num-buckets (", relative_attention_num_buckets,
                ") and --relative-attention-max-distance (", relative_attention_max_distance, ") must be >= 2"),
            "T5 uses 32 and 128");
  MPT_CHECK(window_size == 0 && num_experts == 0 && !layernorm_1p && !scale_embeddings,
            "T5 with --window-size, --num-experts, --apply-layernorm-1p or --scale-embeddings is not supported",
            "drop them for pretrain_t5");
}

const char* to_string(NormPlacement p) {
  switch (p) {
    case NormPlacement::Pre: return "pre";
    case NormPlacement::Sandwich: return "sandwich";
    case NormPlacement::Output: return "output";
  }
  return "?";
}

const char* to_string(QkNorm q) {
  switch (q) {
    case QkNorm::None: return "none";
    case QkNorm::PerHead: return "per_head";
    case QkNorm::FullWidth: return "full_width";
  }
  return "?";
}

const char* to_string(RopeScalingType t) {
  switch (t) {
    case RopeScalingType::None: return "default";
    case RopeScalingType::Linear: return "linear";
    case RopeScalingType::Dynamic: return "dynamic";
    case RopeScalingType::Llama3: return "llama3";
    case RopeScalingType::Yarn: return "yarn";
  }
  return "?";
}

void TransformerConfig::validate() const {
  MPT_CHECK(num_layers >= 1, str("--num-layers must be >= 1, got ", num_layers), "");
  MPT_CHECK(hidden_size >= 1 && num_attention_heads >= 1,
            str("--hidden-size (", hidden_size, ") and --num-attention-heads (", num_attention_heads, ") must be >= 1"), "");
  MPT_CHECK(kv_channels > 0 || hidden_size % num_attention_heads == 0,
            str("--num-attention-heads (", num_attention_heads, ") must divide --hidden-size (", hidden_size, ")"),
            "pick a head count that divides the hidden size, e.g. hidden 768 with 12 heads, or give the head "
            "width with --kv-channels");
  MPT_CHECK(kv_channels >= 0, str("--kv-channels must be >= 1, got ", kv_channels), "");
  MPT_CHECK(num_query_groups >= 0 && num_attention_heads % query_groups() == 0,
            str("--num-query-groups (", num_query_groups, ") must divide --num-attention-heads (", num_attention_heads,
                ")"),
            "each query group serves --num-attention-heads / --num-query-groups heads, e.g. 32 heads with 8 groups");
  MPT_CHECK(seq_length >= 1, str("--seq-length must be >= 1, got ", seq_length), "");
  MPT_CHECK(seq_length <= max_position_embeddings,
            str("--seq-length (", seq_length, ") exceeds --max-position-embeddings (", max_position_embeddings, ")"),
            "raise --max-position-embeddings or lower --seq-length");
  MPT_CHECK(padded_vocab_size >= vocab_size,
            str("padded vocabulary (", padded_vocab_size, ") smaller than the vocabulary (", vocab_size, ")"), "");
  MPT_CHECK(hidden_dropout >= 0 && hidden_dropout < 1, str("--hidden-dropout must be in [0, 1), got ", hidden_dropout), "");
  MPT_CHECK(attention_dropout >= 0 && attention_dropout < 1,
            str("--attention-dropout must be in [0, 1), got ", attention_dropout), "");
  MPT_CHECK(!post_ln || normalization == Normalization::LayerNorm,
            "the post-LN block order (the original BERT's) takes --normalization LayerNorm", "");
  MPT_CHECK(num_tokentypes >= 0, str("token types must be >= 0, got ", num_tokentypes), "");
  MPT_CHECK(bert || (causal && !post_ln && num_tokentypes == 0),
            "bidirectional attention, the post-LN block order and token types are BERT's (model/bert.h)", "");
  MPT_CHECK(num_classes >= 0, str("classes must be >= 0, got ", num_classes), "");
  MPT_CHECK(num_classes == 0 || bert, "a classification head (num_classes > 0) sits on a BERT encoder (model/bert.h)", "");
  MPT_CHECK(!bert || (!layernorm_1p && !scale_embeddings),
            "--apply-layernorm-1p and --scale-embeddings are decoder (Gemma) choices; BERT's embedding and MLM-head "
            "LayerNorms do not take them",
            "drop them for BERT");
  MPT_CHECK(window_size >= 0, str("--window-size must be >= 0, got ", window_size), "");
  MPT_CHECK(window_size == 0 || causal,
            "--window-size: the sliding window is causal attention's (Mistral); BERT's attention is bidirectional", "");
  MPT_CHECK(!bert || !untie_embeddings,
            "--untie-embeddings-and-output-weights: BERT's MLM decoder is tied to the word embeddings", "");

  if (t5) validate_t5();
  else
    MPT_CHECK(!relative_positions(),
              "--position-embedding-type relative is T5's relative position bias (pretrain_t5); decoders take "
              "learned_absolute, rope or none", "");
  if (num_experts != 0) {
    validate_moe();
  } else {
    const TransformerConfig d;
    const char* stray = moe_router_topk != d.moe_router_topk                      ? "--moe-router-topk"
                        : moe_ffn_hidden_size != 0                               ? "--moe-ffn-hidden-size"
                        : moe_layer_freq != 1 || !moe_layer_pattern.empty()      ? "--moe-layer-freq"
                        : moe_router_score_function != d.moe_router_score_function ? "--moe-router-score-function"
                        : moe_router_pre_softmax                                 ? "--moe-router-pre-softmax"
                        : moe_router_topk_scaling_factor != 1.0f                 ? "--moe-router-topk-scaling-factor"
                        : moe_shared_expert_intermediate_size != 0               ? "--moe-shared-expert-intermediate-size"
                        : moe_shared_expert_gate                                 ? "--moe-shared-expert-gate"
                        : moe_router_num_groups != 0 || moe_router_group_topk != 0 ? "--moe-router-num-groups"
                        : moe_router_enable_expert_bias                          ? "--moe-router-enable-expert-bias"
                                                                                 : nullptr;
    MPT_CHECK(!stray, str(stray ? stray : "", " is given without --num-experts: the model has no experts"),
              "add --num-experts E for a Mixture of Experts, or drop the flag");
  }
  MPT_CHECK(init_method_std > 0, str("--init-method-std must be > 0, got ", init_method_std), "");
  MPT_CHECK(layernorm_epsilon > 0, str("--norm-epsilon must be > 0, got ", layernorm_epsilon), "");
  validate_attention();
  if (multi_latent_attention) validate_mla();
  validate_mtp();
  if (position_embedding == PositionEmbedding::Rope) {
    MPT_CHECK(rotary_base > 0, str("--rotary-base must be > 0, got ", rotary_base), "Llama 2 uses 10000, Llama 3 500000");
    MPT_CHECK(rotary_percent > 0 && rotary_percent <= 1,
              str("--rotary-percent must be in (0, 1], got ", rotary_percent), "");
    rope_rotary_dim(head_dim(), rotary_percent);  // throws when the rotated dims are odd or zero
  }
}

void TransformerConfig::validate_mla() const {
  MPT_CHECK(position_embedding == PositionEmbedding::Rope && normalization == Normalization::RMSNorm,
            "--multi-latent-attention takes rotary positions and RMSNorm (DeepSeek's)",
            "add --position-embedding-type rope --normalization RMSNorm");
  MPT_CHECK(qk_pos_emb_head_dim % 2 == 0, str("--qk-pos-emb-head-dim ", qk_pos_emb_head_dim, " must be even (rope's pairs)"), "");
  for (const auto& [flag, rank] : {std::pair<const char*, int64_t>{"--q-lora-rank", q_lora_rank}, {"--kv-lora-rank", kv_lora_rank}})
    MPT_CHECK(rank <= hidden_size,
              str(flag, " ", rank, " is wider than --hidden-size ", hidden_size, ": the latent would compress nothing"),
              "use a rank below the hidden size (DeepSeek-V3: 1536 and 512 of 7168)");
  MPT_CHECK(num_query_groups == 0 && kv_channels == 0,
            "--multi-latent-attention with --num-query-groups or --kv-channels: MLA's heads are sized by --qk-head-dim, "
            "--qk-pos-emb-head-dim and --v-head-dim, one key and value per head",
            "drop --group-query-attention / --kv-channels");
  const char* stray = qk_norm != QkNorm::None            ? "--qk-layernorm"
                      : attn_logit_softcapping != 0      ? "--attn-logit-softcapping"
                      : window_size != 0                 ? "--window-size"
                      : query_pre_attn_scalar != 0       ? "--query-pre-attn-scalar"
                      : rotary_percent != 1.0            ? "--rotary-percent"
                      : t5 || bert                       ? "an encoder model"
                                                         : nullptr;
  MPT_CHECK(!stray, str("--multi-latent-attention with ", stray ? stray : "", " is not built"),
            "multi-latent attention has its own latent norms and rope dims: drop the flag");
}

void TransformerConfig::validate_mtp() const {
  MPT_CHECK(mtp_num_layers >= 0, str("--mtp-num-layers must be >= 0, got ", mtp_num_layers), "");
  MPT_CHECK(std::isfinite(mtp_loss_scaling_factor) && mtp_loss_scaling_factor >= 0,
            str("--mtp-loss-scaling-factor must be a finite number >= 0, got ", mtp_loss_scaling_factor),
            "Megatron's default is 0.1");
  if (mtp_num_layers == 0) return;
  MPT_CHECK(!bert && !t5 && causal, "--mtp-num-layers predicts further tokens of a decoder: not with BERT or T5",
            "drop --mtp-num-layers");
  MPT_CHECK(!learned_positions(),
            "--mtp-num-layers with learned absolute positions: the MTP layers on the last stage read no position table",
            "train MTP with --position-embedding-type rope (or none)");
  MPT_CHECK(normalization == Normalization::RMSNorm && !layernorm_1p,
            "--mtp-num-layers is built with RMSNorm MTP norms (DeepSeek-V3's)", "add --normalization RMSNorm");
}

void TransformerConfig::validate_attention() const {
  MPT_CHECK(window_attn_skip_freq >= 0, str("--window-attn-skip-freq must be >= 0, got ", window_attn_skip_freq), "");
  MPT_CHECK(window_layer_pattern.empty() || static_cast<int64_t>(window_layer_pattern.size()) == num_layers,
            str("--window-attn-skip-freq's pattern has ", window_layer_pattern.size(), " entries for ", num_layers, " layers"),
            "give one 0 (global) or 1 (sliding) per layer, or an integer N");
  MPT_CHECK(window_size > 0 || (window_attn_skip_freq == 0 && window_layer_pattern.empty() && rotary_base_local == 0),
            "--window-attn-skip-freq and --local-rotary-base choose among sliding-window layers, but there is no --window-size",
            "add --window-size W, or drop them");
  MPT_CHECK(rotary_base_local >= 0 && std::isfinite(rotary_base_local),
            str("--local-rotary-base must be > 0, got ", rotary_base_local), "Gemma 3 uses 10000");
  for (const auto& [flag, v] : {std::pair<const char*, float>{"--attn-logit-softcapping", attn_logit_softcapping},
                                {"--final-logit-softcapping", final_logit_softcapping},
                                {"--query-pre-attn-scalar", query_pre_attn_scalar}})
    MPT_CHECK(std::isfinite(v) && v >= 0, str(flag, " must be a finite number >= 0 (0: none), got ", v), "");
  MPT_CHECK(norm_placement == NormPlacement::Pre || !post_ln,
            str("--norm-placement ", to_string(norm_placement), " with the post-LN block order (--bert-post-ln)"),
            "the post-LN BERT has its norms after the residual adds: drop one of the two");
  MPT_CHECK(qk_norm == QkNorm::None || normalization == Normalization::RMSNorm,
            "--qk-layernorm with --normalization LayerNorm: QK-norm is built as RMSNorm (Qwen3, Gemma 3, OLMo-2)",
            "add --normalization RMSNorm, or drop --qk-layernorm");
  MPT_CHECK(rope_scaling.type == RopeScalingType::None || position_embedding == PositionEmbedding::Rope,
            str("rope scaling (", to_string(rope_scaling.type), ") without rotary positions"),
            "add --position-embedding-type rope, or drop the rope scaling flags");
}

void TransformerConfig::validate_moe() const {
  const int64_t E = num_experts;
  MPT_CHECK(!moe_router_enable_expert_bias || moe_router_score_function == MoeScore::Sigmoid,
            "--moe-router-enable-expert-bias needs --moe-router-score-function sigmoid (as Megatron-Core: the bias "
            "shifts the sigmoid scores that select the experts)",
            "add --moe-router-score-function sigmoid, or drop --moe-router-enable-expert-bias");
  MPT_CHECK((moe_router_num_groups == 0) == (moe_router_group_topk == 0),
            str("--moe-router-num-groups ", moe_router_num_groups, " and --moe-router-group-topk ", moe_router_group_topk,
                ": group-limited routing takes both"),
            "give both (DeepSeek-V3: 8 groups, the 4 best), or neither");
  if (moe_router_num_groups > 0) {
    MPT_CHECK(E % moe_router_num_groups == 0,
              str("--moe-router-num-groups ", moe_router_num_groups, " does not divide --num-experts ", E), "");
    MPT_CHECK(moe_router_group_topk <= moe_router_num_groups,
              str("--moe-router-group-topk ", moe_router_group_topk, " exceeds --moe-router-num-groups ", moe_router_num_groups), "");
    MPT_CHECK(moe_router_group_score_topk >= 0 && moe_router_group_score_topk <= E / moe_router_num_groups,
              str("the group score's top ", moe_router_group_score_topk, " exceeds a group's ", E / moe_router_num_groups,
                  " experts"), "use fewer groups");
    MPT_CHECK(moe_router_group_score_topk > 0 || moe_router_topk >= moe_router_group_topk,
              str("--moe-router-topk ", moe_router_topk, " < --moe-router-group-topk ", moe_router_group_topk,
                  ": Megatron scores a group by its best topk / group-topk experts, none here"),
              "raise --moe-router-topk or lower --moe-router-group-topk");
    MPT_CHECK(moe_router_topk <= moe_router_group_topk * (E / moe_router_num_groups),
              str("--moe-router-topk ", moe_router_topk, " is more than the ", moe_router_group_topk, " best groups hold (",
                  moe_router_group_topk * (E / moe_router_num_groups), " experts)"),
              "raise --moe-router-group-topk or lower --moe-router-topk");
  }
  MPT_CHECK(E >= 1, str("--num-experts must be >= 1 (or not given for dense MLPs), got ", E), "");
  MPT_CHECK(moe_router_topk >= 1 && moe_router_topk <= E,
            str("--moe-router-topk ", moe_router_topk, " must be in [1, --num-experts ", E, "]"),
            "each token goes to k distinct experts: give k <= the experts");
  MPT_CHECK(moe_ffn_hidden_size >= 0, str("--moe-ffn-hidden-size must be >= 1, got ", moe_ffn_hidden_size), "");
  MPT_CHECK(moe_layer_freq >= 1, str("--moe-layer-freq must be >= 1, got ", moe_layer_freq), "");
  MPT_CHECK(moe_layer_pattern.empty() || static_cast<int64_t>(moe_layer_pattern.size()) == num_layers,
            str("--moe-layer-freq gives a pattern of ", moe_layer_pattern.size(), " layers for --num-layers ", num_layers),
            "give one 0 or 1 per layer, e.g. [1,0,1,0] for 4 layers");
  MPT_CHECK(!moe_router_pre_softmax || moe_router_score_function == MoeScore::Softmax,
            "--moe-router-pre-softmax with --moe-router-score-function sigmoid: pre-softmax is the softmax router's",
            "drop one of them");
  MPT_CHECK(moe_router_topk_scaling_factor > 0,
            str("--moe-router-topk-scaling-factor must be > 0, got ", moe_router_topk_scaling_factor), "");
  MPT_CHECK(moe_shared_expert_intermediate_size >= 0,
            str("--moe-shared-expert-intermediate-size must be >= 0, got ", moe_shared_expert_intermediate_size), "");
  MPT_CHECK(!moe_shared_expert_gate || moe_shared_expert_intermediate_size > 0,
            "--moe-shared-expert-gate without --moe-shared-expert-intermediate-size: there is no shared expert to gate",
            "give the shared experts' width");
  MPT_CHECK(moe_shared_expert_intermediate_size == 0 || !add_bias_linear,
            "--moe-shared-expert-intermediate-size with linear biases: the shared experts are built without biases",
            "add --disable-bias-linear (Qwen2-MoE and DeepSeek have none)");
  MPT_CHECK(!bert, "--num-experts: BERT's MLPs are dense (Mixture of Experts is built for the decoders)",
            "drop --num-experts for pretrain_bert");
}

int64_t TransformerConfig::sliding_layers() const {
  if (window_size <= 0) return 0;
  if (!window_layer_pattern.empty()) {
    int64_t n = 0;
    for (int64_t l = 0; l < std::min<int64_t>(num_layers, static_cast<int64_t>(window_layer_pattern.size())); ++l)
      n += window_layer_pattern[static_cast<size_t>(l)];
    return n;
  }
  return window_attn_skip_freq <= 0 ? num_layers : num_layers - num_layers / window_attn_skip_freq;
}

double TransformerConfig::attended_keys() const {
  const double T = static_cast<double>(seq_length);
  if (!causal) return T;
  if (window_size <= 0) return T / 2;
  // Query i sees min(i, W) + 1 keys: Σ_i = (m + 1)(m + 2)/2 + (T − 1 − m)(W + 1), m = min(W, T − 1);
  // the mean less one half (T/2 again when W >= T − 1). Global layers (--window-attn-skip-freq): T/2.
  const double W = static_cast<double>(window_size), m = std::min(W, T - 1);
  const double windowed = ((m + 1) * (m + 2) / 2 + (T - 1 - m) * (W + 1)) / T - 0.5;
  const double s = static_cast<double>(sliding_layers()) / static_cast<double>(num_layers);
  return s * windowed + (1 - s) * T / 2;
}

}  // namespace mpitron
