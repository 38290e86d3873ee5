// model/inference/text_api.h — the text generation server's two APIs, on the dynamic engine.
//
// PUT /api — Megatron-LM's REST API (megatron/text_generation_server.py), unchanged:
//   {"prompts": [1..128 strings], "tokens_to_generate": int >= 0 (64), "temperature": (0, 100] (1),
//    "top_k": [0, 1000] (0), "top_p": [0, 1] (0; not with top_k), "logprobs": bool, "random_seed": int >= 0}
//   → {"text": [prompt + generated], "segments": [[token strings]], "logprobs": [[...]] (when asked)}.
//   Any other field is a 400 naming it (Megatron's unbuilt ones say so); errors are 400 text/plain.
// POST /v1/completions — OpenAI's completions API (what current Megatron and most clients speak):
//   prompt       string, [strings] (1..128), [token ids] or [[token ids]]   (required)
//   max_tokens   int >= 0 (16); prompt + max_tokens <= max_position_embeddings
//   temperature  [0, 100] (1); 0 is greedy
//   top_p        (0, 1] (1: off)          top_k  int, -1 or 0: off, else 1..vocab (an extension, as vLLM)
//   seed         int >= 0 (the server's --seed); prompt i draws philox(seed, i, step)
//   stream       bool: server-sent events, one chunk per token, then "data: [DONE]"
//   logprobs     null or 0..20: tokens, token_logprobs, top_logprobs (that many), text_offset
//   n            1..16 choices per prompt (choice index p*n + k, Philox stream p*n + k)
//   stop         a string or up to 4: the text is cut before the first, finish_reason "stop"
//   model        the served model's name (GET /v1/models), else 404 model_not_found; user accepted;
//                echo false, best_of 1, presence/frequency penalties 0, suffix/logit_bias null:
//                other values are refused by name
//   → {"id", "object": "text_completion", "created", "model", "choices": [{"index", "text",
//      "logprobs", "finish_reason": "stop" | "length"}], "usage": {prompt/completion/total_tokens}}
//   Errors: 400 {"error": {"message", "type": "invalid_request_error", "param": <field>, "code": null}}.
// POST /v1/chat/completions — OpenAI's chat API: messages rendered with the model's chat template
//   (data/chat_template.h), then generated as a completion; fields and answers in
//   model/inference/chat_api.cpp and docs/generate-eval.md.
// GET /v1/models lists the one model (OpenAI's list object). GET /health: 200 once the engine runs.
// GET /metrics: Prometheus text (model/inference/server_metrics.h).
// The generated text never includes the final <|endoftext|> in /v1/completions (OpenAI's
// convention); Megatron's /api keeps Megatron's (it is part of "text").
#pragma once
#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "data/chat_template.h"
#include "data/text_tokenizer.h"
#include "io/http_server.h"
#include "model/config.h"
#include "model/inference/dynamic_engine.h"
#include "model/inference/server_metrics.h"

namespace mpitron {

class TextGenerationApi {
 public:
  using Submit = std::function<std::shared_ptr<RequestState>(GenRequest)>;  // may throw Error (a 400)
  struct Options {
    uint64_t seed = 1234;            // default random_seed / seed
    std::string model_name = "mpitron";
    std::shared_ptr<const data::ChatTemplate> chat_template;  // null: /v1/chat/completions answers 400
    std::string no_chat_template;                            // why there is none (named in that 400)
    ServerMetrics* metrics = nullptr;                        // latency and token counters (may be null)
  };
  TextGenerationApi(const data::TextTokenizer& tok, const GPTConfig& cfg, Options o, Submit submit);

  io::HttpResponse megatron(const io::HttpRequest& req);     // PUT /api
  io::HttpResponse completions(const io::HttpRequest& req);  // POST /v1/completions
  io::HttpResponse models(const io::HttpRequest& req);       // GET /v1/models
  io::HttpResponse chat_completions(const io::HttpRequest& req);  // POST /v1/chat/completions (chat_api.cpp)
  io::HttpResponse health(const io::HttpRequest& req);       // GET /health
  io::HttpResponse metrics(const io::HttpRequest& req);      // GET /metrics

 private:
  const data::TextTokenizer& tok_;
  GPTConfig cfg_;
  Options opts_;
  Submit submit_;
  int32_t chat_eod_;  // where a chat answer ends: the template's eos_token when it is one token, else the eod
  std::atomic<uint64_t> next_id_{0};
};

// Length of the longest prefix of s that does not end inside a UTF-8 sequence (what a
// stream may send before the next token completes the character).
size_t complete_utf8_prefix(const std::string& s);

}  // namespace mpitron
