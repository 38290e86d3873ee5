#include "model/layers/model_ends.h"

#include <cmath>

#include "autograd/functions.h"
#include "core/error.h"
#include "tensor/softcap.h"

namespace mpitron {

float embedding_multiplier(const TransformerConfig& c) {
  return c.scale_embeddings ? static_cast<float>(std::sqrt(static_cast<double>(c.hidden_size))) : 1.0f;
}

Var embed_tokens(Tape& tape, const TransformerConfig& c, const TensorParallel& tp, const ParamSet& ps,
                 const EmbedRows& rows, float dropout, uint64_t seed) {
  const int64_t N = rows.ids.numel(), Nl = static_cast<int64_t>(rows.positions.size());
  MPT_CHECK(!tp.sequence_parallel || N % tp.size == 0,
            str("--sequence-parallel splits ", N, " tokens of a micro-batch over ", tp.size, " ranks: not divisible"),
            "make --micro-batch-size x --seq-length divisible by --tensor-model-parallel-size");
  MPT_CHECK(Nl == tp.local_rows(N), str("embedding: ", Nl, " positions for ", tp.local_rows(N), " rows"), "");
  const Device dev = rows.ids.device();
  // Vocab-parallel lookup: this rank's rows of wte give a partial sum over the group.
  const int64_t vocab_start = tp.rank * (c.padded_vocab_size / tp.size);
  Var x = ag::embedding(tape, rows.ids, ps.var(ParamRole::WordEmbedding), vocab_start);
  x = tp.sequence_parallel ? ag::tp_scatter(tape, x, tp) : ag::tp_reduce(tape, x, tp);
  // Gemma: × √C in the compute dtype (transformers rounds the factor to the hidden states' dtype).
  if (c.scale_embeddings) x = ag::scale(tape, x, embedding_multiplier(c));
  const auto spp = [&](ParamRole r) { return ag::sequence_parallel_param(tape, ps.var(r), tp); };
  if (c.learned_positions()) {
    for (int64_t p : rows.positions)
      MPT_CHECK(p >= 0 && p < c.max_position_embeddings,
                str("position ", p, " is past --max-position-embeddings ", c.max_position_embeddings), "");
    const Tensor pos = Tensor::from_ints(rows.positions, {Nl}, DType::I32).to(dev);
    x = ag::add(tape, x, ag::embedding(tape, pos, spp(ParamRole::PositionEmbedding)));
  }
  if (c.num_tokentypes > 0) {
    MPT_CHECK(rows.types.defined() && rows.types.numel() == Nl, "embedding: the model has token types, the batch none",
              "");
    x = ag::add(tape, x, ag::embedding(tape, rows.types, spp(ParamRole::TokentypeEmbedding)));
  }
  if (ps.has(ParamRole::EmbeddingNormWeight))
    x = ag::layernorm(tape, x, spp(ParamRole::EmbeddingNormWeight), spp(ParamRole::EmbeddingNormBias),
                      c.layernorm_epsilon);
  // Dropout offsets: the embedding mask first (global element index), then two masks of N·C per block
  // (the offset counts Philox blocks of 4 elements; hidden_size % 4 == 0 under sequence parallelism).
  // (hidden_size % 4 == 0 under sequence or context parallelism).
  if (rows.dropout_rows.empty())
    return ag::dropout(tape, x, dropout, seed, static_cast<uint64_t>(tp.first_row(N) * c.hidden_size / 4));
  std::vector<ag::DropoutRows> segments;
  for (const EmbedRows::Run& r : rows.dropout_rows)
    segments.push_back({r.local, r.len, static_cast<uint64_t>(r.global * c.hidden_size / 4)});
  return ag::dropout(tape, x, dropout, seed, segments);
}

Var final_norm(Tape& tape, const TransformerConfig& c, const TensorParallel& tp, const ParamSet& ps, const Var& x,
               ParamRole weight, ParamRole bias) {
  if (!ps.has(weight)) return x;  // post-LN: the last block ends in its norm
  Var w = ag::sequence_parallel_param(tape, ps.var(weight), tp);
  if (c.layernorm_1p) {  // (1 + w): the block norms' norm_scale, differentiable here
    const Tensor ones = Tensor::empty(w.value().shape(), w.value().dtype(), w.value().device());
    ones.fill(1.0);
    w = ag::add(tape, w, Var(ones));
  }
  if (c.normalization == Normalization::RMSNorm) return ag::rmsnorm(tape, x, w, c.layernorm_epsilon);
  return ag::layernorm(tape, x, w, ag::sequence_parallel_param(tape, ps.var(bias), tp),
                       c.layernorm_epsilon);
}

const Var& output_weight(const TransformerConfig& c, const ParamSet& ps) {
  return ps.var(c.untie_embeddings ? ParamRole::OutputWeight : ParamRole::WordEmbedding);
}

Var output_logits(Tape& tape, const TensorParallel& tp, const Var& h, const Var& w, const Var& b,
                  std::function<void()> between) {
  const Var full = !tp.active()           ? h
                   : tp.sequence_parallel ? ag::tp_gather(tape, h, tp)
                                          : ag::tp_copy(tape, h, tp);
  // (N, V/t): never gathered
  return between ? ag::linear_split(tape, full, w, b, std::move(between)) : ag::linear(tape, full, w, b);
}

Var lm_logits(Tape& tape, const TransformerConfig& c, const TensorParallel& tp, const Var& h, const Var& w,
              std::function<void()> between) {
  const Var logits = output_logits(tape, tp, h, w, Var(), std::move(between));
  return c.final_logit_softcapping > 0 ? ag::softcap(tape, logits, c.final_logit_softcapping) : logits;
}

void cap_logits(const TransformerConfig& c, const Tensor& logits) {
  if (c.final_logit_softcapping > 0) softcap_forward(logits, logits, c.final_logit_softcapping);
}

Var lm_loss(Tape& tape, const TransformerConfig& c, const TensorParallel& tp, const Var& logits, const Tensor& targets) {
  const Tensor tgt = targets.to(logits.value().device()).contiguous().view({targets.numel()});
  if (!tp.active()) return ag::cross_entropy(tape, logits, tgt);
  return ag::vocab_parallel_cross_entropy(tape, logits, tgt, tp.rank * (c.padded_vocab_size / tp.size), tp);
}

}  // namespace mpitron
