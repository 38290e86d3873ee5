#include "model/inference/dynamic_engine.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "core/error.h"

namespace mpitron {

// ---------------------------------------------------------------------------
// RequestState

bool RequestState::wait(double timeout_s) {
  std::unique_lock<std::mutex> lk(mu_);
  return cv_.wait_for(lk, std::chrono::duration<double>(timeout_s), [&] { return finished_; });
}

bool RequestState::finished() const {
  std::lock_guard<std::mutex> lk(mu_);
  return finished_;
}

bool RequestState::next_events(std::vector<TokenEvent>& out, double timeout_s) {
  std::unique_lock<std::mutex> lk(mu_);
  cv_.wait_for(lk, std::chrono::duration<double>(timeout_s), [&] { return finished_ || !events_.empty(); });
  while (!events_.empty()) {
    out.push_back(std::move(events_.front()));
    events_.pop_front();
  }
  return !(finished_ && events_.empty() && out.empty());
}

GenResult RequestState::result() const {
  std::lock_guard<std::mutex> lk(mu_);
  return result_;
}

void RequestState::push(const TokenEvent& e) {
  {
    std::lock_guard<std::mutex> lk(mu_);
    events_.push_back(e);
  }
  cv_.notify_all();
}

void RequestState::finish(GenResult r) {
  {
    std::lock_guard<std::mutex> lk(mu_);
    result_ = std::move(r);
    finished_ = true;
  }
  cv_.notify_all();
}

std::string EngineStats::line() const {
  return str("engine: ", steps, " steps, ", rows, " rows (", prefill_tokens, " prompt, ", decode_tokens, " decode), ",
             generated, " tokens generated, ", requests_done, " requests done (", cancelled, " cancelled), at most ", max_running,
             " running; KV blocks: peak ", peak_blocks, " of ", kv_blocks, " (", peak_blocks * kv_block_bytes,
             " of ", kv_blocks * kv_block_bytes, " bytes per rank); pauses ", pauses, ", resumes ", resumes,
             ", evictions ", evictions, " (", recomputed_tokens, " tokens recomputed)",
             drafted > 0 || draft_steps > 0
                 ? str("; speculative: ", accepted, " of ", drafted, " MTP drafts accepted (",
                       drafted > 0 ? 100.0 * static_cast<double>(accepted) / static_cast<double>(drafted) : 0.0,
                       "%), ", draft_steps, " draft steps")
                 : std::string(),
             prefix_cache_policy.empty()
                 ? std::string()
                 : str("; prefix cache (", prefix_cache_policy, "): ", prefix_cache_hits, " of ", prefix_cache_queries,
                       " prompt blocks hit (",
                       prefix_cache_queries > 0
                           ? 100.0 * static_cast<double>(prefix_cache_hits) / static_cast<double>(prefix_cache_queries)
                           : 0.0,
                       "%), ", prefix_cache_tokens_saved, " prompt tokens not computed, blocks saved by sharing ",
                       prefix_cache_blocks_saved, " now (peak ", prefix_cache_blocks_saved_peak, "), ",
                       prefix_cache_blocks_resident, " cached, ",
                       prefix_cache_evictions, " evicted, ", prefix_cache_deferred, " admissions deferred"));
}

// ---------------------------------------------------------------------------
// The engine

struct DynamicEngine::Seq {
  std::shared_ptr<RequestState> state;
  GenRequest req;
  GenResult out;
  std::vector<int32_t> tokens;  // context + generated: every token known so far
  int64_t cached = 0;           // positions [0, cached) are in the KV cache
  int64_t limit = 0;            // tokens.size() may reach this: min(context + max_new_tokens, max positions)
  std::vector<int32_t> table;   // its KV blocks
  SharingState shared;          // what block sharing (prefix caching) knows of it
  bool paused = false;
  bool sampled = false;         // got a new token in the current step
  int64_t evicted_at = -1;      // tokens cached when it was evicted (they are recomputed)
  // Speculative decoding (greedy requests with --num-speculative-tokens):
  bool spec = false;
  int32_t draft = -1;           // the MTP's guess of token cached + 1 (−1: none)
  bool drafting = false;        // this step feeds [token cached, draft] and verifies the draft
  int64_t fed_row = -1, fed_pos = -1;  // this step's first row in the plan and its position (−1: not fed)
};

DynamicEngine::DynamicEngine(ModelRunner& runner, const EngineConfig& cfg)
    : runner_(runner), cfg_(cfg),
      blocks_(runner.has_kv_cache() ? runner.kv_cache().num_blocks() : 1, cfg.prefix_caching.eviction),
      block_size_(runner.has_kv_cache() ? runner.kv_cache().block_size() : 1),
      sharing_(make_block_sharing(cfg.prefix_caching, blocks_, block_size_)) {
  MPT_CHECK(runner.is_driver() && runner.has_kv_cache(), "DynamicEngine runs on the driver rank after init_kv_cache",
            "");
  MPT_CHECK(cfg.max_requests >= 1,
            str("--inference-dynamic-batching-max-requests must be >= 1, got ", cfg.max_requests), "");
  MPT_CHECK(cfg.max_tokens >= 1, str("--inference-dynamic-batching-max-tokens must be >= 1, got ", cfg.max_tokens), "");
  const int64_t P = runner.config().max_position_embeddings, need = blocks_for(P, block_size_);
  MPT_CHECK(blocks_.total() >= need,
            str("the KV cache holds ", blocks_.total(), " blocks of ", block_size_, " positions; one sequence of "
                "max_position_embeddings = ", P, " needs ", need),
            "raise --inference-dynamic-batching-buffer-size-gb (or lower --inference-dynamic-batching-block-size)");
  stats_.kv_blocks = blocks_.total();
  stats_.kv_block_bytes = runner.kv_bytes_per_block(block_size_);
  MPT_CHECK(cfg.num_speculative_tokens >= 0 && cfg.num_speculative_tokens <= runner.config().mtp_num_layers,
            str("--num-speculative-tokens ", cfg.num_speculative_tokens, " with a model of ",
                runner.config().mtp_num_layers, " MTP layers: the drafts come from the MTP layers"),
            "give at most the model's --mtp-num-layers (a model trained without MTP has none)");
  MPT_CHECK(!(cfg.prefix_caching.enabled && cfg.num_speculative_tokens > 0),
            "--inference-dynamic-batching-prefix-caching with --num-speculative-tokens is not built: the MTP layer's "
            "cache at a block's last position holds the next block's first token, so its blocks are not a function "
            "of their prefix",
            "drop one of the two");
  MPT_CHECK(!(cfg.prefix_caching.enabled && runner.config().rope_scaling.type == RopeScalingType::Dynamic),
            "--inference-dynamic-batching-prefix-caching with dynamic NTK rope scaling (rope_type \"dynamic\") is "
            "refused: a cached key's rotation depends on the length of the step that computed it, so a shared block "
            "would differ from the one the request computes alone",
            "serve this model without prefix caching");
  stats_.prefix_cache_policy = sharing_->name();
  MPT_CHECK(cfg.num_speculative_tokens <= 1,
            str("--num-speculative-tokens ", cfg.num_speculative_tokens, " is not built (one drafted token per step is)"),
            "use --num-speculative-tokens 1");
}

DynamicEngine::~DynamicEngine() = default;

std::shared_ptr<RequestState> DynamicEngine::submit(GenRequest r) {
  const GPTConfig& c = runner_.config();
  const int64_t P = c.max_position_embeddings, V = c.vocab_size;
  MPT_CHECK(r.eod >= 0 && r.eod < V, str("end-of-document id ", r.eod, " outside the vocabulary [0, ", V, ")"), "");
  MPT_CHECK(r.max_new_tokens >= 0, str("max_new_tokens must be >= 0, got ", r.max_new_tokens), "");
  MPT_CHECK(r.top_logprobs >= 0 && r.top_logprobs <= V, str("top_logprobs must be in [0, ", V, "], got ", r.top_logprobs),
            "");
  r.sampling.validate();
  auto s = std::make_unique<Seq>();
  s->state = std::make_shared<RequestState>();
  s->tokens = r.prompt.empty() ? std::vector<int32_t>{r.eod} : r.prompt;
  const int64_t T = static_cast<int64_t>(s->tokens.size());
  for (int32_t t : s->tokens)
    MPT_CHECK(t >= 0 && t < V, str("the prompt holds token id ", t, " outside the vocabulary [0, ", V, ")"), "");
  MPT_CHECK(T < P || r.max_new_tokens == 0,
            str("the prompt has ", T, " tokens; the model's max_position_embeddings is ", P,
                " and one position is needed per new token"),
            "shorten the prompt");
  s->limit = std::min(T + r.max_new_tokens, P);
  s->spec = cfg_.num_speculative_tokens > 0 && r.sampling.greedy;
  s->out.context = s->tokens;
  s->req = std::move(r);
  auto state = s->state;
  if (s->req.max_new_tokens == 0) {  // nothing to run
    s->out.finish_reason = "length";
    state->finish(s->out);
    return state;
  }
  {
    std::lock_guard<std::mutex> lk(in_mu_);
    incoming_.push_back(std::move(s));
    ++pending_;
  }
  in_cv_.notify_all();
  return state;
}

bool DynamicEngine::has_work() const { return pending_.load() > 0; }

void DynamicEngine::wait_for_work(double timeout_s) {
  std::unique_lock<std::mutex> lk(in_mu_);
  in_cv_.wait_for(lk, std::chrono::duration<double>(timeout_s), [&] { return pending_.load() > 0; });
}

EngineStats DynamicEngine::stats() const {
  EngineStats s = stats_;
  s.peak_blocks = blocks_.peak_used();
  s.prefix_cache_blocks_saved = blocks_.shared_references();
  s.prefix_cache_blocks_saved_peak = blocks_.peak_shared_references();
  s.prefix_cache_blocks_resident = blocks_.cached_blocks();
  s.prefix_cache_evictions = blocks_.evicted_blocks();
  const SharingCounters n = sharing_->counters();
  s.prefix_cache_queries = n.queries;
  s.prefix_cache_hits = n.hits;
  s.prefix_cache_tokens_saved = n.tokens_saved;
  s.prefix_cache_deferred = n.deferred;
  s.running = static_cast<int64_t>(running_.size());
  s.waiting = std::max<int64_t>(0, pending_.load() - s.running);  // queued, submitted but not admitted
  s.kv_blocks_used = blocks_.used();
  return s;
}

void DynamicEngine::finish(Seq& s, const std::string& reason) {
  blocks_.release(s.table);
  s.out.finish_reason = reason;
  s.state->finish(s.out);
  ++stats_.requests_done;
  --pending_;
}

void DynamicEngine::evict(Seq& s) {
  blocks_.release(s.table);
  s.draft = -1;  // its MTP cache goes with the blocks
  ++stats_.evictions;
  s.evicted_at = s.cached;
  s.cached = 0;
  sharing_->dropped(s.shared);
  s.paused = false;
}

void DynamicEngine::drop_cancelled() {
  const auto gone = [&](std::unique_ptr<Seq>& s) {
    if (!s->state->cancelled()) return false;
    finish(*s, "cancelled");
    ++stats_.cancelled;
    return true;
  };
  running_.erase(std::remove_if(running_.begin(), running_.end(), gone), running_.end());
  waiting_.erase(std::remove_if(waiting_.begin(), waiting_.end(), gone), waiting_.end());
}

// Adds s's next tokens to the plan when the budget and the blocks allow. A sequence without blocks
// first claims the blocks it shares (prefix caching) and gives them back if it does not get in.
bool DynamicEngine::schedule(Seq& s, bool running, StepPlan& plan, int64_t& budget, bool& prefill_in_step,
                             std::vector<Seq*>& sample) {
  if (budget <= 0) return false;
  const bool fresh = s.table.empty();
  if (fresh && !sharing_->claim(s.shared, s.tokens, s.table, s.cached)) return false;
  const int64_t from = s.cached;
  if (place(s, running, plan, budget, prefill_in_step, sample)) {
    sharing_->placed(s.shared, s.tokens, from, s.cached, fresh);
    return true;
  }
  if (fresh) sharing_->unclaim(s.shared, s.table, s.cached);
  return false;
}

// s's next rows (a prompt chunk, a recompute, a decode token, a decode token and its draft). Counts
// a pause when a running request cannot get the block it needs.
bool DynamicEngine::place(Seq& s, bool running, StepPlan& plan, int64_t& budget, bool& prefill_in_step,
                          std::vector<Seq*>& sample) {
  const int64_t known = static_cast<int64_t>(s.tokens.size()), need = known - s.cached;
  // A greedy decode with a draft verifies it beside the next token (when the draft still fits the limit).
  const bool drafting = need == 1 && s.spec && s.draft >= 0 && known + 1 < s.limit && budget >= 2;
  int64_t k = drafting ? 2 : 1;
  if (need > 1) {  // a prompt (or a recompute after eviction)
    if (cfg_.chunked_prefill) k = std::min(need, budget);
    else if (need <= budget || !prefill_in_step) k = need;
    else return false;  // another prompt already overran this step's budget: next step
  }
  const int64_t have = static_cast<int64_t>(s.table.size());
  int64_t extra = blocks_for(s.cached + k, block_size_) - have;
  if (extra > blocks_.free_blocks() && cfg_.chunked_prefill && need > 1) {
    k = std::min(k, (have + blocks_.free_blocks()) * block_size_ - s.cached);  // the chunk that fits
    extra = k > 0 ? blocks_for(s.cached + k, block_size_) - have : extra;
  }
  if (k <= 0 || extra > blocks_.free_blocks()) {
    if (running && !s.paused) {
      s.paused = true;
      ++stats_.pauses;
    }
    return false;
  }
  blocks_.allocate(std::max<int64_t>(extra, 0), s.table);
  if (s.paused) {
    s.paused = false;
    ++stats_.resumes;
  }
  const int32_t seq = static_cast<int32_t>(plan.rows.tables.size());
  plan.rows.tables.push_back(s.table);
  s.fed_row = static_cast<int64_t>(plan.tokens.size());
  s.fed_pos = s.cached;
  for (int64_t j = 0; j < k; ++j) {
    plan.tokens.push_back(drafting && j == 1 ? s.draft : s.tokens[static_cast<size_t>(s.cached + j)]);
    plan.rows.pos.push_back(s.cached + j);
    plan.rows.seq.push_back(seq);
  }
  s.drafting = drafting;
  if (drafting) {  // the draft's row: its logits verify the draft; kept (cached) only when it is right
    plan.logits_rows.push_back(static_cast<int32_t>(plan.tokens.size() - 2));
    plan.logits_rows.push_back(static_cast<int32_t>(plan.tokens.size() - 1));
    sample.push_back(&s);
    s.cached += 1;
    budget -= 2;
    stats_.decode_tokens += 1;
    return true;
  }
  if (need > 1) {
    prefill_in_step = true;
    if (s.evicted_at > s.cached) stats_.recomputed_tokens += std::min(k, s.evicted_at - s.cached);
    stats_.prefill_tokens += k;
  } else {
    stats_.decode_tokens += 1;
  }
  s.cached += k;
  budget -= k;
  if (s.cached == known) {  // every known token is in: its next token is sampled from this row
    plan.logits_rows.push_back(static_cast<int32_t>(plan.tokens.size() - 1));
    sample.push_back(&s);
  }
  return true;
}

bool DynamicEngine::step() {
  {
    std::lock_guard<std::mutex> lk(in_mu_);
    while (!incoming_.empty()) {
      waiting_.push_back(std::move(incoming_.front()));
      incoming_.pop_front();
    }
  }
  drop_cancelled();
  if (running_.empty() && waiting_.empty()) return false;

  StepPlan plan;
  std::vector<Seq*> sample;
  sharing_->begin_step();
  for (;;) {
    int64_t budget = cfg_.max_tokens;
    bool prefill_in_step = false, any_paused = false;
    for (auto& s : running_) {  // oldest first: decodes, then unfinished prompts
      schedule(*s, true, plan, budget, prefill_in_step, sample);
      any_paused |= s->paused;
    }
    while (!any_paused && !waiting_.empty() && static_cast<int64_t>(running_.size()) < cfg_.max_requests) {
      if (!schedule(*waiting_.front(), false, plan, budget, prefill_in_step, sample)) break;
      running_.push_back(std::move(waiting_.front()));
      waiting_.pop_front();
      ++admitted_;
    }
    if (!plan.tokens.empty() || running_.empty()) break;
    // Every running request is paused: free the blocks of the newest one holding any (it is
    // recomputed later). With every block free the oldest fits (the pool holds one whole sequence).
    auto victim = std::find_if(running_.rbegin(), running_.rend(), [](const auto& s) { return !s->table.empty(); });
    MPT_CHECK(victim != running_.rend(), "dynamic engine: no request can run with every KV block free", "");
    evict(**victim);
  }
  stats_.max_running = std::max(stats_.max_running, static_cast<int64_t>(running_.size()));
  if (plan.tokens.empty()) return !waiting_.empty();

  const std::vector<float> logits = runner_.step(plan);
  for (auto& s : running_) sharing_->computed(s->shared, s->tokens, s->table, s->cached);
  ++stats_.steps;
  stats_.rows += static_cast<int64_t>(plan.tokens.size());
  const int64_t V = runner_.config().vocab_size;
  int64_t at = 0;  // the logits row of the next sample
  std::vector<std::pair<Seq*, int64_t>> picks;  // (sequence, its logits row), a drafting one twice
  for (Seq* s : sample) {
    picks.push_back({s, at++});
    if (s->drafting) picks.push_back({s, at++});
  }
  for (size_t i = 0; i < picks.size(); ++i) {
    Seq& s = *picks[i].first;
    if (s.drafting && i > 0 && picks[i - 1].first == &s) {  // the draft's row: keep it only if it was right
      s.drafting = false;
      ++stats_.drafted;
      const bool right = s.out.generated.back() == s.draft && !(s.req.stop_at_eod && s.draft == s.req.eod) &&
                         static_cast<int64_t>(s.out.generated.size()) < s.req.max_new_tokens &&
                         static_cast<int64_t>(s.tokens.size()) < s.limit;
      s.draft = -1;
      if (!right) continue;
      ++stats_.accepted;
      s.cached += 1;  // the draft's row is the model's own token at that position
    }
    const float* row = logits.data() + picks[i].second * V;
    const uint64_t step_index = s.out.generated.size();
    TokenEvent e;
    e.token = sample_token(row, V, s.req.sampling, s.req.stream, step_index, &e.logprob);
    if (s.req.top_logprobs > 0) e.top = top_logprobs(row, V, s.req.top_logprobs);
    s.sampled = true;
    s.tokens.push_back(e.token);
    s.out.generated.push_back(e.token);
    s.out.logprobs.push_back(e.logprob);
    if (s.req.top_logprobs > 0) s.out.top.push_back(e.top);
    ++stats_.generated;
    s.state->push(e);
  }
  // Finish the requests that are done, keep the others in admission order.
  std::vector<std::unique_ptr<Seq>> still;
  for (auto& s : running_) {
    const int64_t gen = static_cast<int64_t>(s->out.generated.size());
    if (s->sampled) {
      s->sampled = false;
      if (s->req.stop_at_eod && s->out.generated.back() == s->req.eod) {
        finish(*s, "stop");
        continue;
      }
      if (gen >= s->req.max_new_tokens || static_cast<int64_t>(s->tokens.size()) >= s->limit) {
        finish(*s, "length");
        continue;
      }
    }
    still.push_back(std::move(s));
  }
  running_ = std::move(still);
  if (cfg_.num_speculative_tokens > 0) draft();
  for (auto& s : running_) s->fed_pos = -1;
  return true;
}

void DynamicEngine::draft() {
  // MTP at position j reads the model's final-normed hidden state there and token j + 1, and guesses
  // token j + 2. Every position fed this step whose next token is known gets its row (the MTP layer's
  // cache needs them all); the last one of a request that just got a token gives its draft.
  StepPlan plan;
  plan.kind = 1;
  std::vector<Seq*> drafting;
  for (auto& sp : running_) {
    Seq& s = *sp;
    if (!s.spec || s.fed_pos < 0) continue;
    const int64_t last = std::min<int64_t>(s.cached, static_cast<int64_t>(s.tokens.size()) - 1) - 1;
    if (last < s.fed_pos) continue;
    const int32_t seq = static_cast<int32_t>(plan.rows.tables.size());
    plan.rows.tables.push_back(s.table);
    for (int64_t j = s.fed_pos; j <= last; ++j) {
      plan.tokens.push_back(s.tokens[static_cast<size_t>(j + 1)]);
      plan.rows.pos.push_back(j);
      plan.rows.seq.push_back(seq);
      plan.hidden_rows.push_back(static_cast<int32_t>(s.fed_row + j - s.fed_pos));
    }
    if (s.cached + 1 == static_cast<int64_t>(s.tokens.size())) {  // its next token is known: draft the one after
      plan.logits_rows.push_back(static_cast<int32_t>(plan.tokens.size() - 1));
      drafting.push_back(&s);
    }
  }
  if (plan.tokens.empty()) return;
  const std::vector<float> logits = runner_.step(plan);
  ++stats_.draft_steps;
  const int64_t V = runner_.config().vocab_size;
  for (size_t i = 0; i < drafting.size(); ++i) {
    const float* row = logits.data() + static_cast<int64_t>(i) * V;
    drafting[i]->draft = static_cast<int32_t>(std::max_element(row, row + V) - row);  // greedy: the first largest
  }
}

std::vector<GenResult> DynamicEngine::run(const std::vector<GenRequest>& requests) {
  std::vector<std::shared_ptr<RequestState>> states;
  for (const GenRequest& r : requests) states.push_back(submit(r));
  while (step()) {
  }
  std::vector<GenResult> out;
  for (auto& st : states) {
    MPT_CHECK(st->finished(), "DynamicEngine::run: a request did not finish", "");
    out.push_back(st->result());
  }
  return out;
}

}  // namespace mpitron
