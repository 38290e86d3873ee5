#include "model/gpt.h"

#include <cmath>

#include "autograd/functions.h"
#include "core/philox.h"
#include "tensor/ops.h"

namespace mpitron {

std::vector<std::pair<std::string, Shape>> GPT::global_layout(const GPTConfig& cfg) {
  const int64_t C = cfg.hidden_size, F = cfg.ffn(), V = cfg.padded_vocab_size, P = cfg.max_position_embeddings;
  std::vector<std::pair<std::string, Shape>> v{{"wte", {V, C}}, {"wpe", {P, C}}};
  for (int64_t l = 0; l < cfg.num_layers; ++l) {
    const std::string pre = str("layers.", l, ".");
    v.push_back({pre + "ln1.weight", {C}});
    v.push_back({pre + "ln1.bias", {C}});
    v.push_back({pre + "attn.qkv.weight", {3 * C, C}});
    v.push_back({pre + "attn.qkv.bias", {3 * C}});
    v.push_back({pre + "attn.proj.weight", {C, C}});
    v.push_back({pre + "attn.proj.bias", {C}});
    v.push_back({pre + "ln2.weight", {C}});
    v.push_back({pre + "ln2.bias", {C}});
    v.push_back({pre + "mlp.fc.weight", {F, C}});
    v.push_back({pre + "mlp.fc.bias", {F}});
    v.push_back({pre + "mlp.proj.weight", {C, F}});
    v.push_back({pre + "mlp.proj.bias", {C}});
  }
  v.push_back({"lnf.weight", {C}});
  v.push_back({"lnf.bias", {C}});
  return v;
}

namespace {
bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// How the parameter `name` is split over tensor-parallel ranks (Megatron's layout).
TPShard tp_shard_of(const std::string& name, const TensorParallel& tp) {
  TPShard t;
  t.rank = tp.rank;
  t.size = tp.size;
  if (tp.size == 1) return t;
  if (name == "wte" || ends_with(name, "mlp.fc.weight") || ends_with(name, "mlp.fc.bias")) t.axis = 0;
  else if (ends_with(name, "attn.qkv.weight") || ends_with(name, "attn.qkv.bias")) t.axis = 0, t.parts = 3;
  else if (ends_with(name, "attn.proj.weight") || ends_with(name, "mlp.proj.weight")) t.axis = 1;
  return t;  // layernorms, wpe, row-parallel biases: replicated
}
}  // namespace

GPT::GPT(const GPTConfig& cfg, Device device, const ModelParallel& mp) : cfg_(cfg), device_(device), mp_(mp) {
  cfg_.validate();
  const TensorParallel& tp = mp_.tp;
  const int stages = mp_.pp_size * mp_.virtual_stages;
  MPT_CHECK(tp.size >= 1 && cfg_.num_attention_heads % tp.size == 0 && cfg_.ffn() % tp.size == 0 &&
                cfg_.padded_vocab_size % tp.size == 0,
            str("--tensor-model-parallel-size ", tp.size, " must divide --num-attention-heads (",
                cfg_.num_attention_heads, "), the FFN size (", cfg_.ffn(), ") and the padded vocabulary (",
                cfg_.padded_vocab_size, ")"),
            "choose a tensor-parallel size that divides them");
  MPT_CHECK(cfg_.num_layers % stages == 0,
            str("--num-layers ", cfg_.num_layers, " is not divisible by the ", stages,
                " pipeline stages (--pipeline-model-parallel-size ", mp_.pp_size, " x ", mp_.virtual_stages,
                " virtual stages)"),
            "choose --num-layers, --pipeline-model-parallel-size and --num-layers-per-virtual-pipeline-stage to fit");
  MPT_CHECK(tp.size == 1 || tp.comm, "tensor parallelism needs the tp communicator", "");
  MPT_CHECK(!tp.sequence_parallel || cfg_.hidden_size % 4 == 0,
            str("--sequence-parallel needs --hidden-size divisible by 4 (dropout masks start at a Philox block), got ",
                cfg_.hidden_size), "");
  const int64_t per_stage = cfg_.num_layers / stages;
  for (int c = 0; c < mp_.virtual_stages; ++c) {
    ChunkInfo ch;
    ch.stage = c * mp_.pp_size + mp_.pp_rank;
    ch.first_layer = ch.stage * per_stage;
    ch.end_layer = ch.first_layer + per_stage;
    ch.first_stage = ch.stage == 0;
    ch.last_stage = ch.stage == stages - 1;
    chunks_.push_back(ch);
  }
  const bool has_first = chunks_.front().first_stage, has_last = chunks_.back().last_stage;
  // Every parameter of this rank, in single-rank order (plus the head's wte copy).
  int64_t goff = 0;
  auto holds = [&](const std::string& name) {
    if (name == "wte") return has_first || has_last;
    if (name == "wpe") return has_first;
    if (name.rfind("lnf.", 0) == 0) return has_last;
    const int64_t l = std::stoll(name.substr(7));  // "layers.<l>."
    for (const ChunkInfo& ch : chunks_)
      if (l >= ch.first_layer && l < ch.end_layer) return true;
    return false;
  };
  for (const auto& [name, gshape] : global_layout(cfg_)) {
    const int64_t gnumel = shape_numel(gshape);
    if (holds(name)) {
      ParamInfo p;
      p.name = name;
      p.global_shape = gshape;
      p.tp = tp_shard_of(name, tp);
      p.shape = gshape;
      if (p.tp.axis >= 0) p.shape[static_cast<size_t>(p.tp.axis)] /= tp.size;
      p.global_offset = goff;
      const bool is_bias = ends_with(name, "bias");
      const bool is_ln = name.find("ln") != std::string::npos;  // ln1, ln2, lnf
      p.weight_decay = !is_bias && !is_ln;
      p.canonical = (p.tp.axis >= 0 || tp.rank == 0) && !(name == "wte" && !has_first);
      params_.add(p);
    }
    goff += gnumel;
  }
  params_.allocate(cfg_.compute_dtype, device_);
  for (const ChunkInfo& ch : chunks_)
    for (int64_t l = ch.first_layer; l < ch.end_layer; ++l) {
      const std::string pre = str("layers.", l, ".");
      blocks_.push_back(BlockParams::from(params_, pre));
      block_first_param_.push_back(params_.index(pre + "ln1.weight"));
      block_layer_.push_back(l);
    }
}

Shape GPT::activation_shape(int64_t batch) const {
  return {mp_.tp.local_rows(batch * cfg_.seq_length), cfg_.hidden_size};
}

void GPT::init_weights(uint64_t seed) {
  // Element e of the single-rank layout draws Philox counter e, whatever the
  // parallel layout: every rank's slice equals the one-rank model's.
  std::vector<float> host(static_cast<size_t>(params_.numel()));
  const float std_out = cfg_.init_method_std / std::sqrt(2.0f * static_cast<float>(cfg_.num_layers));
  for (const ParamInfo& p : params_.infos()) {
    const bool is_ln = p.name.find("ln") != std::string::npos;
    const bool is_bias = ends_with(p.name, "bias");
    const bool is_out = ends_with(p.name, "attn.proj.weight") || ends_with(p.name, "mlp.proj.weight");
    for (int64_t i = 0; i < p.numel(); ++i) {
      float v;
      if (is_bias) v = 0.0f;
      else if (is_ln) v = 1.0f;
      else
        v = (is_out ? std_out : cfg_.init_method_std) *
            philox_normal(seed, 0, static_cast<uint64_t>(p.global_offset + global_element(p, i)));
      host[static_cast<size_t>(p.offset + i)] = v;
    }
  }
  Tensor h = Tensor::from_vector(host, {params_.numel()}, cfg_.compute_dtype);
  params_.values().copy_from(h.to(device_));
}

Var GPT::embed(Tape& tape, const Tensor& tokens, const ForwardOptions& opt) {
  const TensorParallel& tp = mp_.tp;
  const int64_t B = tokens.dim(0), T = tokens.dim(1), N = B * T;
  MPT_CHECK(T <= cfg_.max_position_embeddings,
            str("sequence of ", T, " tokens exceeds --max-position-embeddings ", cfg_.max_position_embeddings), "");
  MPT_CHECK(!tp.sequence_parallel || N % tp.size == 0,
            str("--sequence-parallel splits ", N, " tokens of a micro-batch over ", tp.size, " ranks: not divisible"),
            "make --micro-batch-size x --seq-length divisible by --tensor-model-parallel-size");
  Tensor ids = tokens.to(device_).contiguous().view({N});
  // Vocab-parallel lookup: this rank's rows of wte give a partial sum over the group.
  const int64_t vocab_start = tp.rank * (cfg_.padded_vocab_size / tp.size);
  Var x = ag::embedding(tape, ids, params_.var("wte"), vocab_start);
  x = tp.sequence_parallel ? ag::tp_scatter(tape, x, tp) : ag::tp_reduce(tape, x, tp);
  const int64_t rows = tp.local_rows(N), row0 = tp.first_row(N);
  std::vector<int64_t> pos(static_cast<size_t>(rows));
  for (int64_t i = 0; i < rows; ++i) pos[static_cast<size_t>(i)] = (row0 + i) % T;
  Tensor pos_ids = Tensor::from_ints(pos, {rows}, DType::I32).to(device_);
  x = ag::add(tape, x, ag::embedding(tape, pos_ids, ag::sequence_parallel_param(tape, params_.var("wpe"), tp)));
  const float p = opt.train ? cfg_.hidden_dropout : 0.0f;
  // Dropout offsets: the embedding mask first (global element index), then two masks of N·C per block.
  // (the offset counts Philox blocks of 4 elements; hidden_size % 4 == 0 under sequence parallelism).
  return ag::dropout(tape, x, p, opt.dropout_seed, static_cast<uint64_t>(row0 * cfg_.hidden_size / 4));
}

Var GPT::layers(Tape& tape, const ChunkInfo& ch, Var x, int64_t batch, int64_t seq, const ForwardOptions& opt) {
  const int64_t N = batch * seq;
  const float p = opt.train ? cfg_.hidden_dropout : 0.0f;
  const uint64_t nc = static_cast<uint64_t>(N * cfg_.hidden_size);
  const BlockShape s{batch, seq, cfg_.hidden_size, cfg_.num_attention_heads, cfg_.ffn(), p, cfg_.layernorm_epsilon,
                     mp_.tp, opt.train ? cfg_.attention_dropout : 0.0f};
  constexpr size_t kParamsPerBlock = 12;
  for (size_t i = 0; i < blocks_.size(); ++i) {
    const int64_t l = block_layer_[i];
    if (l < ch.first_layer || l >= ch.end_layer) continue;
    std::function<void()> ready;
    if (opt.grads_ready) {
      const size_t first = block_first_param_[i];
      ready = [cb = opt.grads_ready, first] { cb(first, first + kParamsPerBlock); };
    }
    const bool recompute = opt.recompute && (opt.recompute_num_layers == 0 || l - ch.first_layer < opt.recompute_num_layers);
    BlockShape sl = s;  // attention dropout: layer l's blocks [l·⌈T²/4⌉, (l+1)·⌈T²/4⌉) of each (batch, head)
    sl.attention_offset = static_cast<uint64_t>(l) * static_cast<uint64_t>((seq * seq + 3) / 4);
    x = block(tape, sl, blocks_[i], x, opt.dropout_seed, nc * (1 + 2 * static_cast<uint64_t>(l)), recompute,
              std::move(ready));
  }
  return x;
}

Var GPT::head_loss(Tape& tape, const Var& x, const Tensor& targets) {
  const TensorParallel& tp = mp_.tp;
  Var h = ag::layernorm(tape, x, ag::sequence_parallel_param(tape, params_.var("lnf.weight"), tp),
                       ag::sequence_parallel_param(tape, params_.var("lnf.bias"), tp), cfg_.layernorm_epsilon);
  Tensor tgt = targets.to(device_).contiguous().view({targets.numel()});
  if (!tp.active()) return ag::cross_entropy(tape, ag::linear(tape, h, params_.var("wte"), Var()), tgt);
  h = tp.sequence_parallel ? ag::tp_gather(tape, h, tp) : ag::tp_copy(tape, h, tp);
  Var logits = ag::linear(tape, h, params_.var("wte"), Var());  // (N, V/t): never gathered
  const int64_t vocab_start = tp.rank * (cfg_.padded_vocab_size / tp.size);
  return ag::vocab_parallel_cross_entropy(tape, logits, tgt, vocab_start, tp);
}

Var GPT::chunk_forward(Tape& tape, int c, const Tensor& tokens, const Tensor& targets, const Var& input,
                       const ForwardOptions& opt) {
  const ChunkInfo& ch = chunk(c);
  const int64_t B = tokens.dim(0), T = tokens.dim(1);
  Var x;
  if (ch.first_stage) {
    x = embed(tape, tokens, opt);
  } else {
    MPT_CHECK(input.defined() && input.shape() == activation_shape(B),
              str("stage ", ch.stage, " received ", input.defined() ? input.value().describe() : "nothing",
                  ", expected an activation of shape ", shape_str(activation_shape(B))),
              "");
    x = input;
  }
  x = layers(tape, ch, x, B, T, opt);
  return ch.last_stage ? head_loss(tape, x, targets) : x;
}

Var GPT::forward(Tape& tape, const Tensor& tokens, const Tensor& targets, const ForwardOptions& opt) {
  MPT_CHECK(num_chunks() == 1 && chunk(0).first_stage && chunk(0).last_stage,
            "GPT::forward runs the whole model; with pipeline parallelism run chunk_forward per stage", "");
  return chunk_forward(tape, 0, tokens, targets, Var(), opt);
}

Tensor GPT::logits(const Tensor& tokens) {
  MPT_CHECK(mp_.tp.size == 1 && mp_.pp_size == 1, "GPT::logits needs the whole model on one rank",
            "load the checkpoint into a single process (it loads under any layout)");
  Tape tape;
  tape.set_recording(false);
  ForwardOptions opt;
  opt.train = false;
  Var x = layers(tape, chunk(0), embed(tape, tokens, opt), tokens.dim(0), tokens.dim(1), opt);
  Var h = ag::layernorm(tape, x, params_.var("lnf.weight"), params_.var("lnf.bias"), cfg_.layernorm_epsilon);
  return ag::linear(tape, h, params_.var("wte"), Var()).value();
}

}  // namespace mpitron
