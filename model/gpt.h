// model/gpt.h — the decoder language model of every family (GPT-2, Llama, …), and the
// parameters, chunks and blocks the BERT model (model/bert.h) builds on.
//
//   x0 = embedding(tokens)                            (N, C), N = B·T  (model/layers/model_ends.h)
//   x_l+1 = block_l(x_l)                              l = 0 … L-1 (model/block.h)
//   logits = final_norm(x_L) · Woutᵀ                  (N, V); Wout = wte (tied) or head.weight
//   loss = mean cross-entropy(logits, targets)
// The parameters (names, shapes, order = the checkpoint's datasets, TP split,
// init, placement) come from the family's parameter table (model/param_table.h).
// The qkv rows are Q (NH heads), then K, then V (G heads each), heads contiguous.
//
// Model parallelism (ModelParallel): with tensor parallelism each rank holds
// its TP slice of the split parameters (model/tensor_parallel.h, ParamInfo::tp);
// with pipeline parallelism the layers are cut into pp · virtual_stages equal
// stages, stage s on pipeline rank s % pp as its local chunk s / pp (or where
// ModelParallel::chunk_stages puts them). The first
// stage holds wte and wpe, the last lnf and a copy of wte for the tied head
// (the two copies' gradients are summed over the embedding group).
#pragma once
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "autograd/tape.h"
#include "model/block.h"
#include "model/config.h"
#include "model/params.h"
#include "model/tensor_parallel.h"
#include "parallel/expert_parallel.h"

namespace mpitron {

class AttentionCore;

struct ForwardOptions {
  bool recompute = false;     // --recompute-activations: whole-block recompute
  int64_t recompute_num_layers = 0;  // with recompute, only the first N blocks of each chunk (0: all)
  uint64_t dropout_seed = 0;  // names every dropout mask of this micro-batch
  bool train = true;          // false: no dropout
  // Called during backward when the gradients of parameters [first, end) (indices
  // in ParamSet order) are final for this micro-batch: data parallelism starts
  // reducing their bucket while backward continues. Parameters never reported
  // (embeddings, final LN) are final when Tape::backward returns.
  std::function<void(size_t first, size_t end)> grads_ready;
  // Called before the forward reads parameters [first, end) (ParamSet order):
  // --overlap-param-gather's all-gathers are waited for here. A block's before it
  // runs; the parameters outside blocks (embeddings, final norm, heads) at the
  // start of a chunk's forward (GPT::need_params_outside_blocks).
  std::function<void(size_t first, size_t end)> params_needed;
  // Called before a block's backward (and its recompute) reads parameters [first, end):
  // ZeRO-3 gathers them again there. Also before a backward reads a hooked parameter outside
  // blocks (GPT::hooked_outside_params: the output layer's input gradient reads its matrix).
  std::function<void(size_t first, size_t end)> params_needed_backward;
  // The parameters outside blocks that a model hooks at each use (GPT::hooked_outside_params: the
  // word and position embeddings, the output matrix) report around every backward that adds to
  // their gradients: grads_needed before (the backward reads their values no more from there),
  // grads_added after. The tied word embedding reports each of its uses (the lookup, the head,
  // MTP's), each with its own pair. ZeRO-3 allocates, reduce-scatters and frees there; no other
  // strategy sets them (their gradients are final when Tape::backward returns).
  std::function<void(size_t first, size_t end)> grads_needed, grads_added;
  Tensor kv_lengths;  // BERT: (B) i32 on the device, keys j >= len[b] masked (BlockShape::kv_lengths)
  // The MoE layers' run settings, auxiliary-loss scale and statistics (model/layers/moe_shape.h);
  // null: no auxiliary losses, dropless, nothing recorded (evaluation).
  const MoeRun* moe = nullptr;
};

// What one stack of an encoder-decoder (model/t5.h) gives its blocks: which layers run, the
// stack's relative position bias, the decoder's cross-attention input, and its dropout streams.
// GPT and BERT run every layer of a chunk without one.
struct StackInputs {
  int64_t first_layer = 0, end_layer = 0;  // the stack's layers [first, end)
  Tensor attn_bias, attn_bias_grad;        // BlockShape::attn_bias / attn_bias_grad (undefined: none)
  CrossInput cross;                        // BlockShape::cross (decoder blocks)
  uint64_t seed = 0;                       // the stack's dropout key
  // Layer l's hidden-dropout offset, self-attention and cross-attention dropout streams.
  std::function<uint64_t(int64_t l)> offset, attention_offset, cross_attention_offset;
};

struct ModelParallel {
  TensorParallel tp;
  // Context parallelism: this rank holds T/cp tokens of every sequence (chunks r and
  // 2·cp − 1 − r, parallel/context_parallel.h); forward takes those (B, T/cp) tokens
  // and targets, attention runs across the cp group, positions and dropout masks
  // follow the global positions, and the loss is the mean over the local tokens
  // (its mean over the cp group is the whole sequence's).
  ContextParallel cp;
  // Expert parallelism: this rank holds experts [ep.first(E), … + E/ep) of every MoE layer, the
  // dense parameters as every ep rank (canonical on ep rank 0: counted and saved once).
  ExpertParallel ep;
  int pp_size = 1, pp_rank = 0;
  int virtual_stages = 1;  // model chunks per pipeline rank
  // The global stage of each local chunk (the pipeline schedule's placement, e.g.
  // V: rank r holds stages r and 2·pp − 1 − r). Empty: round-robin, chunk c is stage c·pp + pp_rank.
  std::vector<int> chunk_stages;
};

// One model chunk of this rank: layers [first_layer, end_layer) of global stage `stage`.
struct ChunkInfo {
  int stage = 0;
  int64_t first_layer = 0, end_layer = 0;
  bool first_stage = true, last_stage = true;  // holds the embeddings / the head and loss
};

class GPT {
 public:
  GPT(const GPTConfig& cfg, Device device, const ModelParallel& mp = {});

