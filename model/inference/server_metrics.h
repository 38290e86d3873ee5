// model/inference/server_metrics.h — the text generation server's counters as Prometheus text
// (GET /metrics): HTTP requests by route and status, prompt and generated tokens, time to first
// token and time per output token (histograms), and the dynamic engine's own counters and gauges
// (requests running and queued, KV cache blocks used and total, steps, ...) from EngineStats.
// Any thread may record; the engine thread publishes its stats snapshot.
#pragma once
#include <array>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <tuple>

#include "model/inference/dynamic_engine.h"

namespace mpitron {

// A Prometheus histogram with fixed bucket bounds (seconds).
class LatencyHistogram {
 public:
  static constexpr std::array<double, 14> kBounds = {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1,
                                                     0.25,  0.5,    1.0,   2.5,  5.0,   10.0, 30.0};
  void observe(double seconds);
  // "# HELP/# TYPE" and the _bucket{le=...}, _sum and _count lines of `name`.
  std::string prometheus(const std::string& name, const std::string& help) const;

 private:
  std::array<int64_t, kBounds.size()> buckets_{};  // cumulative at print time, per bucket here
  int64_t count_ = 0;
  double sum_ = 0;
};

// EngineStats as Prometheus lines, one row per field: the one place to extend when the engine
// counts something new.
std::string engine_prometheus(const EngineStats& s);

class ServerMetrics {
 public:
  // After each HTTP response. Paths that are not routes are counted as path="other".
  void on_response(const std::string& method, const std::string& path, bool routed, int status);
  void on_tokens(int64_t prompt, int64_t generated);  // one finished generation
  void on_first_token(double seconds_since_request);
  void on_token_gap(double seconds);                  // between two tokens of one request
  void publish(const EngineStats& s);                 // the engine thread, after steps
  bool engine_up() const;                             // a snapshot has been published
  std::string prometheus() const;

 private:
  mutable std::mutex mu_;
  std::map<std::tuple<std::string, std::string, int>, int64_t> requests_;  // (method, path, status)
  int64_t prompt_tokens_ = 0, generated_tokens_ = 0;
  LatencyHistogram ttft_, tpot_;
  EngineStats engine_;
  bool published_ = false;
};

}  // namespace mpitron
