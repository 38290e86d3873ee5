#include "model/inference/server_metrics.h"

#include <cstdio>

#include "core/error.h"

namespace mpitron {

namespace {

std::string num(double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.9g", v);
  return buf;
}

std::string header(const std::string& name, const char* type, const std::string& help) {
  return str("# HELP ", name, " ", help, "\n# TYPE ", name, " ", type, "\n");
}

std::string escape_label(const std::string& v) {
  std::string out;
  for (char c : v) {
    if (c == '\\' || c == '"') out += '\\';
    if (c == '\n') {
      out += "\\n";
      continue;
    }
    out += c;
  }
  return out;
}

}  // namespace

void LatencyHistogram::observe(double seconds) {
  for (size_t k = 0; k < kBounds.size(); ++k)
    if (seconds <= kBounds[k]) {
      ++buckets_[k];
      break;
    }
  ++count_;
  sum_ += seconds;
}

std::string LatencyHistogram::prometheus(const std::string& name, const std::string& help) const {
  std::string out = header(name, "histogram", help);
  int64_t cum = 0;
  for (size_t k = 0; k < kBounds.size(); ++k) {
    cum += buckets_[k];
    out += str(name, "_bucket{le=\"", num(kBounds[k]), "\"} ", cum, "\n");
  }
  out += str(name, "_bucket{le=\"+Inf\"} ", count_, "\n", name, "_sum ", num(sum_), "\n", name, "_count ", count_, "\n");
  return out;
}

std::string engine_prometheus(const EngineStats& s) {
  struct Row {
    const char* name;
    const char* type;
    const char* help;
    int64_t value;
  };
  const Row rows[] = {
      {"mpitron_requests_running", "gauge", "Requests admitted by the engine (running or paused).", s.running},
      {"mpitron_requests_waiting", "gauge", "Requests submitted and not yet admitted.", s.waiting},
      {"mpitron_kv_cache_blocks_used", "gauge", "KV cache blocks held by requests now.", s.kv_blocks_used},
      {"mpitron_kv_cache_blocks_total", "gauge", "KV cache blocks in the pool.", s.kv_blocks},
      {"mpitron_kv_cache_blocks_peak", "gauge", "Most KV cache blocks held at once.", s.peak_blocks},
      {"mpitron_kv_cache_block_bytes", "gauge", "Bytes of one KV cache block on each rank.", s.kv_block_bytes},
      {"mpitron_engine_steps_total", "counter", "Forward steps of the engine.", s.steps},
      {"mpitron_engine_rows_total", "counter", "Rows (tokens) run through the model.", s.rows},
      {"mpitron_engine_prefill_tokens_total", "counter", "Prompt tokens run (prefill).", s.prefill_tokens},
      {"mpitron_engine_decode_tokens_total", "counter", "Decode tokens run.", s.decode_tokens},
      {"mpitron_engine_generated_tokens_total", "counter", "Tokens sampled by the engine.", s.generated},
      {"mpitron_engine_requests_done_total", "counter", "Requests the engine finished.", s.requests_done},
      {"mpitron_engine_requests_cancelled_total", "counter", "Requests cancelled (client gone, stop text).", s.cancelled},
      {"mpitron_engine_max_running", "gauge", "Most requests running at once.", s.max_running},
      {"mpitron_engine_pauses_total", "counter", "Requests paused for KV blocks.", s.pauses},
      {"mpitron_engine_resumes_total", "counter", "Paused requests resumed.", s.resumes},
      {"mpitron_engine_evictions_total", "counter", "Requests evicted (blocks freed, recomputed later).", s.evictions},
      {"mpitron_engine_recomputed_tokens_total", "counter", "Tokens recomputed after evictions.", s.recomputed_tokens},
      {"mpitron_spec_decode_drafted_tokens_total", "counter", "MTP draft tokens verified.", s.drafted},
      {"mpitron_spec_decode_accepted_tokens_total", "counter", "MTP draft tokens accepted.", s.accepted},
      {"mpitron_prefix_cache_queries_total", "counter", "Full prompt blocks looked up in the prefix cache.", s.prefix_cache_queries},
      {"mpitron_prefix_cache_hits_total", "counter", "Prompt blocks found in the prefix cache (reused, not computed).", s.prefix_cache_hits},
      {"mpitron_prefix_cache_tokens_saved_total", "counter", "Prompt positions not computed thanks to the prefix cache.", s.prefix_cache_tokens_saved},
      {"mpitron_prefix_cache_blocks_saved", "gauge", "KV blocks spared now by sharing (references beyond the first).", s.prefix_cache_blocks_saved},
      {"mpitron_prefix_cache_blocks_saved_peak", "gauge", "Most KV blocks spared by sharing at once.", s.prefix_cache_blocks_saved_peak},
      {"mpitron_prefix_cache_blocks_resident", "gauge", "KV blocks in the prefix cache now.", s.prefix_cache_blocks_resident},
      {"mpitron_prefix_cache_evictions_total", "counter", "Cached KV blocks taken back for other use (lru).", s.prefix_cache_evictions},
      {"mpitron_prefix_cache_deferred_total", "counter", "Admissions put off a step to share a block that step computes.", s.prefix_cache_deferred},
  };
  std::string out;
  for (const Row& r : rows) out += header(r.name, r.type, r.help) + str(r.name, " ", r.value, "\n");
  return out;
}

void ServerMetrics::on_response(const std::string& method, const std::string& path, bool routed, int status) {
  std::lock_guard<std::mutex> l(mu_);
  ++requests_[{method, routed ? path : "other", status}];
}

void ServerMetrics::on_tokens(int64_t prompt, int64_t generated) {
  std::lock_guard<std::mutex> l(mu_);
  prompt_tokens_ += prompt;
  generated_tokens_ += generated;
}

void ServerMetrics::on_first_token(double s) {
  std::lock_guard<std::mutex> l(mu_);
  ttft_.observe(s);
}

void ServerMetrics::on_token_gap(double s) {
  std::lock_guard<std::mutex> l(mu_);
  tpot_.observe(s);
}

void ServerMetrics::publish(const EngineStats& s) {
  std::lock_guard<std::mutex> l(mu_);
  engine_ = s;
  published_ = true;
}

bool ServerMetrics::engine_up() const {
  std::lock_guard<std::mutex> l(mu_);
  return published_;
}

std::string ServerMetrics::prometheus() const {
  std::lock_guard<std::mutex> l(mu_);
  std::string out = header("mpitron_http_requests_total", "counter", "HTTP requests answered, by method, route and status.");
  int64_t total = 0;
  for (const auto& [key, n] : requests_) {
    const auto& [method, path, status] = key;
    out += str("mpitron_http_requests_total{method=\"", escape_label(method), "\",path=\"", escape_label(path),
               "\",status=\"", status, "\"} ", n, "\n");
    total += n;
  }
  out += header("mpitron_http_requests_all_total", "counter", "HTTP requests answered.") +
         str("mpitron_http_requests_all_total ", total, "\n");
  out += header("mpitron_prompt_tokens_total", "counter", "Prompt tokens of finished generations.") +
         str("mpitron_prompt_tokens_total ", prompt_tokens_, "\n");
  out += header("mpitron_generation_tokens_total", "counter", "Tokens generated by finished generations.") +
         str("mpitron_generation_tokens_total ", generated_tokens_, "\n");
  out += ttft_.prometheus("mpitron_time_to_first_token_seconds", "Seconds from a request's arrival to its first token.");
  out += tpot_.prometheus("mpitron_time_per_output_token_seconds", "Seconds between two tokens of a request.");
  out += engine_prometheus(engine_);
  return out;
}

}  // namespace mpitron
