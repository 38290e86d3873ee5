// TransformerConfig's members that read the tables built over it (model/config.h declares
// them): the family it is (model/families.h) and its parameter and FLOP counts (the rows of
// model/param_table.h). Here, beside the tables, so model/config.cpp depends on nothing
// above the config.
#include "model/config.h"

#include <algorithm>
#include <cmath>

#include "model/families.h"
#include "model/param_table.h"

namespace mpitron {

std::string TransformerConfig::family() const {
  const Family* f = config_family(*this);
  return f ? f->name : "custom";
}

namespace {
// Σ over the layers of a per-layer count: layers of one kind (dense or MoE) have the same rows,
// so each kind's rows are built once and counted in closed form (num_layers may be huge).
template <class F>
double sum_layers(const TransformerConfig& c, F per_row) {
  int64_t moe = 0, first_moe = -1, first_dense = -1;
  const auto rows = [&](int64_t l) {
    double t = 0;
    if (l >= 0)
      for (const ParamSpec& s : block_param_table(c, l)) t += per_row(s);
    return t;
  };
  if (c.t5)  // T5: the encoder's layers, then the decoder's (with cross-attention)
    return static_cast<double>(c.encoder_num_layers) * rows(0) +
           static_cast<double>(c.decoder_num_layers()) * rows(c.encoder_num_layers);
  if (!c.moe()) {
    first_dense = 0;
  } else if (!c.moe_layer_pattern.empty()) {
    for (int64_t l = 0; l < static_cast<int64_t>(c.moe_layer_pattern.size()); ++l) {
      const bool m = c.moe_layer_pattern[static_cast<size_t>(l)];
      moe += m;
      if (m && first_moe < 0) first_moe = l;
      if (!m && first_dense < 0) first_dense = l;
    }
  } else {  // layers 0, N, 2N, …
    moe = (c.num_layers + c.moe_layer_freq - 1) / c.moe_layer_freq;
    first_moe = 0;
    if (c.moe_layer_freq > 1 && c.num_layers > 1) first_dense = 1;
  }
  return static_cast<double>(moe) * rows(first_moe) + static_cast<double>(c.num_layers - moe) * rows(first_dense);
}
// The share of a row one token runs through: k / E for a routed expert's, else 1.
double active_share(const TransformerConfig& c, const ParamSpec& s) {
  return s.expert >= 0 ? static_cast<double>(c.moe_router_topk) / static_cast<double>(c.num_experts) : 1.0;
}
// Σ over the multi-token prediction depths' rows (each depth has the same rows).
template <class F>
double sum_mtp(const TransformerConfig& c, F per_row) {
  if (c.mtp_num_layers == 0) return 0;
  double t = 0;
  for (const ParamSpec& s : mtp_param_table(c, 1)) t += per_row(s);
  return static_cast<double>(c.mtp_num_layers) * t;
}
}  // namespace

int64_t TransformerConfig::num_parameters() const {
  int64_t outer = 0;
  for (const ParamSpec& s : outer_param_table(*this)) outer += shape_numel(s.global_shape);
  const auto all = [](const ParamSpec& s) { return static_cast<double>(shape_numel(s.global_shape)); };
  return outer + static_cast<int64_t>(sum_layers(*this, all) + sum_mtp(*this, all));
}

int64_t TransformerConfig::num_active_parameters() const {
  int64_t outer = 0;
  for (const ParamSpec& s : outer_param_table(*this)) outer += shape_numel(s.global_shape);
  const auto active = [this](const ParamSpec& s) {
    return active_share(*this, s) * static_cast<double>(shape_numel(s.global_shape));
  };
  return outer + static_cast<int64_t>(std::llround(sum_layers(*this, active) + sum_mtp(*this, active)));
}

// T5: per encoder token (the trainer counts seq_length tokens per sample). Per sample, every matmul weight
// of the encoder runs on Te tokens and of the decoder on Td, but for the cross-attention's key|value
// projection, which reads the Te memory rows; the head runs on Td; attention scores and values:
// bidirectional Te·Te in the encoder, causal Td·Td/2 and cross Td·Te in the decoder.
double t5_flops_per_token(const TransformerConfig& c) {
  const double Te = static_cast<double>(c.seq_length), Td = static_cast<double>(c.decoder_seq_length);
  double per_sample = 0;
  for (const ParamSpec& s : outer_param_table(c))
    if (s.matmul) per_sample += Td * static_cast<double>(shape_numel(s.global_shape));
  for (const bool dec : {false, true}) {
    const int64_t l = dec ? c.encoder_num_layers : 0;
    const double layers = static_cast<double>(dec ? c.decoder_num_layers() : c.encoder_num_layers);
    for (const ParamSpec& s : block_param_table(c, l))
      if (s.matmul)
        per_sample += layers * (dec && s.role != ParamRole::CrossKvWeight ? Td : Te) * static_cast<double>(shape_numel(s.global_shape));
  }
  const double A = static_cast<double>(c.attention_width());
  const double attn = static_cast<double>(c.encoder_num_layers) * Te * Te +
                      static_cast<double>(c.decoder_num_layers()) * (Td * Td / 2 + Td * Te);
  return (6.0 * per_sample + 12.0 * A * attn) / Te;
}

double TransformerConfig::flops_per_token() const {
  if (t5) return t5_flops_per_token(*this);
  double matmul_params = 0;
  for (const ParamSpec& s : outer_param_table(*this))
    if (s.matmul) matmul_params += static_cast<double>(shape_numel(s.global_shape));
  const auto matmul = [this](const ParamSpec& s) {
    return s.matmul ? active_share(*this, s) * static_cast<double>(shape_numel(s.global_shape)) : 0.0;
  };
  matmul_params += sum_layers(*this, matmul);
  // Multi-token prediction: each depth's projection and block, and its own pass through the output layer.
  matmul_params += sum_mtp(*this, matmul) +
                   static_cast<double>(mtp_num_layers) * static_cast<double>(padded_vocab_size * hidden_size);
  // Attention scores and values: 2 matmuls of 2 FLOPs per (query, key, channel), × 3 with backward.
  return 6.0 * matmul_params + 12.0 * static_cast<double>(num_layers + mtp_num_layers) *
                                   static_cast<double>(attention_width()) * attended_keys();
}

}  // namespace mpitron
