#include "model/gpt.h"

#include <cmath>

#include "autograd/functions.h"
#include "core/philox.h"
#include "tensor/ops.h"

namespace mpitron {

GPT::GPT(const GPTConfig& cfg, Device device) : cfg_(cfg), device_(device) {
  cfg_.validate();
  const int64_t C = cfg_.hidden_size, F = cfg_.ffn(), V = cfg_.padded_vocab_size, P = cfg_.max_position_embeddings;
  params_.add("wte", {V, C}, true);
  params_.add("wpe", {P, C}, true);
  for (int64_t l = 0; l < cfg_.num_layers; ++l) {
    const std::string pre = str("layers.", l, ".");
    params_.add(pre + "ln1.weight", {C}, false);
    params_.add(pre + "ln1.bias", {C}, false);
    params_.add(pre + "attn.qkv.weight", {3 * C, C}, true);
    params_.add(pre + "attn.qkv.bias", {3 * C}, false);
    params_.add(pre + "attn.proj.weight", {C, C}, true);
    params_.add(pre + "attn.proj.bias", {C}, false);
    params_.add(pre + "ln2.weight", {C}, false);
    params_.add(pre + "ln2.bias", {C}, false);
    params_.add(pre + "mlp.fc.weight", {F, C}, true);
    params_.add(pre + "mlp.fc.bias", {F}, false);
    params_.add(pre + "mlp.proj.weight", {C, F}, true);
    params_.add(pre + "mlp.proj.bias", {C}, false);
  }
  params_.add("lnf.weight", {C}, false);
  params_.add("lnf.bias", {C}, false);
  params_.allocate(cfg_.compute_dtype, device_);
  for (int64_t l = 0; l < cfg_.num_layers; ++l) blocks_.push_back(BlockParams::from(params_, str("layers.", l, ".")));
}

void GPT::init_weights(uint64_t seed) {
  std::vector<float> host(static_cast<size_t>(params_.numel()));
  const float std_out = cfg_.init_method_std / std::sqrt(2.0f * static_cast<float>(cfg_.num_layers));
  for (const ParamInfo& p : params_.infos()) {
    const bool is_ln = p.name.find("ln") != std::string::npos;
    const bool is_bias = p.name.size() >= 4 && p.name.compare(p.name.size() - 4, 4, "bias") == 0;
    const bool is_out = p.name.find("attn.proj.weight") != std::string::npos ||
                        p.name.find("mlp.proj.weight") != std::string::npos;
    for (int64_t i = 0; i < p.numel(); ++i) {
      float v;
      if (is_bias) v = 0.0f;
      else if (is_ln) v = 1.0f;
      else v = (is_out ? std_out : cfg_.init_method_std) * philox_normal(seed, 0, static_cast<uint64_t>(p.offset + i));
      host[static_cast<size_t>(p.offset + i)] = v;
    }
  }
  Tensor h = Tensor::from_vector(host, {params_.numel()}, cfg_.compute_dtype);
  params_.values().copy_from(h.to(device_));
}

Var GPT::trunk(Tape& tape, const Tensor& tokens, const ForwardOptions& opt) {
  const int64_t B = tokens.dim(0), T = tokens.dim(1), N = B * T;
  MPT_CHECK(T <= cfg_.max_position_embeddings,
            str("sequence of ", T, " tokens exceeds --max-position-embeddings ", cfg_.max_position_embeddings), "");
  Tensor ids = tokens.to(device_).contiguous().view({N});
  std::vector<int64_t> pos(static_cast<size_t>(N));
  for (int64_t i = 0; i < N; ++i) pos[static_cast<size_t>(i)] = i % T;
  Tensor pos_ids = Tensor::from_ints(pos, {N}, DType::I32).to(device_);
  Var x = ag::add(tape, ag::embedding(tape, ids, params_.var("wte")), ag::embedding(tape, pos_ids, params_.var("wpe")));
  const float p = opt.train ? cfg_.hidden_dropout : 0.0f;
  // Dropout offsets: the embedding mask first, then two masks of N·C per block.
  const uint64_t nc = static_cast<uint64_t>(N * cfg_.hidden_size);
  x = ag::dropout(tape, x, p, opt.dropout_seed, 0);
  const BlockShape s{B, T, cfg_.hidden_size, cfg_.num_attention_heads, cfg_.ffn(), p, cfg_.layernorm_epsilon};
  constexpr size_t kParamsPerBlock = 12, kFirstBlockParam = 2;  // after wte, wpe (see the constructor)
  for (int64_t l = 0; l < cfg_.num_layers; ++l) {
    std::function<void()> ready;
    if (opt.grads_ready) {
      const size_t first = kFirstBlockParam + kParamsPerBlock * static_cast<size_t>(l);
      ready = [cb = opt.grads_ready, first] { cb(first, first + kParamsPerBlock); };
    }
    x = block(tape, s, blocks_[static_cast<size_t>(l)], x, opt.dropout_seed, nc * (1 + 2 * static_cast<uint64_t>(l)),
              opt.recompute, std::move(ready));
  }
  return ag::layernorm(tape, x, params_.var("lnf.weight"), params_.var("lnf.bias"), cfg_.layernorm_epsilon);
}

Var GPT::forward(Tape& tape, const Tensor& tokens, const Tensor& targets, const ForwardOptions& opt) {
  Var h = trunk(tape, tokens, opt);
  Var logits = ag::linear(tape, h, params_.var("wte"), Var());
  Tensor tgt = targets.to(device_).contiguous().view({targets.numel()});
  return ag::cross_entropy(tape, logits, tgt);
}

Tensor GPT::logits(const Tensor& tokens) {
  Tape tape;
  tape.set_recording(false);
  ForwardOptions opt;
  opt.train = false;
  Var h = trunk(tape, tokens, opt);
  return ag::linear(tape, h, params_.var("wte"), Var()).value();
}

}  // namespace mpitron
