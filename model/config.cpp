#include "model/config.h"

#include "core/error.h"
#include "model/param_table.h"
#include "tensor/rope.h"

namespace mpitron {

const char* to_string(Normalization n) { return n == Normalization::RMSNorm ? "RMSNorm" : "LayerNorm"; }

const char* to_string(PositionEmbedding p) {
  switch (p) {
    case PositionEmbedding::Learned: return "learned_absolute";
    case PositionEmbedding::Rope: return "rope";
    case PositionEmbedding::None: return "none";
  }
  return "?";
}

Normalization parse_normalization(const std::string& s) {
  if (s == "LayerNorm") return Normalization::LayerNorm;
  if (s == "RMSNorm") return Normalization::RMSNorm;
  MPT_THROW(str("--normalization ", s, " is not known"), "use LayerNorm or RMSNorm");
}

PositionEmbedding parse_position_embedding(const std::string& s) {
  if (s == "learned_absolute") return PositionEmbedding::Learned;
  if (s == "rope") return PositionEmbedding::Rope;
  if (s == "none") return PositionEmbedding::None;
  MPT_THROW(str("--position-embedding-type ", s, " is not known"), "use learned_absolute, rope or none");
}

std::string GPTConfig::family() const {
  if (bert) return "bert";
  const bool gpt2 = normalization == Normalization::LayerNorm && !swiglu && learned_positions() &&
                    !untie_embeddings && add_bias_linear && query_groups() == num_attention_heads;
  if (gpt2) return "gpt2";
  // Llama, Mistral, Llama 3.2 (tied head), or with biases: RMSNorm + SwiGLU + rope.
  const bool llama = normalization == Normalization::RMSNorm && swiglu && position_embedding == PositionEmbedding::Rope;
  return llama ? "llama" : "custom";
}

void GPTConfig::validate() const {
  MPT_CHECK(num_layers >= 1, str("--num-layers must be >= 1, got ", num_layers), "");
  MPT_CHECK(hidden_size >= 1 && num_attention_heads >= 1,
            str("--hidden-size (", hidden_size, ") and --num-attention-heads (", num_attention_heads, ") must be >= 1"), "");
  MPT_CHECK(hidden_size % num_attention_heads == 0,
            str("--num-attention-heads (", num_attention_heads, ") must divide --hidden-size (", hidden_size, ")"),
            "pick a head count that divides the hidden size, e.g. hidden 768 with 12 heads");
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
  MPT_CHECK(!bert || !untie_embeddings,
            "--untie-embeddings-and-output-weights: BERT's MLM decoder is tied to the word embeddings", "");
  MPT_CHECK(!gelu_exact || !swiglu || bert, "--exact-gelu with --swiglu: the SwiGLU MLP has no GELU",
            "drop --exact-gelu");
  MPT_CHECK(init_method_std > 0, str("--init-method-std must be > 0, got ", init_method_std), "");
  MPT_CHECK(layernorm_epsilon > 0, str("--norm-epsilon must be > 0, got ", layernorm_epsilon), "");
  if (position_embedding == PositionEmbedding::Rope) {
    MPT_CHECK(rotary_base > 0, str("--rotary-base must be > 0, got ", rotary_base), "Llama 2 uses 10000, Llama 3 500000");
    MPT_CHECK(rotary_percent > 0 && rotary_percent <= 1,
              str("--rotary-percent must be in (0, 1], got ", rotary_percent), "");
    rope_rotary_dim(head_dim(), rotary_percent);  // throws when the rotated dims are odd or zero
  }
}

int64_t GPTConfig::num_parameters() const {
  int64_t outer = 0, layer = 0;
  for (const ParamSpec& s : outer_param_table(*this)) outer += shape_numel(s.global_shape);
  for (const ParamSpec& s : block_param_table(*this, 0)) layer += shape_numel(s.global_shape);
  return outer + num_layers * layer;
}

double GPTConfig::flops_per_token() const {
  double matmul_params = 0;
  for (const ParamSpec& s : outer_param_table(*this))
    if (s.matmul) matmul_params += static_cast<double>(shape_numel(s.global_shape));
  for (const ParamSpec& s : block_param_table(*this, 0))
    if (s.matmul) matmul_params += static_cast<double>(num_layers) * static_cast<double>(shape_numel(s.global_shape));
  const double L = static_cast<double>(num_layers), T = static_cast<double>(seq_length);
  // Attention scores and values: the causal half (6·L·T·C), all of it when bidirectional (BERT).
  return 6.0 * matmul_params + (causal ? 6.0 : 12.0) * L * T * static_cast<double>(hidden_size);
}

}  // namespace mpitron
