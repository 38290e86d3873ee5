// model/inference/dynamic_engine.h — continuous batching over the paged KV cache
// (Megatron-Core's DynamicInferenceEngine, with its flag names).
//
// Requests arrive at any time (submit(), any thread). Each step() (the engine's
// thread: the driver rank's main thread) builds ONE forward of the model out
// of many requests: decode tokens of the running ones and prompt tokens
// (whole prompts, or chunks of them with --enable-chunked-prefill) of running
// and newly admitted ones, then samples the next token of every request whose
// known tokens are now all in the cache.
//
// Admission and the two limits:
//   * tokens per step  (--inference-dynamic-batching-max-tokens): rows of one
//     forward. Decode tokens first (oldest request first), then prompts. A
//     prompt longer than what is left runs in chunks with chunked prefill;
//     without it, whole, as the only prompt of its step (the step may then
//     exceed the budget by that prompt: it is never refused or cut).
//   * requests in flight (--inference-dynamic-batching-max-requests) and KV
//     blocks (--inference-dynamic-batching-buffer-size-gb / -block-size): a
//     request is admitted when its first prompt tokens' blocks are free and no
//     running request is paused.
// Out of blocks: a running request that needs one more block when none is
// free is PAUSED (keeps its blocks, skips steps) and resumes, oldest first, as
// finished requests free theirs. If every running request is paused the
// newest is EVICTED: its blocks are freed and its tokens (prompt and
// everything generated) are recomputed when blocks allow, which gives the same
// cache. Nothing is failed or cut: a request ends at <|endoftext|> (when asked),
// after max_new_tokens, or at max_position_embeddings (finish reason "length").
// The pool holds at least one max_position_embeddings sequence, so one request
// alone always completes.
//
// Prefix caching (EngineConfig::prefix_caching, block_sharing.h): a request without blocks first
// shares the cached full blocks its tokens start with and computes only the rest.
//
// Batch invariance: a request's logits are computed by row-independent numerics
// (model_runner.h: tiles and per-row attention) and its draws by
// philox(seed, stream, step) where step counts ITS generated tokens; so its
// tokens are those it gets alone, whatever else is batched, paused or evicted.
#pragma once
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "model/inference/block_sharing.h"
#include "model/inference/generate.h"
#include "model/inference/kv_block_allocator.h"
#include "model/inference/model_runner.h"
#include "model/inference/prefix_cache.h"

namespace mpitron {

struct EngineConfig {
  int64_t max_requests = 64;     // --inference-dynamic-batching-max-requests: requests in flight
  int64_t max_tokens = 512;      // --inference-dynamic-batching-max-tokens: tokens (rows) per step
  bool chunked_prefill = false;  // --enable-chunked-prefill: split prompts over steps
  // --num-speculative-tokens k (Megatron-Core's): with an MTP model, each greedy request's next-but-one
  // token is drafted by the MTP layer and verified in the next step beside its next token (two rows):
  // when the model's own choice equals the draft, both are kept (two tokens from one step). The
  // output is exactly plain greedy decoding's; sampled requests decode plainly. k = 1 is built.
  int64_t num_speculative_tokens = 0;
  // --inference-dynamic-batching-prefix-caching (and its -eviction-policy): a request whose prompt
  // starts with full KV blocks another request computed shares them and computes only the rest
  // (always its last prompt token, whose logits it needs). Not with speculative decoding.
  PrefixCacheOptions prefix_caching;
};

struct GenRequest {
  std::vector<int32_t> prompt;  // token ids; empty: an unconditional sample, the context is [eod]
  int64_t max_new_tokens = 64;  // tokens generated at most
  bool stop_at_eod = true;      // end at eod (kept as the last generated token)
  int32_t eod = 50256;
  SamplingParams sampling;      // greedy, temperature, top-k, top-p, seed
  uint64_t stream = 0;          // Philox stream of its draws: philox(sampling.seed, stream, step)
  int64_t top_logprobs = 0;     // also report the log-probabilities of the n most likely tokens per step
};


struct TokenEvent {
  int32_t token = 0;
  float logprob = 0;  // log-softmax of the raw logits at token
  TopLogprobs top;    // when GenRequest::top_logprobs > 0
};

struct GenResult {
  std::vector<int32_t> context;    // the prompt (or [eod])
  std::vector<int32_t> generated;  // the new tokens
  std::vector<float> logprobs;     // [i] of generated[i]
  std::vector<TopLogprobs> top;    // [i] when asked
  std::string finish_reason;       // "stop" (eod), "length" (max_new_tokens or max positions), "cancelled"
};

// What a submitter holds: the request's progress, written by the engine thread.
class RequestState {
 public:
  // Any thread: ask the engine to drop it (its blocks are freed at the next step).
  void cancel() { cancelled_ = true; }
  bool cancelled() const { return cancelled_; }
  // Blocks until finished or `timeout` (seconds) passes; true when finished.
  bool wait(double timeout_s);
  bool finished() const;
  // Moves the tokens produced since the last call into `out`; waits up to timeout_s
  // for one when none is there. Returns false once finished and drained.
  bool next_events(std::vector<TokenEvent>& out, double timeout_s);
  GenResult result() const;  // the whole result (call after finished)

