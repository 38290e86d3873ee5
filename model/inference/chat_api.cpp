// POST /v1/chat/completions — OpenAI's chat completions API on the dynamic engine.
//   messages        [{role, content (string, list of parts, or null), ...}] (required, non-empty):
//                   rendered by the model's chat template with add_generation_prompt=True (as
//                   transformers' apply_chat_template), then tokenised without extra special tokens;
//                   the answer ends at the template's eos_token when that is one token (<|im_end|>,
//                   <|eot_id|>), else at the tokenizer's end of document
//   model           the served model's name (GET /v1/models); another name is a 404
//   max_completion_tokens / max_tokens   int >= 0; default: the rest of the context
//   temperature [0, 100] (1; 0 greedy), top_p (0, 1], top_k (an extension, as vLLM), seed int >= 0
//   n               1..16 choices; choice i draws philox(seed, i, step), so a seed reproduces them all
//   stop            a string or up to 4: the text is cut before the first, finish_reason "stop"
//   logprobs, top_logprobs (0..20, needs logprobs): choices[i].logprobs.content[{token, logprob,
//                   bytes, top_logprobs}]
//   stream, stream_options.include_usage: server-sent events of chat.completion.chunk objects
//                   (a delta with the role, deltas with content, one with the finish_reason, then
//                   a usage chunk when asked, then "data: [DONE]")
//   chat_template_kwargs  extra template variables (e.g. {"enable_thinking": false}; vLLM's name)
//   user accepted; penalties 0, logit_bias {}, response_format {"type": "text"}, tools [] and
//   tool_choice "none" are the only values accepted for what is not built; other fields are a 400.
// usage: prompt_tokens (the rendered prompt, once), completion_tokens (every choice's tokens).
#include <algorithm>
#include <chrono>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/json.h"
#include "model/inference/openai_stream.h"
#include "model/inference/text_api.h"

