// model/config.h — what a transformer is made of. Every field: meaning and default.
//
// The defaults are GPT-2 (pre-LN LayerNorm, tanh-GELU MLP, learned positions, tied LM
// head, multi-head attention, biases on every linear). Every other family is the same
// skeleton with other values of these fields. Each architecture field is declared ONCE,
// with its flags (Megatron's names), its checkpoint key, its bounds and what it means
// for a checkpoint, in the table of model/arch_fields.h; the families (GPT-2, Llama,
// Qwen2, Mistral, Gemma, BERT) and their Hugging Face names are rows of
// model/families.h and model/param_table.h. docs/model-families.md.
#pragma once
#include <cstdint>
#include <string>

#include <vector>

#include "tensor/dtype.h"
#include "tensor/moe_router.h"
#include "tensor/rope.h"

namespace mpitron {

enum class Normalization : uint8_t { LayerNorm, RMSNorm };
// Relative: T5's bucketed relative position bias, one (buckets, NH) table per stack added to the
// attention scores of its self-attention (model/t5.h); no position embedding.
enum class PositionEmbedding : uint8_t { Learned, Rope, None, Relative };
// The MLP sublayer's activation. The gated kinds' fc is (2F, C) = [gate | up] and
// g = act(gate) · up; the others' fc is (F, C) and g = act(fc).
enum class MlpKind : uint8_t {
  GeluTanh,  // GELU, tanh approximation (GPT-2; Megatron's fused bias_gelu; the default)
  GeluErf,   // GELU, exact x·Φ(x) with erf (HF BERT's "gelu"; --exact-gelu)
  SwiGLU,    // silu(gate) · up (Llama; --swiglu)
  GeGLU,     // gelu(gate) · up, the tanh GELU (Gemma, T5 v1.1's gated-gelu; --geglu)
  ReLU,      // max(x, 0) (the original T5's DenseReluDense; --relu)
};
// Which keys a query sees (tensor/attention.h's AttentionMask).
enum class AttentionMaskKind : uint8_t {
  Causal,         // key j <= query i (decoders)
  Padding,        // every key of the sample, padding keys masked (BERT)
  SlidingWindow,  // i − W <= j <= i: causal within a window of W earlier keys (Mistral; --window-size)
};

// Where a block's norms sit around its sublayers (model/layers/layer_spec.h). The original BERT's
// post-LN order (a norm after each residual add) is TransformerConfig::post_ln.
enum class NormPlacement : uint8_t {
  Pre,       // norm(x) into each sublayer (GPT-2, Llama, …; the default)
  Sandwich,  // norm(x) in and a second norm on the sublayer's output, before the residual add (Gemma 2/3)
  Output,    // only the norm on the sublayer's output (OLMo-2)
};
// Normalisation of the queries and keys after their projection, before rope (QK-norm).
enum class QkNorm : uint8_t {
  None,
  PerHead,    // each head's HD values, one (HD) weight shared by the heads (Qwen3, Gemma 3; --qk-layernorm)
  FullWidth,  // each token's NH·HD query and G·HD key values, one weight over the width (OLMo-2), split
              //   over the tensor-parallel ranks with the heads (the sums of squares all-reduced)
};

// Megatron's spellings: "LayerNorm"/"RMSNorm", "learned_absolute"/"rope"/"none"/"relative";
// MLP kinds "gelu", "gelu_erf", "swiglu", "geglu", "relu"; masks "causal", "padding", "sliding_window".
const char* to_string(Normalization n);
const char* to_string(PositionEmbedding p);
const char* to_string(MlpKind k);
const char* to_string(AttentionMaskKind k);
const char* to_string(NormPlacement p);  // "pre", "sandwich", "output"
const char* to_string(QkNorm q);         // "none", "per_head", "full_width"
const char* to_string(RopeScalingType t);  // transformers' rope_type: "default", "linear", "dynamic", "llama3", "yarn"
Normalization parse_normalization(const std::string& s);           // throws naming --normalization
PositionEmbedding parse_position_embedding(const std::string& s);  // throws naming --position-embedding-type
MlpKind parse_mlp_kind(const std::string& s);                      // throws naming the kinds
const char* to_string(MoeScore s);                                 // "softmax", "sigmoid"
MoeScore parse_moe_score(const std::string& s);                    // throws naming --moe-router-score-function
bool mlp_gated(MlpKind k);                                         // SwiGLU, GeGLU

// The architecture of an encoder or decoder transformer (Megatron-Core's TransformerConfig).
struct TransformerConfig {
  int64_t num_layers = 12;               // --num-layers: transformer blocks
  int64_t hidden_size = 768;             // --hidden-size: C, the residual stream width
  int64_t num_attention_heads = 12;      // --num-attention-heads: NH
  int64_t kv_channels = 0;               // --kv-channels: HD, each head's width; 0 means C / NH (C must then
                                         //   divide by NH). Gemma 7B: 256 with C = 3072, NH = 16
  int64_t num_query_groups = 0;          // --num-query-groups: G key/value heads; 0 means NH (no grouping)
  int64_t ffn_hidden_size = 0;           // --ffn-hidden-size: F; 0 means 4·C
  int64_t seq_length = 1024;             // --seq-length: T, tokens per sample
  int64_t max_position_embeddings = 1024;// --max-position-embeddings: rows of wpe (learned); the longest T
  int64_t vocab_size = 50257;            // tokenizer vocabulary (GPT-2: 50257)
  int64_t padded_vocab_size = 50304;     // V: vocab rounded up (make-vocab-size-divisible-by × TP)
  float hidden_dropout = 0.1f;           // --hidden-dropout: after embeddings, attn proj and MLP
  float attention_dropout = 0.1f;        // --attention-dropout: on the attention probabilities (Megatron's 0.1)
  float init_method_std = 0.02f;         // --init-method-std: N(0, std) for weights; output
                                         //   projections use std / sqrt(2·num_layers)
  float layernorm_epsilon = 1e-5f;       // --layernorm-epsilon / --norm-epsilon (either norm)
  bool layernorm_1p = false;             // --apply-layernorm-1p: every norm scales by (1 + w), w initialised
                                         //   to 0 (Megatron's; Gemma's RMSNorm)
  bool scale_embeddings = false;         // --scale-embeddings: the word embeddings times sqrt(C) (Gemma); the
                                         //   tied output layer uses wte unscaled
  Normalization normalization = Normalization::LayerNorm;          // --normalization
  MlpKind mlp = MlpKind::GeluTanh;       // --swiglu, --exact-gelu, --openai-gelu
  PositionEmbedding position_embedding = PositionEmbedding::Learned;  // --position-embedding-type
  double rotary_base = 10000.0;          // --rotary-base (rope's θ base)
  double rotary_percent = 1.0;           // --rotary-percent: fraction of each head's dims rotated
  bool untie_embeddings = false;         // --untie-embeddings-and-output-weights: own head (V, C)
  bool add_bias_linear = true;           // false with --disable-bias-linear
  bool add_qkv_bias = false;             // --add-qkv-bias: a qkv bias even with --disable-bias-linear (Qwen2)
  int64_t window_size = 0;               // --window-size W (Megatron's "W,0"): sliding-window attention, query i
                                         //   sees keys i − W … i (W + 1 keys; HF Mistral's sliding_window);
                                         //   0: every earlier key
  // --window-attn-skip-freq (Megatron-Core's window_attn_skip_freq): which layers slide when window_size > 0.
  // An integer N: every N-th layer (l + 1 divisible by N) attends globally, the others slide (Gemma 2: 2,
  // Gemma 3: 6); a pattern ("[1,1,0]", one entry per layer): the layers marked 1 slide. 0 and no pattern:
  // every layer slides.
  int64_t window_attn_skip_freq = 0;
  std::vector<uint8_t> window_layer_pattern;
  double rotary_base_local = 0;          // --local-rotary-base: the sliding layers' rope base (Gemma 3's
                                         //   rope_local_base_freq), without scaling; 0: the global rope
  RopeScaling rope_scaling{};            // rope's frequency scaling (tensor/rope.h; --use-rope-scaling = Llama 3.1's
                                         //   llama3, --rope-scaling-type, …); type None: none
  QkNorm qk_norm = QkNorm::None;         // --qk-layernorm (per head), --qk-layernorm-full-width (OLMo-2)
  NormPlacement norm_placement = NormPlacement::Pre;  // --norm-placement pre|sandwich|output
  float attn_logit_softcapping = 0.0f;   // --attn-logit-softcapping: scores ← cap·tanh(scores/cap) (Gemma 2); 0: none
  float final_logit_softcapping = 0.0f;  // --final-logit-softcapping: logits ← cap·tanh(logits/cap) (Gemma 2); 0: none
  float query_pre_attn_scalar = 0.0f;    // --query-pre-attn-scalar: scores scaled by its −½ power (Gemma 2/3);
                                         //   0: by HD^−½
  // Multi-latent attention (model/layers/mla_layer.h; DeepSeek-V2/V3, Megatron's --multi-latent-attention):
  // every layer's self-attention reads its keys and values from a per-token latent.
  bool multi_latent_attention = false;   // --multi-latent-attention
  int64_t q_lora_rank = 0;               // --q-lora-rank qr: the query's latent width; 0: a plain query projection
  int64_t kv_lora_rank = 512;            // --kv-lora-rank kr: the key/value latent's width
  int64_t qk_head_dim = 128;             // --qk-head-dim dn: each head's query/key dims without rope
  int64_t qk_pos_emb_head_dim = 64;      // --qk-pos-emb-head-dim dr: the rope dims (one shared key per token)
  int64_t v_head_dim = 128;              // --v-head-dim dv: each head's value (and output) width
  // Mixture of Experts (model/layers/moe_layer.h; docs/model-families.md "Mixture of Experts"): the MLP
  // of an MoE layer is a router over num_experts expert MLPs of the MLP kind above, each token sent to
  // moe_router_topk of them, plus optional shared experts that see every token.
  int64_t num_experts = 0;               // --num-experts E; 0: every MLP dense
  int64_t moe_router_topk = 2;           // --moe-router-topk k: experts per token
  int64_t moe_ffn_hidden_size = 0;       // --moe-ffn-hidden-size: each expert's width Fe; 0 means F
  // --moe-layer-freq: which layers are MoE. An integer N: layers l with l % N == 0; a pattern
  // ("[1,1,0,0]", one entry per layer): the layers marked 1. Empty pattern and N = 1: every layer.
  int64_t moe_layer_freq = 1;
  std::vector<uint8_t> moe_layer_pattern;
  MoeScore moe_router_score_function = MoeScore::Softmax;  // --moe-router-score-function softmax|sigmoid
  bool moe_router_pre_softmax = false;   // --moe-router-pre-softmax: top-k of the softmax over all experts,
                                         //   unnormalised (Qwen2-MoE); default softmax over the k chosen (Mixtral)
  float moe_router_topk_scaling_factor = 1.0f;  // --moe-router-topk-scaling-factor: the k probabilities times it
  bool moe_router_enable_expert_bias = false;  // --moe-router-enable-expert-bias: a per-expert bias on the sigmoid
                                         //   selection scores (DeepSeek-V3's e_score_correction_bias), kept with the
                                         //   model; --moe-router-bias-update-rate moves it while training
  int64_t moe_router_num_groups = 0;     // --moe-router-num-groups G: experts in G equal groups (DeepSeek-V3's n_group)
  int64_t moe_router_group_topk = 0;     // --moe-router-group-topk g: top-k among the g best groups (topk_group); 0: off
  int64_t moe_router_group_score_topk = 0;  // a group's score: the sum of its best this-many selection scores;
                                         //   0: Megatron's topk / g (transformers' DeepSeek-V3 hard-codes 2)
  int64_t moe_shared_expert_intermediate_size = 0;  // --moe-shared-expert-intermediate-size: shared experts' total
                                                    //   width Fs (0: none), a dense MLP beside the routed ones
  bool moe_shared_expert_gate = false;   // --moe-shared-expert-gate: the shared output times sigmoid(x·wgᵀ), wg (1, C)
                                         //   (Qwen2-MoE's shared_expert_gate)
  DType compute_dtype = DType::F32;      // f32, or bf16/f16 with --bf16/--fp16
  // The model family (model/families.h) by name: set by a Hugging Face import (config.json's model_type) and
  // recorded in the checkpoint ("family"), so a model keeps its identity (its HF class and tensor names)
  // even where another family has the same maths (Phi-3 and Mistral). "": derived from the fields.
  std::string family_name;
  // BERT (model/bert.h; docs/model-families.md "BERT"; set by pretrain_bert and its flags):
  bool bert = false;                     // encoder with the MLM head (+ pooler and binary head)
  bool causal = true;                    // false: bidirectional attention (BERT)
  bool post_ln = false;                  // post-LN: x2 = LN1(x + attn(x)), y = LN2(x2 + mlp(x2)), an
                                         //   embedding LayerNorm and no final norm (the original BERT)
  int64_t num_tokentypes = 0;            // token-type embedding rows (BERT with the binary head: 2)
  bool binary_head = true;               // BERT: pooler + sentence-order head (Megatron's --bert-no-binary-head: false)
  int64_t num_classes = 0;               // BERT: > 0 makes it Megatron's Classification model (finetune --task):
                                         //   pooler + dropout + classification_head (num_classes, C) instead of
                                         //   the MLM and binary heads (model/training/finetune.h)
  // T5 (model/t5.h; docs/model-families.md "T5"; set by pretrain_t5 and its flags): an encoder-decoder.
  // Layers 0 … Le−1 are the encoder (bidirectional, padding mask), layers Le … num_layers−1 the decoder
  // (causal self-attention, then cross-attention over the encoder's output, then the MLP);
  // num_layers = Le + Ld. seq_length is the encoder's length.
  bool t5 = false;
  int64_t encoder_num_layers = 0;        // --encoder-num-layers: Le
  int64_t decoder_seq_length = 0;        // --decoder-seq-length: Td, the decoder's tokens per sample
  int64_t relative_attention_num_buckets = 32;   // --relative-attention-num-buckets (relative positions)
  int64_t relative_attention_max_distance = 128; // --relative-attention-max-distance (relative positions)