  // Engine side.
  void push(const TokenEvent& e);
  void finish(GenResult r);

 private:
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<TokenEvent> events_;
  GenResult result_;
  bool finished_ = false;
  std::atomic<bool> cancelled_{false};
};

struct EngineStats {
  int64_t steps = 0, rows = 0, prefill_tokens = 0, decode_tokens = 0, generated = 0;
  int64_t requests_done = 0, cancelled = 0, max_running = 0;
  int64_t pauses = 0, resumes = 0, evictions = 0, recomputed_tokens = 0;
  int64_t kv_blocks = 0, kv_block_bytes = 0, peak_blocks = 0;
  int64_t drafted = 0, accepted = 0, draft_steps = 0;  // speculative decoding: drafts verified, kept
  int64_t running = 0, waiting = 0, kv_blocks_used = 0;  // now: requests admitted / queued, blocks held
  // Prefix caching (EngineConfig::prefix_caching), counted in KV blocks:
  int64_t prefix_cache_queries = 0;         // full prompt blocks looked up (at admission, and again after an eviction)
  int64_t prefix_cache_hits = 0;            // of them found cached: their keys and values reused, not computed
  int64_t prefix_cache_tokens_saved = 0;    // prompt positions not computed: hits x block size
  int64_t prefix_cache_blocks_saved = 0;    // now: block references beyond the first (blocks sharing spares)
  int64_t prefix_cache_blocks_saved_peak = 0;  // the most blocks_saved at once since the engine started
  int64_t prefix_cache_blocks_resident = 0; // now: blocks cached (held by a request or, with lru, kept unheld)
  int64_t prefix_cache_evictions = 0;       // cached blocks taken back for other use (lru)
  int64_t prefix_cache_deferred = 0;        // admissions put off a step to share a block that step computes
  std::string prefix_cache_policy;          // "ref_zero" / "lru"; empty: prefix caching off
  std::string line() const;  // one log line
};

class DynamicEngine {
 public:
  // On the driver, after runner.init_kv_cache (on every rank).
  DynamicEngine(ModelRunner& runner, const EngineConfig& cfg);
  ~DynamicEngine();
  DynamicEngine(const DynamicEngine&) = delete;
  DynamicEngine& operator=(const DynamicEngine&) = delete;

  // Any thread. Throws Error naming the problem (token ids, lengths); never blocks on the model.
  std::shared_ptr<RequestState> submit(GenRequest r);
  // Engine thread: one forward over the cache and its samples. False when there was nothing to do.
  bool step();
  // Engine thread: sleeps until a request arrives or timeout_s passes.
  void wait_for_work(double timeout_s);
  bool has_work() const;
  EngineStats stats() const;

  // Single-threaded use (generate_text, tests): submit all, step until all are done; results in order.
  std::vector<GenResult> run(const std::vector<GenRequest>& requests);

 private:
  struct Seq;
  bool schedule(Seq& s, bool running, StepPlan& plan, int64_t& budget, bool& prefill_in_step,
                std::vector<Seq*>& sample);
  bool place(Seq& s, bool running, StepPlan& plan, int64_t& budget, bool& prefill_in_step, std::vector<Seq*>& sample);
  void evict(Seq& s);
  void finish(Seq& s, const std::string& reason);
  void drop_cancelled();
  // Speculative decoding: after a step, the MTP draft of every greedy request that was fed (its rows
  // from `first_row` of the last plan), one more collective forward of the last stage.
  void draft();

  ModelRunner& runner_;
  EngineConfig cfg_;
  KVBlockAllocator blocks_;
  int64_t block_size_;
  std::vector<std::unique_ptr<Seq>> running_;  // admission order
  std::deque<std::unique_ptr<Seq>> waiting_;
  uint64_t admitted_ = 0;
  EngineStats stats_;
  std::unique_ptr<BlockSharing> sharing_;  // prefix caching, or none (block_sharing.h)

  mutable std::mutex in_mu_;  // guards incoming_ (submit() from other threads)
  std::condition_variable in_cv_;
  std::deque<std::unique_ptr<Seq>> incoming_;
  std::atomic<int64_t> pending_{0};  // requests submitted and not yet finished
};

}  // namespace mpitron