namespace mpitron {

namespace {

using json = nlohmann::json;
using ojson = nlohmann::ordered_json;
using openai::BadRequest;
using openai::ChoiceStream;
using openai::ChoiceUpdate;

std::string dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

bool uint_at_most(const json& v, uint64_t max) {
  if (!v.is_number_integer()) return false;
  if (!v.is_number_unsigned() && v.get<int64_t>() < 0) return false;
  return v.get<uint64_t>() <= max;
}

struct ChatRequest {
  ojson messages, template_kwargs = ojson::object();
  GenRequest base;
  int64_t n = 1, max_tokens = -1, top_logprobs = 0;
  std::vector<std::string> stop;
  bool stream = false, include_usage = false, logprobs = false;
  std::string model;
};

const char* const kChatFields[] = {"messages", "model", "max_tokens", "max_completion_tokens", "temperature", "top_p",
                                   "top_k", "n", "seed", "stop", "stream", "stream_options", "logprobs",
                                   "top_logprobs", "user", "presence_penalty", "frequency_penalty", "logit_bias",
                                   "response_format", "tools", "tool_choice", "chat_template_kwargs"};

bool given(const ojson& j, const char* k) { return j.contains(k) && !j[k].is_null(); }

// The fields that are not built: only their neutral values.
void check_neutral(const ojson& j) {
  const auto neutral = [&](const char* k, bool ok, const char* only) {
    if (given(j, k) && !ok) throw BadRequest{str("'", k, "' is not supported by this server (only ", only, ")"), k};
  };
  const auto zero = [&](const char* k) { return j.value(k, ojson(0)).is_number() && j.value(k, ojson(0)).get<double>() == 0.0; };
  neutral("presence_penalty", zero("presence_penalty"), "0");
  neutral("frequency_penalty", zero("frequency_penalty"), "0");
  neutral("logit_bias", j.contains("logit_bias") && j["logit_bias"].is_object() && j["logit_bias"].empty(), "{}");
  neutral("response_format", j.contains("response_format") && j["response_format"] == ojson{{"type", "text"}},
          "{\"type\": \"text\"}");
  neutral("tools", j.contains("tools") && j["tools"].is_array() && j["tools"].empty(), "[]");
  neutral("tool_choice", j.contains("tool_choice") && j["tool_choice"] == "none", "\"none\"");
}

void parse_sampling(const ojson& j, ChatRequest& c) {
  GenRequest& b = c.base;
  if (given(j, "temperature")) {
    const auto& v = j["temperature"];
    if (!v.is_number() || !(v.get<double>() >= 0.0 && v.get<double>() <= 100.0))
      throw BadRequest{"temperature must be a number in [0, 100] (0: greedy)", "temperature"};
    b.sampling.temperature = v.get<float>();
  }
  if (given(j, "top_p")) {
    const auto& v = j["top_p"];
    if (!v.is_number() || !(v.get<double>() > 0.0 && v.get<double>() <= 1.0))
      throw BadRequest{"top_p must be a number in (0, 1] (1: off)", "top_p"};
    b.sampling.top_p = v.get<double>() >= 1.0 ? 0.0f : v.get<float>();
  }
  if (given(j, "top_k")) {
    const auto& v = j["top_k"];
    const bool off = v.is_number_integer() && !v.is_number_unsigned() && v.get<int64_t>() == -1;
    if (!off && !uint_at_most(v, 1u << 20)) throw BadRequest{"top_k must be an integer: -1 or 0 (off), or a count", "top_k"};
    b.sampling.top_k = off ? 0 : v.get<int64_t>();
  }
  if (given(j, "seed")) {
    if (!uint_at_most(j["seed"], UINT64_MAX)) throw BadRequest{"seed must be a non-negative integer", "seed"};
    b.sampling.seed = j["seed"].get<uint64_t>();
  }
  if (given(j, "n")) {
    if (!j["n"].is_number_integer() || j["n"].get<int64_t>() < 1 || j["n"].get<int64_t>() > 16)
      throw BadRequest{"n must be an integer in [1, 16]", "n"};
    c.n = j["n"].get<int64_t>();
  }
  if (given(j, "stop")) {
    const auto& v = j["stop"];
    const auto add = [&](const ojson& s) {
      if (!s.is_string() || s.get<std::string>().empty()) throw BadRequest{"stop must be a non-empty string or a list of them", "stop"};
      c.stop.push_back(s.get<std::string>());
    };
    if (v.is_array()) {
      if (v.size() > 4) throw BadRequest{"stop takes at most 4 sequences", "stop"};
      for (const auto& s : v) add(s);
    } else {
      add(v);
    }
  }
  if (given(j, "stream")) {
    if (!j["stream"].is_boolean()) throw BadRequest{"stream must be a boolean", "stream"};
    c.stream = j["stream"].get<bool>();
  }
  if (given(j, "stream_options")) {
    const auto& v = j["stream_options"];
    if (!c.stream) throw BadRequest{"stream_options is only allowed with stream: true", "stream_options"};
    if (!v.is_object()) throw BadRequest{"stream_options must be an object", "stream_options"};
    for (auto it = v.begin(); it != v.end(); ++it) {
      if (it.key() != "include_usage" || !it.value().is_boolean())
        throw BadRequest{"stream_options takes {\"include_usage\": bool}", "stream_options"};
      c.include_usage = it.value().get<bool>();
    }
  }
  if (given(j, "logprobs")) {
    if (!j["logprobs"].is_boolean()) throw BadRequest{"logprobs must be a boolean", "logprobs"};
    c.logprobs = j["logprobs"].get<bool>();
  }
  if (given(j, "top_logprobs")) {
    if (!uint_at_most(j["top_logprobs"], 20)) throw BadRequest{"top_logprobs must be an integer in [0, 20]", "top_logprobs"};
    if (!c.logprobs) throw BadRequest{"top_logprobs needs logprobs: true", "top_logprobs"};
    c.top_logprobs = j["top_logprobs"].get<int64_t>();
  }
  b.top_logprobs = c.logprobs ? std::max<int64_t>(c.top_logprobs, 0) : 0;
  for (const char* k : {"max_completion_tokens", "max_tokens"}) {
    if (!given(j, k)) continue;
    if (!uint_at_most(j[k], 1ull << 40)) throw BadRequest{str(k, " must be a non-negative integer"), k};
    c.max_tokens = j[k].get<int64_t>();
    break;  // max_completion_tokens wins when both are given (OpenAI deprecates max_tokens)
  }
}

void parse_messages(const ojson& j, ChatRequest& c) {
  if (!j.contains("messages")) throw BadRequest{"messages is required", "messages"};
  const ojson& m = j["messages"];
  if (!m.is_array() || m.empty()) throw BadRequest{"messages must be a non-empty list of messages", "messages"};
  for (size_t i = 0; i < m.size(); ++i) {
    const ojson& msg = m[i];
    const std::string where = str("messages[", i, "]");
    if (!msg.is_object()) throw BadRequest{where + " must be an object", "messages"};
    if (!msg.contains("role") || !msg["role"].is_string()) throw BadRequest{where + ".role must be a string", "messages"};
    if (msg.contains("content") && !(msg["content"].is_string() || msg["content"].is_array() || msg["content"].is_null()))
      throw BadRequest{where + ".content must be a string, a list of content parts or null", "messages"};
  }
  c.messages = m;
  if (given(j, "chat_template_kwargs")) {
    if (!j["chat_template_kwargs"].is_object()) throw BadRequest{"chat_template_kwargs must be an object", "chat_template_kwargs"};
    c.template_kwargs = j["chat_template_kwargs"];
  }
}

json token_bytes(const std::string& s) {
  json b = json::array();
  for (unsigned char ch : s) b.push_back(static_cast<int>(ch));
  return b;
}

// What a chat request needs from the server.
struct ChatContext {
  const data::TextTokenizer& tok;
  int64_t max_positions;
  const std::string& model_name;
  uint64_t seed;
  const data::ChatTemplate* chat_template;  // null: none
  const std::string& no_chat_template;
  int32_t eod;  // the end of a turn
};

// The request checked, its messages rendered and tokenised into `prompt`. Throws BadRequest.
ChatRequest parse_chat(const std::string& body, const ChatContext& ctx, std::vector<int32_t>& prompt) {
  try {
    parse_json_text(body, "the body");  // bounded nesting, duplicate keys (core/json.h)
  } catch (const Error& e) {
    throw BadRequest{e.message(), ""};
  }
  const ojson j = ojson::parse(body);
  if (!j.is_object()) throw BadRequest{"the body must be a JSON object", ""};
  for (auto it = j.begin(); it != j.end(); ++it)
    if (std::find_if(std::begin(kChatFields), std::end(kChatFields), [&](const char* f) { return it.key() == f; }) ==
        std::end(kChatFields))
      throw BadRequest{str("unknown field '", it.key(), "'"), it.key()};
  ChatRequest c;
  c.model = ctx.model_name;
  if (given(j, "model")) {
    if (!j["model"].is_string()) throw BadRequest{"model must be a string", "model"};
    c.model = j["model"].get<std::string>();
    if (c.model != ctx.model_name)
      throw BadRequest{str("The model `", c.model, "` does not exist (this server serves `", ctx.model_name, "`)"),
                       "model", 404, "model_not_found"};
  }
  if (given(j, "user") && !j["user"].is_string()) throw BadRequest{"user must be a string", "user"};
  check_neutral(j);
  c.base.eod = ctx.eod;
  c.base.sampling.seed = ctx.seed;
  parse_sampling(j, c);
  parse_messages(j, c);
  if (!ctx.chat_template)
    throw BadRequest{str("this model has no chat template (", ctx.no_chat_template,
                         "); start the server with --chat-template FILE, or use /v1/completions"),
                     "messages", 400, "no_chat_template"};
  std::string text;
  try {
    text = ctx.chat_template->apply(c.messages, true, c.template_kwargs);
  } catch (const Error& e) {  // the template's raise_exception, or a message it cannot render
    throw BadRequest{e.message(), "messages"};
  }
  prompt = ctx.tok.make_encoder(false)->encode(text);
  const int64_t P = ctx.max_positions, T = std::max<int64_t>(static_cast<int64_t>(prompt.size()), 1);
  if (T >= P)
    throw BadRequest{str("This model's maximum context length is ", P, " tokens, however your messages resulted in ",
                         T, " tokens"), "messages", 400, "context_length_exceeded"};
  if (c.max_tokens > P - T)
    throw BadRequest{str("This model's maximum context length is ", P, " tokens, however you requested ",
                         T + c.max_tokens, " tokens (", T, " in the messages; ", c.max_tokens, " for the completion)"),
                     given(j, "max_completion_tokens") ? "max_completion_tokens" : "max_tokens", 400,
                     "context_length_exceeded"};
  c.base.max_new_tokens = c.max_tokens >= 0 ? c.max_tokens : P - T;
  return c;
}

struct Guard {  // cancels the submitted requests unless disarmed (an early return leaves no work)
  std::vector<std::shared_ptr<RequestState>> states;
  bool armed = true;
  ~Guard() {
    if (armed)
      for (auto& s : states) s->cancel();
  }
};

// One chat request's choices on their way to the client, whole or streamed.
struct ChatRun {
  std::string id, model;
  int64_t created = 0, prompt_tokens = 0, top_n = 0;
  bool logprobs = false, include_usage = false;
  const data::TextTokenizer* tok = nullptr;
  ServerMetrics* metrics = nullptr;
  std::shared_ptr<Guard> guard = std::make_shared<Guard>();
  std::shared_ptr<std::vector<ChoiceStream>> streams = std::make_shared<std::vector<ChoiceStream>>();

