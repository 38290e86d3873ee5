// model/inference/generate.h — autoregressive generation with a KV cache, and sampling.
//
// Decoding never recomputes the prefix: the prompt of each sequence runs once
// through the training block (model/block.h, block_forward without dropout) and
// every layer's (rotated) keys and values are written into
//   k_cache[l], v_cache[l]: (B, G, Tmax, HD)   (G query groups; compute dtype, model device)
// and then every new token runs alone through the same block_forward with a
// decode AttentionCore: its q/k/v come from one row of the qkv projection
// (rotated at its own position with rope), its k/v are appended at the sequence's
// position, and its query heads attend over positions [0, pos] of their group's
// cache (no mask needed: the cache holds only the past).
//
// Prompts of different lengths: each prompt is prefilled on its own (B = 1,
// T = its length, causal attention_forward), then the decode steps run every
// unfinished sequence as one batch of rows, each row with its own position.
// No padding anywhere, so a sequence's tokens do not depend on the others in
// the batch (only its Philox stream index does, see below).
//
// Attention with the cache, per device:
//   CPU, f32: a direct loop per (row, head) over the contiguous (Tmax, HD)
//     block of the head's group cache (OpenMP over rows × heads);
//   anything else (CUDA, or bf16/f16): tensor ops only — per row and group, the
//     group's query heads (r, HD) · cached keys (L, HD)ᵀ, softmax_forward, and a
//     second gemm with the values. Device-agnostic; the
//     tests run it on the CPU (force_ops_attention) against the loop. Not yet
//     run on a GPU.
//
// Sampling (per sequence, on the host, over the first vocab_size logits: the
// padded vocabulary rows are never sampled):
//   greedy (also when top_k == 1 or temperature == 0): argmax, ties → lowest id;
//   otherwise logits / temperature, then top-k (keep the k largest), then top-p
//   (Megatron's rule: sort descending, keep token i when the cumulative
//   probability of the tokens before it is <= top_p; the first is always kept),
//   then one uniform u = philox_uniform(seed, b, step) (b = index of the
//   sequence in the batch, step = index of the new token) picks the token by
//   inverse CDF in descending-probability order. Same seed → same tokens.
// Stop: at EOD (when stop_at_eod; the EOD token is kept in the output) or
// after max_new_tokens, or at max_position_embeddings total tokens.
// An empty prompt means an unconditional sample: the context is [EOD].
#pragma once
#include <cstdint>
#include <vector>

#include "model/gpt.h"

namespace mpitron {

struct SamplingParams {
  bool greedy = false;       // argmax decoding (also implied by top_k == 1 or temperature == 0)
  float temperature = 1.0f;  // divides the logits before top-k/top-p; > 0 (0 means greedy)
  int64_t top_k = 0;         // keep only the k most likely tokens; 0: no limit
  float top_p = 0.0f;        // nucleus sampling threshold in (0, 1]; 0: off
  uint64_t seed = 1234;      // Philox key of every draw
  bool is_greedy() const { return greedy || top_k == 1 || temperature == 0.0f; }
  void validate() const;     // throws naming the bad value
};

struct GenerateOptions {
  int64_t max_new_tokens = 64;  // tokens generated per sequence at most
  bool stop_at_eod = true;      // end a sequence when it produces eod
  int32_t eod = 50256;          // GPT-2 <|endoftext|>
  SamplingParams sampling;
  bool force_ops_attention = false;  // tests: use the tensor-ops cache attention on the CPU too
};

struct GenerateOutput {
  std::vector<std::vector<int32_t>> tokens;     // [b] context (prompt, or [eod]) followed by the new tokens
  std::vector<std::vector<int32_t>> generated;  // [b] the new tokens only
  std::vector<std::vector<float>> logprobs;     // [b][i] log-softmax of the raw logits at generated[b][i]
  std::vector<int64_t> prompt_lengths;          // [b] length of the context
};

// Incremental inference over a fixed batch of sequences (the KV cache owner).
class KVCacheDecoder {
 public:
  // batch sequences, each at most max_len tokens (<= max_position_embeddings).
  KVCacheDecoder(GPT& model, int64_t batch, int64_t max_len, bool force_ops_attention = false);

  // Runs sequence b's prompt (1 <= length <= max_len), filling its cache from
  // position 0. Returns the logits of its last position, (vocab_size) on the host.
  std::vector<float> prefill(int64_t b, const std::vector<int32_t>& prompt);
  // Appends tokens[i] to sequence rows[i] (each row at most once) and returns
  // each row's next-token logits, rows.size() × vocab_size on the host (row-major).
  std::vector<float> step(const std::vector<int64_t>& rows, const std::vector<int32_t>& tokens);

  int64_t length(int64_t b) const { return len_[static_cast<size_t>(b)]; }
  int64_t max_len() const { return tmax_; }
  int64_t vocab_size() const { return model_.config().vocab_size; }

 private:
  // x (n, C) → final hidden states (n, C) of the new rows; writes their k/v at positions pos[i].
  Tensor run_layers(Tensor x, const std::vector<int64_t>& rows, const std::vector<int64_t>& pos, bool prefill);
  std::vector<float> head_logits(const Tensor& h);  // (n, C) → n × vocab_size host
  Tensor embed(const std::vector<int64_t>& ids, const std::vector<int64_t>& pos);  // (n, C)
  class DecodeCore;
  // Each row's query heads over its sequence's cached keys s.first_key(pos) … pos.
  void cached_attention(const BlockShape& s, const Tensor& qkv, const Tensor& att, int64_t layer,
                        const std::vector<int64_t>& rows, const std::vector<int64_t>& pos);

  GPT& model_;
  int64_t batch_, tmax_;
  bool force_ops_;
  std::vector<int64_t> len_;
  std::vector<Tensor> k_cache_, v_cache_;  // [layer] (B, G, Tmax, HD): G query groups (G = NH without grouping)
};

// Samples one token from logits (n = vocab entries) with p; draw index (stream, step).
// logprob (optional): log-softmax of the raw logits at the chosen token.
int32_t sample_token(const float* logits, int64_t n, const SamplingParams& p, uint64_t stream, uint64_t step,
                     float* logprob = nullptr);

// Generates for every prompt with the KV cache (see top of file).
GenerateOutput generate(GPT& model, const std::vector<std::vector<int32_t>>& prompts, const GenerateOptions& o);

// Reference: greedy tokens by full recomputation (GPT::logits over the whole
// sequence for every new token). Same stopping rules. Returns the new tokens.
std::vector<int32_t> generate_full_recompute(GPT& model, const std::vector<int32_t>& prompt, int64_t max_new_tokens,
                                             int32_t eod = 50256, bool stop_at_eod = true);

}  // namespace mpitron
