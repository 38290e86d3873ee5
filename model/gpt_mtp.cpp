// model/gpt_mtp.cpp — multi-token prediction (Megatron-Core's --mtp-num-layers, DeepSeek-V3's MTP
// modules) on the last pipeline stage, after the main model's final norm.
//
// Depth k = 1 … D, h_0 (Nl, C) the main final norm's output (the tensor the main head reads):
//   ids_k  (B, T)  = ids_{k−1} shifted left by one, 0 at the end        (Megatron's roll_tensor)
//   e_k    (Nl, C) = the shared embedding of ids_k (no position table: MTP needs rope)
//   x_k    (Nl, C) = eh_proj_k · [enorm_k(e_k) | hnorm_k(h_{k−1})]     eh_proj (C, 2C), replicated
//   h_k    (Nl, C) = final_norm_k(block_{L+k−1}(x_k))                   a block of the last layer's kind
//   mtp_k  (1)     = mean CE(output layer(h_k), targets shifted left k times; the last k ignored)
//   loss           = lm + (λ / D) · Σ_k mtp_k                           λ: --mtp-loss-scaling-factor
// The replicated weights (enorm, hnorm, eh_proj, the final norm) take sequence parallelism's partial
// gradients through ag::sequence_parallel_param; the block is any block (TP, SP, EP, recompute, split B/W).
#include "autograd/functions.h"
#include "core/error.h"
#include "tensor/ops.h"
#include "model/gpt.h"
#include "model/layers/attention_core.h"
#include "model/layers/model_ends.h"
#include "model/param_table.h"

namespace mpitron {

namespace {

// (B, T) i32 host ids shifted left by one along T, `fill` at the end.
Tensor shift_left(const Tensor& t, int32_t fill) {
  const Tensor h = t.to(Device::cpu()).contiguous();
  const int64_t B = h.dim(0), T = h.dim(1);
  Tensor out = Tensor::empty({B, T}, DType::I32);
  for (int64_t b = 0; b < B; ++b) {
    const int32_t* src = h.data<int32_t>() + b * T;
    int32_t* dst = out.data<int32_t>() + b * T;
    for (int64_t i = 0; i + 1 < T; ++i) dst[i] = src[i + 1];
    dst[T - 1] = fill;
  }
  return out;
}

Var mtp_norm(Tape& tape, const GPTConfig& c, const TensorParallel& tp, const ParamSet& ps, const std::string& name,
             const Var& x) {
  const Var w = ag::sequence_parallel_param(tape, ps.var(ps.index(name)), tp);
  return ag::rmsnorm(tape, x, w, c.layernorm_epsilon);
}

}  // namespace

Var GPT::mtp_loss(Tape& tape, const Var& h0, const Tensor& tokens, const Tensor& targets, const ForwardOptions& opt) {
  const TensorParallel& tp = mp_.tp;
  const int64_t B = tokens.dim(0), T = tokens.dim(1), N = B * T, L = cfg_.num_layers;
  last_mtp_losses_.assign(static_cast<size_t>(cfg_.mtp_num_layers), 0.0);
  Tensor ids = tokens, tgt = targets.to(Device::cpu()).contiguous();
  Var h = h0, sum;
  for (int64_t k = 1; k <= cfg_.mtp_num_layers; ++k) {
    ids = shift_left(ids, 0);
    tgt = shift_left(tgt, -1);
    const std::string pre = mtp_prefix(k);  // "mtp.{k−1}."
    EmbedRows rows;
    rows.ids = ids.to(device_).contiguous().view({N});
    const int64_t row0 = tp.first_row(N);
    for (int64_t i = 0; i < tp.local_rows(N); ++i) rows.positions.push_back((row0 + i) % T);
    // The embedding's dropout stream of depth k: a key of its own (the main embedding's is dropout_seed).
    const Var e = hooked_use(tape, opt, {ParamRole::WordEmbedding, ParamRole::PositionEmbedding}, false,
                             [&](const std::function<void()>&) {
                               return embed_tokens(tape, cfg_, tp, params_, rows,
                                                   opt.train ? cfg_.hidden_dropout : 0.0f,
                                                   opt.dropout_seed ^ (0x4d545000ull + static_cast<uint64_t>(k)));
                             });
    const Var cat = ag::concat_cols(tape, mtp_norm(tape, cfg_, tp, params_, pre + "enorm.weight", e),
                                    mtp_norm(tape, cfg_, tp, params_, pre + "hnorm.weight", h));
    const Var proj = ag::sequence_parallel_param(tape, params_.var(params_.index(pre + "eh_proj.weight")), tp);
    Var x = ag::linear(tape, cat, proj, Var());
    x = run_block(tape, block_index(L + k - 1), x, B, T, opt, nullptr, opt.recompute && opt.recompute_num_layers == 0,
                  nullptr, static_cast<uint64_t>(N * cfg_.hidden_size));
    h = mtp_norm(tape, cfg_, tp, params_, pre + "final_norm.weight", x);
    const Var logits = output_layer(tape, h, opt);
    const Var loss_k = lm_loss(tape, cfg_, tp, logits, tgt);
    last_mtp_losses_[static_cast<size_t>(k - 1)] = loss_k.value().item();
    sum = sum.defined() ? ag::add(tape, sum, loss_k) : loss_k;
  }
  return ag::scale(tape, sum, cfg_.mtp_loss_scaling_factor / static_cast<float>(cfg_.mtp_num_layers));
}

Tensor mtp_decode_hidden(const GPT& model, const Tensor& e, const Tensor& h,
                         const std::function<Tensor(const Tensor&)>& block, int64_t tile) {
  const GPTConfig& c = model.config();
  const ParamSet& ps = model.params();
  Tape tape;
  tape.set_recording(false);
  const std::string pre = mtp_prefix(1);
  const auto norm = [&](const std::string& name, const Tensor& x) {
    return ag::rmsnorm(tape, Var(x), ps.var(ps.index(pre + name)), c.layernorm_epsilon).value();
  };
  const Tensor cat = ag::concat_cols(tape, Var(norm("enorm.weight", e)), Var(norm("hnorm.weight", h))).value();
  const Tensor w = ps.var(ps.index(pre + "eh_proj.weight")).value();
  const int64_t n = e.dim(0);
  Tensor x = Tensor::empty({n, c.hidden_size}, e.dtype(), e.device());
  for (int64_t t0 = 0; t0 < n; t0 += tile)  // tile-sized GEMMs: a row's numbers whatever the batch
    gemm(cat.slice(0, t0, std::min(n, t0 + tile)), w, x.slice(0, t0, std::min(n, t0 + tile)),
         GemmArgs{false, true, 1.0f, 0.0f});
  return norm("final_norm.weight", block(x));
}

}  // namespace mpitron