  json logprob_content(const std::vector<TokenEvent>& events) const {
    json content = json::array();
    for (const TokenEvent& e : events) {
      const std::string s = tok->decode(&e.token, 1);
      json top = json::array();
      for (size_t k = 0; k < e.top.size() && static_cast<int64_t>(k) < top_n; ++k) {
        const std::string ts = tok->decode(&e.top[k].first, 1);
        top.push_back({{"token", ts}, {"logprob", e.top[k].second}, {"bytes", token_bytes(ts)}});
      }
      content.push_back({{"token", s}, {"logprob", e.logprob}, {"bytes", token_bytes(s)}, {"top_logprobs", top}});
    }
    return content;
  }

  // Counted once, when the answer is complete.
  json usage() const {
    int64_t completion = 0;
    for (const ChoiceStream& s : *streams) completion += s.generated();
    if (metrics) metrics->on_tokens(prompt_tokens, completion);
    return json{{"prompt_tokens", prompt_tokens}, {"completion_tokens", completion},
                {"total_tokens", prompt_tokens + completion}};
  }

  io::HttpResponse whole() const {
    json choices = json::array();
    for (size_t i = 0; i < streams->size(); ++i) {
      std::string text, finish;
      std::vector<TokenEvent> tokens;
      while (!(*streams)[i].done()) {
        ChoiceUpdate u = (*streams)[i].poll(1.0);
        text += u.text;
        tokens.insert(tokens.end(), u.tokens.begin(), u.tokens.end());
        if (u.done) finish = u.finish_reason;
      }
      choices.push_back({{"index", i},
                         {"message", {{"role", "assistant"}, {"content", text}}},
                         {"logprobs", logprobs ? json{{"content", logprob_content(tokens)}} : json(nullptr)},
                         {"finish_reason", finish}});
    }
    guard->armed = false;
    io::HttpResponse r;
    r.body = dump({{"id", id}, {"object", "chat.completion"}, {"created", created}, {"model", model},
                   {"choices", choices}, {"usage", usage()}});
    return r;
  }