  // Multi-token prediction (model/gpt_mtp.cpp; Megatron's --mtp-num-layers, DeepSeek-V3's MTP modules):
  // D more blocks, layers L … L + D − 1, on the last pipeline stage, each predicting one token further.
  int64_t mtp_num_layers = 0;            // --mtp-num-layers D (0: none)
  float mtp_loss_scaling_factor = 0.1f;  // --mtp-loss-scaling-factor λ: loss = lm + λ/D · Σ mtp_k
  // The layer whose kind (MoE or dense, window, rope base) layer l has: an MTP layer (l >= num_layers)
  // is a block of the last decoder layer's kind, as Megatron-Core builds it.
  int64_t spec_layer(int64_t l) const { return l >= num_layers && num_layers > 0 ? num_layers - 1 : l; }
  bool mtp_layer(int64_t l) const { return l >= num_layers; }
  // The word embedding lives on the last stage too: the tied head, or MTP's shared embedding.
  bool embedding_on_last_stage() const { return tied_output() || mtp_num_layers > 0; }

  int64_t ffn() const { return ffn_hidden_size > 0 ? ffn_hidden_size : 4 * hidden_size; }
  int64_t head_dim() const { return kv_channels > 0 ? kv_channels : hidden_size / num_attention_heads; }
  int64_t query_groups() const { return num_query_groups > 0 ? num_query_groups : num_attention_heads; }
  // Width of the attention output (the projection's input): NH·HD (= C unless --kv-channels).
  int64_t attention_width() const { return num_attention_heads * head_dim(); }
  // Rows of the fused qkv projection: NH query heads, G key and G value heads.
  int64_t qkv_rows() const { return (num_attention_heads + 2 * query_groups()) * head_dim(); }
  // Rows of the MLP's first projection: F, or 2F for a gated MLP ([gate | up]).
  int64_t fc_rows() const { return mlp_gated(mlp) ? 2 * ffn() : ffn(); }
  bool moe() const { return num_experts > 0; }
  // Layer l's MLP is a Mixture of Experts (--num-experts with --moe-layer-freq).
  bool is_moe_layer(int64_t l) const {
    if (num_experts <= 0) return false;
    l = spec_layer(l);
    if (!moe_layer_pattern.empty()) return l < static_cast<int64_t>(moe_layer_pattern.size()) && moe_layer_pattern[static_cast<size_t>(l)];
    return l % moe_layer_freq == 0;
  }
  int64_t moe_ffn() const { return moe_ffn_hidden_size > 0 ? moe_ffn_hidden_size : ffn(); }
  // Rows of an expert's first projection (Fe, or 2·Fe gated), and of the shared experts' (Fs or 2·Fs).
  int64_t expert_fc_rows() const { return mlp_gated(mlp) ? 2 * moe_ffn() : moe_ffn(); }
  int64_t shared_fc_rows() const {
    return mlp_gated(mlp) ? 2 * moe_shared_expert_intermediate_size : moe_shared_expert_intermediate_size;
  }
  bool learned_positions() const { return position_embedding == PositionEmbedding::Learned; }
  bool relative_positions() const { return position_embedding == PositionEmbedding::Relative; }
  // T5: layer l is one of the decoder's (it has a cross-attention sublayer).
  bool is_decoder_layer(int64_t l) const { return t5 && l >= encoder_num_layers; }
  int64_t decoder_num_layers() const { return t5 ? num_layers - encoder_num_layers : num_layers; }
  bool norm_has_bias() const { return normalization == Normalization::LayerNorm; }
  bool qkv_bias() const { return add_bias_linear || add_qkv_bias; }
  bool gelu_erf() const { return mlp == MlpKind::GeluErf; }
  // The output layer reads the word embedding (a copy on the last pipeline stage too);
  // untied heads and sequence classifiers (no LM head) do not.
  bool tied_output() const { return !untie_embeddings && !(bert && num_classes > 0); }  // BERT's MLM head transform uses the same GELU
  // Layer l slides (a window, --window-attn-skip-freq); false without --window-size.
  bool is_sliding_layer(int64_t l) const {
    if (window_size <= 0) return false;
    if (!window_layer_pattern.empty())
      return l >= 0 && l < static_cast<int64_t>(window_layer_pattern.size()) && window_layer_pattern[static_cast<size_t>(l)];
    return window_attn_skip_freq <= 0 || (l + 1) % window_attn_skip_freq != 0;
  }
  // The layers that slide, of num_layers (closed form: num_layers may be huge).
  int64_t sliding_layers() const;
  // Layer l's self-attention mask (T5: the encoder's padding mask, the decoder's causal one).
  AttentionMaskKind attention_mask(int64_t l = 0) const {
    if (t5) return l >= 0 && l < encoder_num_layers ? AttentionMaskKind::Padding : AttentionMaskKind::Causal;
    return !causal ? AttentionMaskKind::Padding : is_sliding_layer(spec_layer(l)) ? AttentionMaskKind::SlidingWindow : AttentionMaskKind::Causal;
  }
  // The family this configuration is (model/families.h: "gpt2", "llama", "phi3", "bert", "t5", …): its
  // family_name when set, else the first family whose pins it meets (family_of), or "custom" for a mix
  // no family has (it trains; HF export needs a family).
  std::string family() const;
  // The kind of model ("BERT", "T5", "decoder") and the tool that trains it ("pretrain_bert", …): what a
  // checkpoint of another kind is refused with.
  const char* kind() const { return bert ? "BERT" : t5 ? "T5" : "decoder"; }
  const char* tool() const { return bert ? "pretrain_bert" : t5 ? "pretrain_t5" : "pretrain_gpt"; }
  // Validate; throws naming the flags that conflict.
  void validate() const;
  void validate_moe() const;        // the Mixture-of-Experts fields (validate() calls it when num_experts != 0)
  void validate_attention() const;  // windows per layer, rope scaling, QK-norm, soft-capping, norm placement
  void validate_mla() const;        // --multi-latent-attention's sizes and what it does not combine with
  void validate_mtp() const;        // --mtp-num-layers and what it needs
  void validate_t5() const;         // the T5 fields (validate() calls it when t5)
  // Parameters (the tied LM head counts once), from the parameter table. With experts: every expert
  // (total); num_active_parameters() counts k of the E routed experts (what one token runs through).
  int64_t num_parameters() const;
  int64_t num_active_parameters() const;
  // Training FLOPs per token (forward + backward = 3 × forward), documented in docs/flops.md:
  //   6·N_matmul + 12·L·NH·HD·K
  // where N_matmul counts every matmul weight including the (tied or untied) LM head (an MoE layer's
  // routed experts k/E of theirs: the active ones) and K the
  // keys a query attends on average less one half (the diagonal counted half): T/2 causal (the
  // convention of llm.c and current Megatron), T bidirectional (BERT), the mean of min(i, W) + 1/2
  // over the queries i with a sliding window W (Mistral: ≈ W + 1/2 when T ≫ W).
  // T5: per encoder token, the encoder's and the decoder's work of a sample over its Te tokens (docs/flops.md).
  double flops_per_token() const;
  // K above, averaged over the layers (sliding and global).
  double attended_keys() const;
};

// The name the code grew up with; the GPT and BERT models both take a TransformerConfig.
using GPTConfig = TransformerConfig;

}  // namespace mpitron
