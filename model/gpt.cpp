#include "model/gpt.h"

#include <algorithm>
#include <cmath>

#include "autograd/functions.h"
#include "core/philox.h"
#include "model/layers/attention_core.h"
#include "model/layers/model_ends.h"
#include "tensor/ops.h"

namespace mpitron {

std::vector<std::pair<std::string, Shape>> GPT::global_layout(const GPTConfig& cfg) {
  std::vector<std::pair<std::string, Shape>> v;
  for (const ParamSpec& spec : param_table(cfg)) v.push_back({spec.name, spec.global_shape});
  return v;
}

GPT::GPT(const GPTConfig& cfg, Device device, const ModelParallel& mp) : cfg_(cfg), device_(device), mp_(mp) {
  cfg_.validate();
  const TensorParallel& tp = mp_.tp;
  const int stages = mp_.pp_size * mp_.virtual_stages;
  MPT_CHECK(tp.size >= 1 && cfg_.query_groups() % tp.size == 0,
            str("--tensor-model-parallel-size ", tp.size, " must divide the ", cfg_.query_groups(),
                " key/value heads (--num-query-groups, or --num-attention-heads without grouping)"),
            "each tensor-parallel rank holds whole query groups: use a tensor-parallel size that divides them");
  MPT_CHECK(tp.size >= 1 && cfg_.num_attention_heads % tp.size == 0 && cfg_.ffn() % tp.size == 0 &&
                cfg_.padded_vocab_size % tp.size == 0,
            str("--tensor-model-parallel-size ", tp.size, " must divide --num-attention-heads (",
                cfg_.num_attention_heads, "), the FFN size (", cfg_.ffn(), ") and the padded vocabulary (",
                cfg_.padded_vocab_size, ")"),
            "choose a tensor-parallel size that divides them");
  MPT_CHECK(!cfg_.moe() || (cfg_.moe_ffn() % tp.size == 0 && cfg_.moe_shared_expert_intermediate_size % tp.size == 0),
            str("--tensor-model-parallel-size ", tp.size, " must divide the experts' width --moe-ffn-hidden-size (",
                cfg_.moe_ffn(), ") and the shared experts' --moe-shared-expert-intermediate-size (",
                cfg_.moe_shared_expert_intermediate_size, ")"),
            "each tensor-parallel rank holds an equal slice of every expert");
  MPT_CHECK(cfg_.num_layers % stages == 0,
            str("--num-layers ", cfg_.num_layers, " is not divisible by the ", stages,
                " pipeline stages (--pipeline-model-parallel-size ", mp_.pp_size, " x ", mp_.virtual_stages,
                " virtual stages)"),
            "choose --num-layers, --pipeline-model-parallel-size and --num-layers-per-virtual-pipeline-stage to fit");
  MPT_CHECK(tp.size == 1 || tp.comm, "tensor parallelism needs the tp communicator", "");
  MPT_CHECK(!tp.sequence_parallel || cfg_.hidden_size % 4 == 0,
            str("--sequence-parallel needs --hidden-size divisible by 4 (dropout masks start at a Philox block), got ",
                cfg_.hidden_size), "");
  if (mp_.cp.active()) {  // context parallelism (parallel/context_parallel.h)
    MPT_CHECK(cfg_.causal, "--context-parallel-size > 1 needs causal attention: BERT's padding mask is not supported",
              "train BERT without --context-parallel-size");
    MPT_CHECK(cfg_.window_size == 0,
              str("--context-parallel-size > 1 with --window-size ", cfg_.window_size,
                  ": the ring attention's blocks take the causal mask only, not yet a sliding window"),
              "train with --context-parallel-size 1, or without --window-size");
    MPT_CHECK(cfg_.hidden_size % 4 == 0,
              str("--context-parallel-size needs --hidden-size divisible by 4 (dropout masks start at a Philox block), "
                  "got ", cfg_.hidden_size), "");
    check_context_parallel(mp_.cp, cfg_.seq_length, cfg_.num_attention_heads / tp.size, cfg_.query_groups() / tp.size);
  }
  MPT_CHECK(!mp_.cp.active() || cfg_.mtp_num_layers == 0,
            "--mtp-num-layers with --context-parallel-size > 1 is not built (the shifted tokens cross the ranks' chunks)",
            "train multi-token prediction without context parallelism (TP, SP, PP, DP/ZeRO and EP take it)");
  const int64_t per_stage = cfg_.num_layers / stages;
  MPT_CHECK(mp_.chunk_stages.empty() || static_cast<int>(mp_.chunk_stages.size()) == mp_.virtual_stages,
            str("ModelParallel::chunk_stages holds ", mp_.chunk_stages.size(), " stages for ", mp_.virtual_stages,
                " chunks"), "");
  for (int c = 0; c < mp_.virtual_stages; ++c) {
    ChunkInfo ch;
    ch.stage = mp_.chunk_stages.empty() ? c * mp_.pp_size + mp_.pp_rank : mp_.chunk_stages[static_cast<size_t>(c)];
    ch.first_layer = ch.stage * per_stage;
    ch.end_layer = ch.first_layer + per_stage;
    ch.first_stage = ch.stage == 0;
    ch.last_stage = ch.stage == stages - 1;
    chunks_.push_back(ch);
  }
  bool has_first = false, has_last = false;
  for (const ChunkInfo& ch : chunks_) has_first |= ch.first_stage, has_last |= ch.last_stage;
  MPT_CHECK(!mp_.ep.active() || (cfg_.moe() && cfg_.num_experts % mp_.ep.size == 0),
            str("--expert-model-parallel-size ", mp_.ep.size, " needs --num-experts divisible by it, got ",
                cfg_.num_experts),
            "each expert-parallel rank holds num-experts / EP whole experts");
  MPT_CHECK(!mp_.ep.active() || mp_.ep.comm, "expert parallelism needs the ep communicator", "");
  auto holds = [&](const ParamSpec& spec) {
    if (spec.expert >= 0 && !mp_.ep.holds(spec.expert, cfg_.num_experts)) return false;
    switch (spec.place) {
      case ParamPlace::FirstStage: return has_first;
      case ParamPlace::LastStage: return has_last;
      case ParamPlace::FirstAndLast: return has_first || has_last;
      case ParamPlace::Layer: break;
    }
    if (cfg_.mtp_layer(spec.layer)) return has_last;  // the MTP blocks: on the last stage
    for (const ChunkInfo& ch : chunks_)
      if (spec.layer >= ch.first_layer && spec.layer < ch.end_layer) return true;
    return false;
  };
  // Every parameter of this rank, in single-rank order (plus the tied head's wte copy).
  int64_t goff = 0;
  for (const ParamSpec& spec : param_table(cfg_)) {
    if (holds(spec)) {
      ParamInfo p;
      p.name = spec.name;
      p.role = spec.role;
      p.init = spec.init;
      p.global_shape = spec.global_shape;
      p.shape = spec.global_shape;
      p.tp.rank = tp.rank;
      p.tp.size = tp.size;
      if (spec.tp_axis >= 0) p.tp.parts = spec.tp_parts;  // the blocks a fused weight holds (muon splits them)
      if (tp.size > 1 && spec.tp_axis >= 0) {
        p.tp.axis = spec.tp_axis;
        p.shape[static_cast<size_t>(spec.tp_axis)] /= tp.size;
      }
      p.global_offset = goff;
      p.weight_decay = spec.weight_decay;
      p.canonical = (p.tp.axis >= 0 || tp.rank == 0) && !(spec.place == ParamPlace::FirstAndLast && !has_first) &&
                    (spec.expert >= 0 || mp_.ep.rank == 0);
      p.expert = spec.expert >= 0;
      params_.add(p);
    }
    goff += shape_numel(spec.global_shape);
  }
  params_.allocate(cfg_.compute_dtype, device_);
  for (const ChunkInfo& ch : chunks_) {
    const int64_t end = ch.last_stage ? cfg_.num_layers + cfg_.mtp_num_layers : ch.end_layer;  // + the MTP blocks
    for (int64_t l = ch.first_layer; l < end; ++l) {
      blocks_.push_back(BlockParams::from(params_, cfg_, l));
      block_first_param_.push_back(params_.index(block_param_table(cfg_, l).front().name));
      block_layer_.push_back(l);
    }
  }
  std::vector<char> in_block(params_.infos().size(), 0);
  for (size_t i = 0; i < blocks_.size(); ++i)
    for (size_t k = 0; k < static_cast<size_t>(blocks_[i].count()); ++k) in_block[block_first_param_[i] + k] = 1;
  for (size_t k = 0; k < in_block.size(); ++k)
    if (!in_block[k]) {
      if (!outside_blocks_.empty() && outside_blocks_.back().second == k) outside_blocks_.back().second = k + 1;
      else outside_blocks_.emplace_back(k, k + 1);
    }
  // The embedding tables and the output matrix, gathered by ZeRO-3 around each use (hooked_use);
  // BERT's and T5's forwards take every parameter outside blocks at their start.
  if (!cfg_.bert && !cfg_.t5)
    for (size_t k = 0; k < in_block.size(); ++k) {
      const ParamRole r = params_.infos()[k].role;
      if (!in_block[k] &&
          (r == ParamRole::WordEmbedding || r == ParamRole::PositionEmbedding || r == ParamRole::OutputWeight))
        hooked_.push_back(k);
    }
  for (size_t k = 0; k < in_block.size(); ++k)
    if (!in_block[k] && std::find(hooked_.begin(), hooked_.end(), k) == hooked_.end()) {
      if (!unhooked_.empty() && unhooked_.back().second == k) unhooked_.back().second = k + 1;
      else unhooked_.emplace_back(k, k + 1);
    }
  if (cfg_.moe_router_enable_expert_bias) enable_expert_bias();  // part of the model: routing reads it
}

Var GPT::hooked_use(Tape& tape, const ForwardOptions& opt, std::initializer_list<ParamRole> roles, bool reads_values,
                    const std::function<Var(std::function<void()>)>& use) const {
  std::vector<std::pair<size_t, size_t>> r;  // the hooked parameters of `roles` here, as ranges
  for (const size_t k : hooked_)
    if (std::find(roles.begin(), roles.end(), params_.infos()[k].role) != roles.end()) {
      if (!r.empty() && r.back().second == k) r.back().second = k + 1;
      else r.emplace_back(k, k + 1);
    }
  auto each = [r](const std::function<void(size_t, size_t)>& f) {
    return std::function<void()>([f, r] {
      for (const auto& [first, end] : r) f(first, end);
    });
  };
  if (opt.params_needed) each(opt.params_needed)();
  if (r.empty() || !tape.recording() || !opt.grads_needed) return use({});
  // Tape order is the reverse of the backward's: grads_added runs after the use's nodes,
  // grads_needed (and params_needed_backward) before them.
  ag::on_backward(tape, each(opt.grads_added));
  if (!reads_values) {
    const Var y = use({});
    ag::on_backward(tape, each(opt.grads_needed));
    return y;
  }
  const Var y = use(each(opt.grads_needed));  // after the input gradient, before the weight's
  if (opt.params_needed_backward) ag::on_backward(tape, each(opt.params_needed_backward));
  return y;
}

void GPT::need_params_outside_blocks(const ForwardOptions& opt) const {
  if (!opt.params_needed) return;
  for (const auto& [first, end] : outside_blocks_) opt.params_needed(first, end);
}

BlockParams& GPT::block_params(int64_t layer) {
  return const_cast<BlockParams&>(static_cast<const GPT*>(this)->block_params(layer));
}

bool GPT::holds_layer(int64_t layer) const {
  for (const int64_t l : block_layer_)
    if (l == layer) return true;
  return false;
}

void GPT::enable_expert_bias() {
  expert_bias_ = true;
  for (size_t i = 0; i < blocks_.size(); ++i)
    if (cfg_.is_moe_layer(block_layer_[i]) && !blocks_[i].expert_bias.defined())
      blocks_[i].expert_bias = Tensor::zeros({cfg_.num_experts}, DType::F32, device_);
}

std::vector<int64_t> GPT::expert_bias_layers() const {
  std::vector<int64_t> v;
  for (size_t i = 0; i < blocks_.size(); ++i)
    if (blocks_[i].expert_bias.defined()) v.push_back(block_layer_[i]);
  return v;
}

void GPT::update_expert_bias(const std::map<int64_t, std::vector<double>>& counts, double rate) {
  for (const auto& [layer, c] : counts) {
    BlockParams& p = block_params(layer);
    MPT_CHECK(p.expert_bias.defined() && static_cast<int64_t>(c.size()) == cfg_.num_experts,
              str("update_expert_bias: layer ", layer, " has no expert bias or ", c.size(), " counts for ",
                  cfg_.num_experts, " experts"), "");
    double mean = 0;
    for (const double x : c) mean += x;
    mean /= static_cast<double>(c.size());
    const Tensor b = p.expert_bias.to(Device::cpu());
    float* d = b.data<float>();
    for (size_t e = 0; e < c.size(); ++e) {
      const double off = mean - c[e];
      d[e] += static_cast<float>((off > 0) - (off < 0)) * static_cast<float>(rate);
    }
    p.expert_bias.copy_from(b.to(device_));
  }
}

const BlockParams& GPT::block_params(int64_t layer) const {
  for (size_t i = 0; i < blocks_.size(); ++i)
    if (block_layer_[i] == layer) return blocks_[i];
  MPT_THROW(str("layer ", layer, " is not on this rank"), "");
}

Shape GPT::activation_shape(int64_t batch) const {
  return {mp_.tp.local_rows(batch * mp_.cp.local_seq(cfg_.seq_length)), cfg_.hidden_size};
}

void GPT::init_weights(uint64_t seed) {
  // Element e of the single-rank layout draws Philox counter e, whatever the
  // parallel layout: every rank's slice equals the one-rank model's.
  std::vector<float> host(static_cast<size_t>(params_.numel()));
  const float std_out = cfg_.init_method_std / std::sqrt(2.0f * static_cast<float>(cfg_.num_layers));
  for (const ParamInfo& p : params_.infos()) {
    for (int64_t i = 0; i < p.numel(); ++i) {
      float v;
      switch (p.init) {
        case ParamInit::Zeros: v = 0.0f; break;
        case ParamInit::Ones: v = 1.0f; break;
        default:
          v = (p.init == ParamInit::OutputNormal ? std_out : cfg_.init_method_std) *
              philox_normal(seed, 0, static_cast<uint64_t>(p.global_offset + global_element(p, i)));
      }
      host[static_cast<size_t>(p.offset + i)] = v;
    }
  }
  Tensor h = Tensor::from_vector(host, {params_.numel()}, cfg_.compute_dtype);
  params_.values().copy_from(h.to(device_));
}

Var GPT::embed(Tape& tape, const Tensor& tokens, const ForwardOptions& opt) {
  const TensorParallel& tp = mp_.tp;
  const ContextParallel& cp = mp_.cp;
  const int64_t B = tokens.dim(0), Tl = tokens.dim(1), N = B * Tl, T = Tl * cp.size;  // tokens: this rank's T/cp
  MPT_CHECK(!cfg_.learned_positions() || T <= cfg_.max_position_embeddings,
            str("sequence of ", T, " tokens exceeds --max-position-embeddings ", cfg_.max_position_embeddings), "");
  EmbedRows rows;
  rows.ids = tokens.to(device_).contiguous().view({N});
  const int64_t row0 = tp.first_row(N);
  for (int64_t i = 0; i < tp.local_rows(N); ++i)  // each row's position in the whole sequence
    rows.positions.push_back(cp.global_position((row0 + i) % Tl, T));
  if (cp.active())  // this rank's rows at their single-process rows (the dropout masks' offsets)
    for (const RowRun& r : activation_row_runs(B, Tl, tp, cp)) rows.dropout_rows.push_back({r.local, r.len, r.global});
  return hooked_use(tape, opt, {ParamRole::WordEmbedding, ParamRole::PositionEmbedding}, false,
                    [&](const std::function<void()>&) {
                      return embed_tokens(tape, cfg_, tp, params_, rows, opt.train ? cfg_.hidden_dropout : 0.0f,
                                          opt.dropout_seed);
                    });
}

namespace {
// How this call's self-attention runs (model/layers/attention_core.h): T5's stacks add their
// relative bias, context parallelism attends across its group, BERT masks its padding keys.
std::shared_ptr<const AttentionCore> call_core(const ModelParallel& mp, const ForwardOptions& opt,
                                               const StackInputs* stack) {
  if (stack && stack->attn_bias.defined())
    return std::make_shared<BiasedAttention>(stack->attn_bias, stack->attn_bias_grad, opt.kv_lengths);
  if (mp.cp.active()) return std::make_shared<ContextParallelAttention>();
  if (opt.kv_lengths.defined()) return std::make_shared<LocalAttention>(opt.kv_lengths);
  return nullptr;
}
}  // namespace

Var GPT::layers(Tape& tape, const ChunkInfo& ch, Var x, int64_t batch, int64_t seq, const ForwardOptions& opt,
                const StackInputs* stack) {
  // The masks' offsets count the single-process N·C elements (seq is T/cp with context parallelism).
  const uint64_t nc = static_cast<uint64_t>(batch * seq * mp_.cp.size * cfg_.hidden_size);
  const std::shared_ptr<const AttentionCore> core = call_core(mp_, opt, stack);
  for (size_t i = 0; i < blocks_.size(); ++i) {
    const int64_t l = block_layer_[i];
    if (l < ch.first_layer || l >= ch.end_layer) continue;
    if (stack && (l < stack->first_layer || l >= stack->end_layer)) continue;
    const bool recompute = opt.recompute && (opt.recompute_num_layers == 0 || l - ch.first_layer < opt.recompute_num_layers);
    x = run_block(tape, i, x, batch, seq, opt, core, recompute, stack, nc);
  }
  return x;
}

size_t GPT::block_index(int64_t layer) const {
  for (size_t i = 0; i < blocks_.size(); ++i)
    if (block_layer_[i] == layer) return i;
  MPT_THROW(str("layer ", layer, " is not on this rank"), "");
}

Var GPT::run_block(Tape& tape, size_t i, Var x, int64_t batch, int64_t seq, const ForwardOptions& opt,
                   const std::shared_ptr<const AttentionCore>& core, bool recompute, const StackInputs* stack,
                   uint64_t nc) {
  const int64_t l = block_layer_[i];
  const size_t first = block_first_param_[i], end = first + static_cast<size_t>(blocks_[i].count());
  if (opt.params_needed) opt.params_needed(first, end);
  std::function<void()> ready;
  if (opt.grads_ready) ready = [cb = opt.grads_ready, first, end] { cb(first, end); };
  std::function<void()> before;
  if (opt.params_needed_backward) before = [cb = opt.params_needed_backward, first, end] { cb(first, end); };
  BlockShape s = block_shape(cfg_, batch, seq, mp_.tp, opt.train, l, mp_.cp);
  s.core = core;
  s.moe.run = opt.moe;
  s.moe.ep = mp_.ep;
  uint64_t seed = opt.dropout_seed, offset = nc * (1 + 2 * static_cast<uint64_t>(l));
  if (stack) {
    s.cross = stack->cross;
    seed = stack->seed, offset = stack->offset(l), s.attention_offset = stack->attention_offset(l);
    if (s.cross.active()) s.cross.attention_offset = stack->cross_attention_offset(l);
  }
  return block(tape, s, blocks_[i], x, seed, offset, recompute, std::move(ready), std::move(before));
}

const Var& GPT::output_weight() const { return mpitron::output_weight(cfg_, params_); }

Var GPT::head_loss(Tape& tape, const Var& x, const Tensor& tokens, const Tensor& targets, const ForwardOptions& opt) {
  const TensorParallel& tp = mp_.tp;
  const Var h = final_norm(tape, cfg_, tp, params_, x);
  const Var logits = output_layer(tape, h, opt);
  const Var lm = lm_loss(tape, cfg_, tp, logits, targets);
  last_mtp_losses_.clear();
  if (cfg_.mtp_num_layers == 0 || !opt.train) return lm;  // evaluation: the main head's loss (as Megatron)
  last_lm_loss_ = lm.value().item();
  return ag::add(tape, lm, mtp_loss(tape, h, tokens, targets, opt));
}

Var GPT::output_layer(Tape& tape, const Var& h, const ForwardOptions& opt) const {
  const ParamRole w = cfg_.untie_embeddings ? ParamRole::OutputWeight : ParamRole::WordEmbedding;
  return hooked_use(tape, opt, {w}, true, [&](std::function<void()> between) {
    return lm_logits(tape, cfg_, mp_.tp, h, output_weight(), std::move(between));
  });
}

Var GPT::chunk_forward(Tape& tape, int c, const Tensor& tokens, const Tensor& targets, const Var& input,
                       const ForwardOptions& opt) {
  const ChunkInfo& ch = chunk(c);
  const int64_t B = tokens.dim(0), T = tokens.dim(1);
  MPT_CHECK(!cfg_.bert, "a BERT configuration runs in model/bert.h's Bert, not GPT::chunk_forward", "");
  MPT_CHECK(!cfg_.t5, "a T5 configuration runs in model/t5.h's T5, not GPT::chunk_forward", "");
  if (opt.params_needed)  // the hooked ones at each use
    for (const auto& [first, end] : unhooked_) opt.params_needed(first, end);
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
  return ch.last_stage ? head_loss(tape, x, tokens, targets, opt) : x;
}

Var GPT::forward(Tape& tape, const Tensor& tokens, const Tensor& targets, const ForwardOptions& opt) {
  MPT_CHECK(num_chunks() == 1 && chunk(0).first_stage && chunk(0).last_stage,
            "GPT::forward runs the whole model; with pipeline parallelism run chunk_forward per stage", "");
  return chunk_forward(tape, 0, tokens, targets, Var(), opt);
}

Tensor GPT::logits(const Tensor& tokens) {
  MPT_CHECK(mp_.tp.size == 1 && mp_.pp_size == 1 && mp_.cp.size == 1, "GPT::logits needs the whole model on one rank",
            "load the checkpoint into a single process (it loads under any layout)");
  Tape tape;
  tape.set_recording(false);
  ForwardOptions opt;
  opt.train = false;
  Var x = layers(tape, chunk(0), embed(tape, tokens, opt), tokens.dim(0), tokens.dim(1), opt);
  return lm_logits(tape, cfg_, mp_.tp, final_norm(tape, cfg_, mp_.tp, params_, x), output_weight()).value();
}

}  // namespace mpitron
