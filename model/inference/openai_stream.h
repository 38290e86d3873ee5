// model/inference/openai_stream.h — what OpenAI's completions and chat completions endpoints share:
// their error object, and ChoiceStream, one choice's generated text as it arrives: decoded from the
// engine's tokens, held back while it ends inside a UTF-8 character or may be the start of a stop
// string, and cut before the first stop string (the request is then cancelled, finish_reason
// "stop"). It also feeds the latency metrics (time to first token, time between tokens).
#pragma once
#include <chrono>
#include <deque>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "data/text_tokenizer.h"
#include "io/http_server.h"
#include "model/inference/dynamic_engine.h"
#include "model/inference/server_metrics.h"

namespace mpitron::openai {

// A request the API refuses: status, message and the field it names ("" for none).
struct BadRequest {
  BadRequest(std::string m, std::string p, int s = 400, std::string c = "")
      : message(std::move(m)), param(std::move(p)), status(s), code(std::move(c)) {}
  std::string message, param;
  int status;
  std::string code;  // "" → null
};

// {"error": {"message", "type", "param", "code"}}; type from the status (invalid_request_error for
// 4xx, server_error for 5xx).
io::HttpResponse error_response(int status, const std::string& message, const std::string& param = "",
                                const std::string& code = "");
inline io::HttpResponse error_response(const BadRequest& b) { return error_response(b.status, b.message, b.param, b.code); }

using Clock = std::chrono::steady_clock;

struct ChoiceUpdate {
  std::string text;               // new text to send
  std::vector<TokenEvent> tokens; // the tokens consumed by this update (a final end-of-document excluded)
  bool done = false;
  std::string finish_reason;      // when done: "stop" (end of document or a stop string) or "length"
};

class ChoiceStream {
 public:
  ChoiceStream(std::shared_ptr<RequestState> state, const data::TextTokenizer& tok, std::vector<std::string> stops,
               int32_t eod, ServerMetrics* metrics, Clock::time_point arrived);
  // Takes the next token (waiting up to timeout_s for one when none is queued) and returns what
  // it adds: one token per update, so a stream sends a chunk per token.
  ChoiceUpdate poll(double timeout_s);
  bool done() const { return done_; }
  int64_t generated() const { return count_; }  // tokens the engine produced for it (a final eod included)
  void cancel() { state_->cancel(); }

 private:
  std::shared_ptr<RequestState> state_;
  const data::TextTokenizer& tok_;
  std::vector<std::string> stops_;
  int32_t eod_;
  ServerMetrics* metrics_;
  Clock::time_point arrived_, last_;
  std::deque<TokenEvent> pending_;  // received from the engine, not yet taken
  bool engine_done_ = false;
  std::vector<int32_t> gen_;
  size_t sent_ = 0;  // bytes of decode(gen_) handed out
  int64_t count_ = 0;
  bool done_ = false;
};

// Length of the longest suffix of `text` that is a proper prefix of one of `stops`.
size_t stop_prefix_suffix(const std::string& text, const std::vector<std::string>& stops);

}  // namespace mpitron::openai