  const GPTConfig& config() const { return cfg_; }
  ParamSet& params() { return params_; }
  const ParamSet& params() const { return params_; }
  Device device() const { return device_; }
  const ModelParallel& parallel() const { return mp_; }
  int num_chunks() const { return static_cast<int>(chunks_.size()); }
  const ChunkInfo& chunk(int c) const { return chunks_[static_cast<size_t>(c)]; }
  // The activation one chunk passes to the next for a micro-batch of `batch`
  // samples: (B·T, C), or (B·T/t, C) with sequence parallelism, T/cp for T with
  // context parallelism; compute dtype.
  Shape activation_shape(int64_t batch) const;
  // The single-rank parameter list (name, global shape) in ParamSet order: the
  // names and shapes a checkpoint holds whatever the parallel layout.
  static std::vector<std::pair<std::string, Shape>> global_layout(const GPTConfig& cfg);

  // Megatron-style init from (seed): N(0, std) for matrices and embeddings,
  // std/sqrt(2L) for the two output projections of each block, zero biases,
  // LN weight 1 / bias 0. Uses Philox, so it is identical on every backend.
  void init_weights(uint64_t seed);

  // tokens: (B, T) i32 and targets (B, T) i32 on any device (targets < 0 ignored).
  // Returns the mean loss (1) f32; when the tape records, backward() fills the grads.
  // The whole model on this rank (pp == 1).
  Var forward(Tape& tape, const Tensor& tokens, const Tensor& targets, const ForwardOptions& opt);
  // Local chunk c of one micro-batch. The first stage embeds `tokens`; any other
  // takes `input` (the previous stage's activation, a leaf Var that requires
  // grad). The last stage returns the mean loss (1) f32 (it reads `targets`);
  // any other returns its output activation.
  Var chunk_forward(Tape& tape, int c, const Tensor& tokens, const Tensor& targets, const Var& input,
                    const ForwardOptions& opt);
  // Logits (B·T, V) in the compute dtype, no loss (evaluation / generation;
  // one rank only: tp == pp == 1).
  Tensor logits(const Tensor& tokens);
  // The LM head's matrix (V, C): wte when tied, head.weight with untied embeddings.
  const Var& output_weight() const;
  // Layer l's parameters, when this rank holds it.
  const BlockParams& block_params(int64_t layer) const;
  BlockParams& block_params(int64_t layer);
  // Aux-loss-free balancing (--moe-router-enable-expert-bias): every MoE block of this rank
  // gets a zero (E) f32 expert bias (BlockParams::expert_bias). Then after each step
  // update_expert_bias() moves layer l's bias by rate · sign(mean − count_e) (Megatron-Core's
  // get_updated_expert_bias), counts: (E) choices per expert of layer l summed over every
  // data-parallel rank and micro-batch of the step, for each MoE layer this rank holds.
  void enable_expert_bias();
  bool has_expert_bias() const { return expert_bias_; }  // enable_expert_bias() was called (every rank)
  bool holds_layer(int64_t layer) const;
  void update_expert_bias(const std::map<int64_t, std::vector<double>>& counts, double rate);
  // The MoE layers this rank holds a bias for, in order (empty: none).
  std::vector<int64_t> expert_bias_layers() const;
  // The blocks of chunk ch on x (the chunk's input activation); model/bert.cpp uses it.
  // With `stack` (T5's encoder or decoder): only its layers, with its inputs.
  Var layers(Tape& tape, const ChunkInfo& ch, Var x, int64_t batch, int64_t seq, const ForwardOptions& opt,
             const StackInputs* stack = nullptr);
  // opt.params_needed for every parameter outside the blocks (BERT's and T5's forwards call it
  // first; GPT's chunk forward for those outside hooked_outside_params()).
  void need_params_outside_blocks(const ForwardOptions& opt) const;
  // The parameters outside blocks (ParamSet indices, ascending) whose every use calls the
  // ForwardOptions hooks just in time: params_needed before the forward reads them, and in
  // backward params_needed_backward (when it reads them), grads_needed and grads_added: the word
  // and position embeddings and the untied output matrix of a decoder (empty for BERT and T5,
  // whose forwards take everything outside blocks at their start).
  const std::vector<size_t>& hooked_outside_params() const { return hooked_; }
  // The MTP losses of the last training forward on this rank's last stage (mtp_k, k = 1 … D; empty:
  // none): what Megatron logs as "mtp_k loss".
  const std::vector<double>& last_mtp_losses() const { return last_mtp_losses_; }
  double last_lm_loss() const { return last_lm_loss_; }  // the main head's loss of that forward

