#include "model/inference/openai_stream.h"

#include <algorithm>
#include <nlohmann/json.hpp>

#include "model/inference/text_api.h"

namespace mpitron::openai {

io::HttpResponse error_response(int status, const std::string& message, const std::string& param,
                                const std::string& code) {
  using json = nlohmann::json;
  io::HttpResponse r;
  r.status = status;
  const json j = {{"error",
                   {{"message", message},
                    {"type", status >= 500 ? "server_error" : "invalid_request_error"},
                    {"param", param.empty() ? json(nullptr) : json(param)},
                    {"code", code.empty() ? json(nullptr) : json(code)}}}};
  r.body = j.dump(-1, ' ', false, json::error_handler_t::replace);
  return r;
}

size_t stop_prefix_suffix(const std::string& text, const std::vector<std::string>& stops) {
  size_t best = 0;
  for (const std::string& s : stops)
    for (size_t len = std::min(s.size() - 1, text.size()); len > best; --len)
      if (text.compare(text.size() - len, len, s, 0, len) == 0) {
        best = len;
        break;
      }
  return best;
}

ChoiceStream::ChoiceStream(std::shared_ptr<RequestState> state, const data::TextTokenizer& tok,
                           std::vector<std::string> stops, int32_t eod, ServerMetrics* metrics,
                           Clock::time_point arrived)
    : state_(std::move(state)), tok_(tok), stops_(std::move(stops)), eod_(eod), metrics_(metrics), arrived_(arrived),
      last_(arrived) {}

ChoiceUpdate ChoiceStream::poll(double timeout_s) {
  ChoiceUpdate u;
  if (done_) {
    u.done = true;
    return u;
  }
  if (pending_.empty() && !engine_done_) {
    std::vector<TokenEvent> events;
    engine_done_ = !state_->next_events(events, timeout_s);
    const Clock::time_point now = Clock::now();
    for (TokenEvent& e : events) {
      if (metrics_) {
        if (count_ == 0) metrics_->on_first_token(std::chrono::duration<double>(now - arrived_).count());
        else metrics_->on_token_gap(std::chrono::duration<double>(now - last_).count() / static_cast<double>(events.size()));
      }
      ++count_;
      pending_.push_back(std::move(e));
    }
    if (!events.empty()) last_ = now;
  }
  if (!pending_.empty()) {
    const TokenEvent e = std::move(pending_.front());
    pending_.pop_front();
    if (e.token == eod_) return u;  // the engine ends a request at its end of document; not text
    gen_.push_back(e.token);
    u.tokens.push_back(e);
    const std::string text = tok_.decode(gen_);
    size_t hit = std::string::npos;
    for (const std::string& s : stops_) hit = std::min(hit, text.find(s, sent_));
    if (hit != std::string::npos) {
      u.text = text.substr(sent_, hit - sent_);
      sent_ = hit;
      state_->cancel();  // the engine frees its blocks at its next step
      done_ = u.done = true;
      u.finish_reason = "stop";
      return u;
    }
    size_t safe = complete_utf8_prefix(text);
    safe -= stop_prefix_suffix(text.substr(0, safe), stops_);
    if (safe > sent_) {
      u.text = text.substr(sent_, safe - sent_);
      sent_ = safe;
    }
    return u;
  }
  if (engine_done_) {  // every token taken: what was held back goes out now
    const std::string text = tok_.decode(gen_);
    if (text.size() > sent_) u.text = text.substr(sent_);
    sent_ = text.size();
    done_ = u.done = true;
    const std::string reason = state_->result().finish_reason;
    u.finish_reason = reason == "cancelled" ? "stop" : reason;
  }
  return u;
}

}  // namespace mpitron::openai
