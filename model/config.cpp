#include "model/config.h"

#include "core/error.h"

namespace mpitron {

void GPTConfig::validate() const {
  MPT_CHECK(num_layers >= 1, str("--num-layers must be >= 1, got ", num_layers), "");
  MPT_CHECK(hidden_size >= 1 && num_attention_heads >= 1,
            str("--hidden-size (", hidden_size, ") and --num-attention-heads (", num_attention_heads, ") must be >= 1"), "");
  MPT_CHECK(hidden_size % num_attention_heads == 0,
            str("--num-attention-heads (", num_attention_heads, ") must divide --hidden-size (", hidden_size, ")"),
            "pick a head count that divides the hidden size, e.g. hidden 768 with 12 heads");
  MPT_CHECK(seq_length >= 1, str("--seq-length must be >= 1, got ", seq_length), "");
  MPT_CHECK(seq_length <= max_position_embeddings,
            str("--seq-length (", seq_length, ") exceeds --max-position-embeddings (", max_position_embeddings, ")"),
            "raise --max-position-embeddings or lower --seq-length");
  MPT_CHECK(padded_vocab_size >= vocab_size,
            str("padded vocabulary (", padded_vocab_size, ") smaller than the vocabulary (", vocab_size, ")"), "");
  MPT_CHECK(hidden_dropout >= 0 && hidden_dropout < 1, str("--hidden-dropout must be in [0, 1), got ", hidden_dropout), "");
  MPT_CHECK(attention_dropout >= 0 && attention_dropout < 1,
            str("--attention-dropout must be in [0, 1), got ", attention_dropout), "");
  MPT_CHECK(init_method_std > 0, str("--init-method-std must be > 0, got ", init_method_std), "");
}

int64_t GPTConfig::num_parameters() const {
  const int64_t C = hidden_size, F = ffn();
  const int64_t per_layer = 2 * C + 3 * C * C + 3 * C + C * C + C + 2 * C + F * C + F + C * F + C;
  return padded_vocab_size * C + max_position_embeddings * C + num_layers * per_layer + 2 * C;
}

double GPTConfig::flops_per_token() const {
  const double C = static_cast<double>(hidden_size), F = static_cast<double>(ffn());
  const double L = static_cast<double>(num_layers), T = static_cast<double>(seq_length);
  const double V = static_cast<double>(padded_vocab_size);
  const double matmul_params = L * (3 * C * C + C * C + 2 * C * F) + V * C;
  return 6.0 * matmul_params + 6.0 * L * T * C;
}

}  // namespace mpitron