 private:
  Var embed(Tape& tape, const Tensor& tokens, const ForwardOptions& opt);
  // The last stage: the final norm, the output layer and the loss, plus the MTP losses when training.
  Var head_loss(Tape& tape, const Var& x, const Tensor& tokens, const Tensor& targets, const ForwardOptions& opt);
  // logits (N, V/t) of the final-normed h: lm_logits with the output matrix's hooks (hooked_use).
  Var output_layer(Tape& tape, const Var& h, const ForwardOptions& opt) const;
  // (λ/D)·Σ_k mtp_k over the MTP depths (model/gpt_mtp.cpp); h: the main final norm's output.
  Var mtp_loss(Tape& tape, const Var& h, const Tensor& tokens, const Tensor& targets, const ForwardOptions& opt);
  // Block i of this rank (blocks_ order) on x; nc: the single-process N·C of the call (dropout offsets).
  Var run_block(Tape& tape, size_t i, Var x, int64_t batch, int64_t seq, const ForwardOptions& opt,
                const std::shared_ptr<const AttentionCore>& core, bool recompute, const StackInputs* stack,
                uint64_t nc);
  size_t block_index(int64_t layer) const;  // layer's place in blocks_ (throws when not on this rank)

  GPTConfig cfg_;
  Device device_;
  ModelParallel mp_;
  ParamSet params_;
  std::vector<ChunkInfo> chunks_;
  std::vector<BlockParams> blocks_;          // indexed by layer − first layer of this rank's chunks
  std::vector<size_t> block_first_param_;    // ParamSet index of each block's first parameter
  std::vector<int64_t> block_layer_;         // the global layer of each block
  std::vector<std::pair<size_t, size_t>> outside_blocks_;  // ParamSet index ranges of no block
  std::vector<size_t> hooked_;                             // hooked_outside_params()
  std::vector<std::pair<size_t, size_t>> unhooked_;        // outside_blocks_ less hooked_
  // A use of hooked parameters `roles` by the nodes `use` records (model/gpt.cpp): the forward's
  // and, when the tape records, the backward's hooks around it. reads_values: its backward
  // reads them (the output layer: `use` passes its argument to lm_logits as `between`).
  Var hooked_use(Tape& tape, const ForwardOptions& opt, std::initializer_list<ParamRole> roles, bool reads_values,
                 const std::function<Var(std::function<void()>)>& use) const;
  bool expert_bias_ = false;
  std::vector<double> last_mtp_losses_;
  double last_lm_loss_ = 0;
};

// Multi-token prediction at inference (speculative decoding's draft, model/inference/model_runner.h):
// depth 1's final-normed output (n, C) for rows whose main final-normed hidden state is h (n, C) and whose
// next token's embedding is e (n, C); `block` runs the MTP block (over its KV cache). GEMMs in tiles of
// `tile` rows.
Tensor mtp_decode_hidden(const GPT& model, const Tensor& e, const Tensor& h,
                         const std::function<Tensor(const Tensor&)>& block, int64_t tile);

}  // namespace mpitron
