// model/inference/generate.h — autoregressive generation with a KV cache, and sampling.
//
// Decoding never recomputes the prefix, and runs on THE decoder of every caller
// (model/inference/paged_kv_cache.h's paged_layers: the training block with a
// PagedAttentionCore over the paged KV cache), as the serving engine does. A
// DecodeSession is one rank's bookkeeping over it: each sequence owns the cache
// blocks of positions [0, max_len); a prompt runs through once (prefill), then
// every new token runs alone (a row at its own position) with the cache.
// Rows are cut into tiles of kRowTile rows, so a sequence's tokens do not depend
// on the others in the batch (only its Philox stream index does, see below).
#pragma once
#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "model/gpt.h"
#include "model/inference/paged_kv_cache.h"

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

// Incremental inference over a fixed batch of sequences on one rank (the whole model, tp = pp = 1).
class DecodeSession {
 public:
  // batch sequences, each at most max_len tokens (<= max_position_embeddings).
  DecodeSession(const GPT& model, int64_t batch, int64_t max_len, bool force_ops_attention = false);
  ~DecodeSession();

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
  // Feeds ids at rows (their positions and sequences) and returns the logits of `wanted` rows.
  std::vector<float> run(const std::vector<int32_t>& ids, const PagedRows& rows, const std::vector<int64_t>& wanted);

  const GPT& model_;
  int64_t batch_, tmax_;
  bool force_ops_;
  std::vector<int64_t> len_;
  std::unique_ptr<PagedKVCache> kv_;
  std::vector<std::vector<int32_t>> tables_;  // [b] the blocks of positions [0, tmax)
};

// Samples one token from logits (n = vocab entries) with p; draw index (stream, step).
// logprob (optional): log-softmax of the raw logits at the chosen token.
int32_t sample_token(const float* logits, int64_t n, const SamplingParams& p, uint64_t stream, uint64_t step,
                     float* logprob = nullptr);

// The n most likely tokens of a row of logits (V entries) with their log-softmax, most likely first
// (ties: the lower id); what a request's top_logprobs reports at each step.
using TopLogprobs = std::vector<std::pair<int32_t, float>>;  // (token, log-probability)
TopLogprobs top_logprobs(const float* logits, int64_t V, int64_t n);

// Generates for every prompt with the KV cache (see top of file).
GenerateOutput generate(GPT& model, const std::vector<std::vector<int32_t>>& prompts, const GenerateOptions& o);

// Reference: greedy tokens by full recomputation (GPT::logits over the whole
// sequence for every new token). Same stopping rules. Returns the new tokens.
std::vector<int32_t> generate_full_recompute(GPT& model, const std::vector<int32_t>& prompt, int64_t max_new_tokens,
                                             int32_t eod = 50256, bool stop_at_eod = true);

}  // namespace mpitron