  // Server-sent events: the role first, then a chunk per token, a finish_reason per choice, the
  // usage when asked, then [DONE].
  io::HttpResponse stream() const {
    auto started = std::make_shared<bool>(false), finished = std::make_shared<bool>(false);
    io::HttpResponse r;
    r.content_type = "text/event-stream";
    r.headers.emplace_back("Cache-Control", "no-cache");
    const ChatRun run = *this;
    r.stream = [run, started, finished](const std::function<bool(const std::string&)>& write) {
      if (*finished) return false;
      const auto chunk = [&](json choices, const json& use) {
        json j = {{"id", run.id}, {"object", "chat.completion.chunk"}, {"created", run.created}, {"model", run.model},
                  {"choices", std::move(choices)}};
        if (run.include_usage) j["usage"] = use;
        return write("data: " + dump(j) + "\n\n");
      };
      const auto one = [](size_t i, json delta, json lp, json finish) {
        return json::array({{{"index", i}, {"delta", std::move(delta)}, {"logprobs", std::move(lp)},
                             {"finish_reason", std::move(finish)}}});
      };
      if (!*started) {
        *started = true;
        for (size_t i = 0; i < run.streams->size(); ++i)
          if (!chunk(one(i, {{"role", "assistant"}, {"content", ""}}, nullptr, nullptr), nullptr)) return false;
        return true;
      }
      bool waited = false;
      for (size_t i = 0; i < run.streams->size(); ++i) {
        ChoiceStream& cs = (*run.streams)[i];
        if (cs.done()) continue;
        ChoiceUpdate u = cs.poll(waited ? 0.0 : 0.05);
        waited = true;
        if (!u.tokens.empty() || !u.text.empty()) {  // a chunk per token (its text may be held back: "")
          const json lp = run.logprobs ? json{{"content", run.logprob_content(u.tokens)}} : json(nullptr);
          if (!chunk(one(i, {{"content", u.text}}, lp, nullptr), nullptr)) return false;
        }
        if (u.done && !chunk(one(i, json::object(), nullptr, u.finish_reason), nullptr)) return false;
      }
      if (std::all_of(run.streams->begin(), run.streams->end(), [](const ChoiceStream& s) { return s.done(); })) {
        run.guard->armed = false;
        *finished = true;
        if (run.include_usage && !chunk(json::array(), run.usage())) return false;
        write("data: [DONE]\n\n");
        return false;
      }
      return true;
    };
    auto guard = this->guard;
    r.abort = [guard] {
      for (auto& s : guard->states) s->cancel();
    };
    return r;
  }
};

}  // namespace

io::HttpResponse TextGenerationApi::chat_completions(const io::HttpRequest& req) {
  const auto arrived = openai::Clock::now();
  std::vector<int32_t> prompt;
  ChatRequest c;
  try {
    c = parse_chat(req.body, {tok_, cfg_.max_position_embeddings, opts_.model_name, opts_.seed,
                              opts_.chat_template.get(), opts_.no_chat_template, chat_eod_}, prompt);
  } catch (const BadRequest& e) {
    return openai::error_response(e);
  } catch (const json::exception& e) {
    return openai::error_response(400, str("the body is not JSON: ", e.what()));
  }
  ChatRun run;
  try {
    for (int64_t i = 0; i < c.n; ++i) {
      GenRequest r = c.base;
      r.prompt = prompt;
      r.stream = static_cast<uint64_t>(i);  // choice i draws philox(seed, i, step)
      run.guard->states.push_back(submit_(std::move(r)));
      run.streams->emplace_back(run.guard->states.back(), tok_, c.stop, c.base.eod, opts_.metrics, arrived);
    }
  } catch (const Error& e) {
    return openai::error_response(400, e.message(), "messages");
  }
  run.id = str("chatcmpl-", next_id_++);
  run.model = c.model;
  run.created = std::chrono::duration_cast<std::chrono::seconds>(
                    std::chrono::system_clock::now().time_since_epoch()).count();
  run.prompt_tokens = static_cast<int64_t>(prompt.size());
  run.top_n = c.top_logprobs;
  run.logprobs = c.logprobs;
  run.include_usage = c.include_usage;
  run.tok = &tok_;
  run.metrics = opts_.metrics;
  return c.stream ? run.stream() : run.whole();
}

io::HttpResponse TextGenerationApi::health(const io::HttpRequest&) {
  io::HttpResponse r;
  const bool up = !opts_.metrics || opts_.metrics->engine_up();
  r.status = up ? 200 : 503;
  r.body = up ? R"({"status": "ok"})" : R"({"status": "starting"})";
  return r;
}

io::HttpResponse TextGenerationApi::metrics(const io::HttpRequest&) {
  io::HttpResponse r;
  r.content_type = "text/plain; version=0.0.4";
  r.body = opts_.metrics ? opts_.metrics->prometheus() : "";
  return r;
}

}  // namespace mpitron
