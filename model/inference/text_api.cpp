#include "model/inference/text_api.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/json.h"
#include "data/tokenizer.h"
#include "model/inference/openai_stream.h"

namespace mpitron {

namespace {

using json = nlohmann::json;

// A request the API refuses: the message and the field it names ("" for the body itself).
struct BadRequest {
  std::string message, param;
};

std::string dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

io::HttpResponse text_error(int status, const std::string& why) {
  io::HttpResponse r;
  r.status = status;
  r.content_type = "text/plain";
  r.body = why + "\n";
  return r;
}

io::HttpResponse openai_error(int status, const std::string& why, const std::string& param) {
  io::HttpResponse r;
  r.status = status;
  r.body = dump({{"error",
                  {{"message", why},
                   {"type", "invalid_request_error"},
                   {"param", param.empty() ? json(nullptr) : json(param)},
                   {"code", nullptr}}}});
  return r;
}

json parse_object(const std::string& body) {
  json j;
  try {
    j = parse_json_text(body, "the body");  // bounded nesting and size (core/json.h)
  } catch (const Error& e) {
    throw BadRequest{e.message(), ""};
  }
  if (!j.is_object()) throw BadRequest{"the body must be a JSON object", ""};
  return j;
}

// A non-negative JSON integer up to `max` (checked before any arithmetic: 2^63 - 1 never overflows).
bool uint_at_most(const json& v, uint64_t max) {
  if (!v.is_number_integer()) return false;
  if (!v.is_number_unsigned() && v.get<int64_t>() < 0) return false;
  return v.get<uint64_t>() <= max;
}

// Cancels the submitted requests unless released (an early return must not leave work running).
struct CancelGuard {
  std::vector<std::shared_ptr<RequestState>> states;
  bool armed = true;
  ~CancelGuard() {
    if (armed)
      for (auto& s : states) s->cancel();
  }
};

void wait_all(const std::vector<std::shared_ptr<RequestState>>& states) {
  for (const auto& s : states)
    while (!s->wait(1.0)) {
    }
}

}  // namespace

size_t complete_utf8_prefix(const std::string& s) {
  // Walk back over at most 3 continuation bytes to the last lead byte; keep it only when its
  // sequence is complete.
  size_t i = s.size(), back = 0;
  while (i > 0 && back < 4 && (static_cast<unsigned char>(s[i - 1]) & 0xC0) == 0x80) --i, ++back;
  if (i == 0) return back == 0 ? 0 : s.size();  // only continuation bytes: not ours to fix
  const unsigned char lead = static_cast<unsigned char>(s[i - 1]);
  size_t need = 1;
  if ((lead & 0xE0) == 0xC0) need = 2;
  else if ((lead & 0xF0) == 0xE0) need = 3;
  else if ((lead & 0xF8) == 0xF0) need = 4;
  else if (lead & 0x80) return s.size();  // an invalid byte: sending it now or later is the same
  const size_t have = back + 1;
  return have >= need ? s.size() : i - 1;
}

TextGenerationApi::TextGenerationApi(const data::TextTokenizer& tok, const GPTConfig& cfg, Options o, Submit submit)
    : tok_(tok), cfg_(cfg), opts_(std::move(o)), submit_(std::move(submit)), chat_eod_(tok.eod()) {
  // A chat model ends its turn with the eos_token of its tokenizer_config.json (<|im_end|>,
  // <|eot_id|>, <end_of_turn>), which is often not the tokenizer's end of document.
  const std::string eos = opts_.chat_template ? opts_.chat_template->special_token("eos_token") : "";
  if (!eos.empty()) {
    const std::vector<int32_t> ids = tok_.make_encoder(false)->encode(eos);
    if (ids.size() == 1) chat_eod_ = ids[0];
  }
}

// ---------------------------------------------------------------------------
// PUT /api (Megatron)

io::HttpResponse TextGenerationApi::megatron(const io::HttpRequest& req) {
  const int64_t P = cfg_.max_position_embeddings;
  try {
    const json j = parse_object(req.body);
    static const char* const kFields[] = {"prompts", "tokens_to_generate", "temperature", "top_k",
                                          "top_p",   "logprobs",           "random_seed"};
    static const char* const kMegatronOnly[] = {"add_BOS", "all_probs", "top_p_decay", "top_p_bound",
                                                "stop_on_double_eol", "stop_on_eol", "prevent_newline_after_colon",
                                                "no_log", "beam_width", "length_penalty", "stop_token"};
    for (auto it = j.begin(); it != j.end(); ++it) {
      const std::string& k = it.key();
      if (std::find(std::begin(kFields), std::end(kFields), k) != std::end(kFields)) continue;
      if (std::find(std::begin(kMegatronOnly), std::end(kMegatronOnly), k) != std::end(kMegatronOnly))
        throw BadRequest{str("field '", k, "' is not supported by this server"), k};
      throw BadRequest{str("unknown field '", k, "'; the fields are prompts, tokens_to_generate, temperature, top_k, "
                           "top_p, logprobs, random_seed"), k};
    }
    if (!j.contains("prompts")) throw BadRequest{"prompts argument required", "prompts"};
    const auto& jp = j["prompts"];
    if (!jp.is_array()) throw BadRequest{"prompts is not a list of strings", "prompts"};
    if (jp.empty()) throw BadRequest{"prompts is empty", "prompts"};
    if (jp.size() > 128) throw BadRequest{"Maximum number of prompts is 128", "prompts"};
    std::vector<std::string> prompts;
    for (const auto& p : jp) {
      if (!p.is_string()) throw BadRequest{"prompts is not a list of strings", "prompts"};
      prompts.push_back(p.get<std::string>());
    }
    GenRequest base;
    base.eod = tok_.eod();
    base.max_new_tokens = 64;
    base.sampling.seed = opts_.seed;
    if (j.contains("tokens_to_generate")) {
      const auto& v = j["tokens_to_generate"];
      if (!v.is_number_integer() || (!v.is_number_unsigned() && v.get<int64_t>() < 0))
        throw BadRequest{"tokens_to_generate must be an integer greater than or equal to 0", "tokens_to_generate"};
      // Bounded by the context before any arithmetic (2^63 - 1 must not overflow the length check).
      if (v.get<uint64_t>() > static_cast<uint64_t>(P))
        throw BadRequest{str("tokens_to_generate ", v.dump(), " exceeds the model's context (max_position_embeddings ",
                             P, ")"), "tokens_to_generate"};
      base.max_new_tokens = static_cast<int64_t>(v.get<uint64_t>());
    }
    bool logprobs = false;
    if (j.contains("logprobs")) {
      if (!j["logprobs"].is_boolean()) throw BadRequest{"logprobs must be a boolean value", "logprobs"};
      logprobs = j["logprobs"].get<bool>();
    }
    if (j.contains("temperature")) {
      const auto& v = j["temperature"];
      if (!v.is_number() || !(v.get<double>() > 0.0 && v.get<double>() <= 100.0))
        throw BadRequest{"temperature must be a positive number less than or equal to 100.0", "temperature"};
      base.sampling.temperature = v.get<float>();
    }
    if (j.contains("top_k")) {
      if (!uint_at_most(j["top_k"], 1000))
        throw BadRequest{"top_k must be an integer equal to or greater than 0 and less than or equal to 1000", "top_k"};
      base.sampling.top_k = j["top_k"].get<int64_t>();
    }
    if (j.contains("top_p")) {
      const auto& v = j["top_p"];
      if (!v.is_number() || v.get<double>() < 0.0 || v.get<double>() > 1.0)
        throw BadRequest{"top_p must be a number between 0 and 1", "top_p"};
      base.sampling.top_p = v.get<float>();
    }
    if (base.sampling.top_k > 0 && base.sampling.top_p > 0.0f)
      throw BadRequest{"cannot set both top-k and top-p samplings.", "top_p"};
    if (j.contains("random_seed")) {
      const auto& v = j["random_seed"];
      if (!v.is_number_integer() || (!v.is_number_unsigned() && v.get<int64_t>() < 0))
        throw BadRequest{"random_seed must be a non-negative integer", "random_seed"};
      base.sampling.seed = v.get<uint64_t>();
    }
    auto enc = tok_.make_encoder();
    std::vector<std::vector<int32_t>> ids;
    for (const std::string& p : prompts) {
      if (data::find_invalid_utf8(p) >= 0) throw BadRequest{"a prompt is not valid UTF-8", "prompts"};
      ids.push_back(enc->encode(p));
      const int64_t total = static_cast<int64_t>(std::max<size_t>(ids.back().size(), 1)) + base.max_new_tokens;
      if (total > P)
        throw BadRequest{str("Length of prompt + tokens_to_generate longer than allowed: ", total,
                             " tokens > max_position_embeddings ", P), "tokens_to_generate"};
    }
    CancelGuard guard;
    for (size_t i = 0; i < ids.size(); ++i) {
      GenRequest r = base;
      r.prompt = ids[i];
      r.stream = i;
      guard.states.push_back(submit_(std::move(r)));
    }
    wait_all(guard.states);
    guard.armed = false;
    json text = json::array(), segments = json::array(), lps = json::array();
    for (size_t i = 0; i < prompts.size(); ++i) {
      const GenResult g = guard.states[i]->result();
      text.push_back(prompts[i] + tok_.decode(g.generated));
      json seg = json::array();
      for (int32_t t : ids[i]) seg.push_back(tok_.decode(&t, 1));
      for (int32_t t : g.generated) seg.push_back(tok_.decode(&t, 1));
      segments.push_back(seg);
      lps.push_back(g.logprobs);
    }
    json out = {{"text", text}, {"segments", segments}};
    if (logprobs) out["logprobs"] = lps;
    io::HttpResponse r;
    r.body = dump(out);
    return r;
  } catch (const BadRequest& e) {
    return text_error(400, e.message);
  } catch (const Error& e) {  // e.g. what the engine refuses
    return text_error(400, e.message());
  }
}

// ---------------------------------------------------------------------------
// POST /v1/completions (OpenAI)

namespace {

struct Completion {
  std::vector<std::vector<int32_t>> prompts;
  GenRequest base;
  int64_t n = 1;                  // choices per prompt: choice p*n + k draws philox(seed, p*n + k, step)
  std::vector<std::string> stop;  // the text is cut before the first of these
  bool stream = false;
  int64_t logprobs = -1;  // -1: null
  std::string model;
};

}  // namespace

namespace {

// The request checked and its prompts tokenised. Throws BadRequest (or openai::BadRequest for a 404).
Completion parse_completion(const std::string& body, const data::TextTokenizer& tok, const GPTConfig& cfg,
                            const TextGenerationApi::Options& opts) {
  const int64_t P = cfg.max_position_embeddings, V = cfg.vocab_size;
  Completion c;
  const json j = parse_object(body);
  static const char* const kFields[] = {"model",  "prompt",   "max_tokens", "temperature", "top_p", "top_k",
                                        "seed",   "stream",   "logprobs",   "n",           "user",  "echo",
                                        "best_of", "presence_penalty", "frequency_penalty", "stop", "suffix",
                                        "logit_bias"};
  for (auto it = j.begin(); it != j.end(); ++it)
    if (std::find(std::begin(kFields), std::end(kFields), it.key()) == std::end(kFields))
      throw BadRequest{str("unknown field '", it.key(), "'; the fields are model, prompt, max_tokens, temperature, "
                           "top_p, top_k, seed, stream, logprobs, n, stop, user"), it.key()};
  // OpenAI fields this server does not build: only their neutral value is accepted.
  const auto neutral = [&](const char* k, bool ok, const char* only) {
    if (j.contains(k) && !j[k].is_null() && !ok)
      throw BadRequest{str("'", k, "' is not supported by this server (only ", only, ")"), k};
  };
  neutral("best_of", j.value("best_of", json(1)) == json(1), "1");
  neutral("echo", j.value("echo", json(false)) == json(false), "false");
  neutral("presence_penalty", j.value("presence_penalty", json(0)).is_number() &&
                                  j.value("presence_penalty", json(0)).get<double>() == 0.0, "0");
  neutral("frequency_penalty", j.value("frequency_penalty", json(0)).is_number() &&
                                   j.value("frequency_penalty", json(0)).get<double>() == 0.0, "0");
  neutral("suffix", false, "null");
  neutral("logit_bias", j.contains("logit_bias") && j["logit_bias"].is_object() && j["logit_bias"].empty(), "{}");
  if (j.contains("model") && !j["model"].is_string()) throw BadRequest{"model must be a string", "model"};
  if (j.contains("user") && !j["user"].is_string()) throw BadRequest{"user must be a string", "user"};
  c.model = j.contains("model") ? j["model"].get<std::string>() : opts.model_name;
  if (c.model != opts.model_name)
    throw openai::BadRequest{str("The model `", c.model, "` does not exist (this server serves `", opts.model_name, "`)"),
                             "model", 404, "model_not_found"};
  if (j.contains("n") && !j["n"].is_null()) {
    if (!j["n"].is_number_integer() || j["n"].get<int64_t>() < 1 || j["n"].get<int64_t>() > 16)
      throw BadRequest{"n must be an integer in [1, 16]", "n"};
    c.n = j["n"].get<int64_t>();
  }
  if (j.contains("stop") && !j["stop"].is_null()) {
    const json& v = j["stop"];
    const json list = v.is_array() ? v : json::array({v});
    if (list.size() > 4) throw BadRequest{"stop takes at most 4 sequences", "stop"};
    for (const json& s : list) {
      if (!s.is_string() || s.get<std::string>().empty()) throw BadRequest{"stop must be a non-empty string or a list of them", "stop"};
      c.stop.push_back(s.get<std::string>());
    }
  }

  if (!j.contains("prompt")) throw BadRequest{"prompt is required", "prompt"};
  const json& jp = j["prompt"];
  auto enc = tok.make_encoder();
  const auto encode = [&](const json& s) {
    const std::string t = s.get<std::string>();
    if (data::find_invalid_utf8(t) >= 0) throw BadRequest{"prompt is not valid UTF-8", "prompt"};
    return enc->encode(t);
  };
  const auto ids_of = [&](const json& a) {
    std::vector<int32_t> ids;
    for (const auto& t : a) {
      if (!uint_at_most(t, static_cast<uint64_t>(V - 1)))
        throw BadRequest{str("prompt token ", t.dump(), " is not a token id in [0, ", V, ")"), "prompt"};
      ids.push_back(t.get<int32_t>());
    }
    return ids;
  };
  const char* shape = "prompt must be a string, a list of strings, a list of token ids or a list of such lists";
  if (jp.is_string()) {
    c.prompts.push_back(encode(jp));
  } else if (jp.is_array() && !jp.empty()) {
    if (jp[0].is_number()) {  // one prompt of token ids (its length is the model's to bound, not the list's)
      c.prompts.push_back(ids_of(jp));
    } else {
      if (jp.size() > 128) throw BadRequest{"at most 128 prompts per request", "prompt"};
      for (const auto& p : jp) {
        if (p.is_string()) c.prompts.push_back(encode(p));
        else if (p.is_array() && !p.empty()) c.prompts.push_back(ids_of(p));
        else throw BadRequest{shape, "prompt"};
      }
    }
  } else {
    throw BadRequest{shape, "prompt"};
  }

  GenRequest& b = c.base;
  b.eod = tok.eod();
  b.max_new_tokens = 16;
  b.sampling.seed = opts.seed;
  if (j.contains("max_tokens") && !j["max_tokens"].is_null()) {
    if (!uint_at_most(j["max_tokens"], static_cast<uint64_t>(P)))
      throw BadRequest{str("max_tokens must be an integer in [0, ", P, "] (the model's max_position_embeddings)"),
                       "max_tokens"};
    b.max_new_tokens = j["max_tokens"].get<int64_t>();
  }
  if (j.contains("temperature") && !j["temperature"].is_null()) {
    const auto& v = j["temperature"];
    if (!v.is_number() || !(v.get<double>() >= 0.0 && v.get<double>() <= 100.0))
      throw BadRequest{"temperature must be a number in [0, 100] (0: greedy)", "temperature"};
    b.sampling.temperature = v.get<float>();
  }
  if (j.contains("top_p") && !j["top_p"].is_null()) {
    const auto& v = j["top_p"];
    if (!v.is_number() || !(v.get<double>() > 0.0 && v.get<double>() <= 1.0))
      throw BadRequest{"top_p must be a number in (0, 1] (1: off)", "top_p"};
    b.sampling.top_p = v.get<double>() >= 1.0 ? 0.0f : v.get<float>();
  }
  if (j.contains("top_k") && !j["top_k"].is_null()) {
    const auto& v = j["top_k"];
    const bool off = v.is_number_integer() && !v.is_number_unsigned() && v.get<int64_t>() == -1;
    if (!off && !uint_at_most(v, static_cast<uint64_t>(V)))
      throw BadRequest{str("top_k must be an integer: -1 or 0 (off), or 1..", V), "top_k"};
    b.sampling.top_k = off ? 0 : v.get<int64_t>();
  }
  if (j.contains("seed") && !j["seed"].is_null()) {
    const auto& v = j["seed"];
    if (!v.is_number_integer() || (!v.is_number_unsigned() && v.get<int64_t>() < 0))
      throw BadRequest{"seed must be a non-negative integer", "seed"};
    b.sampling.seed = v.get<uint64_t>();
  }
  if (j.contains("stream") && !j["stream"].is_null()) {
    if (!j["stream"].is_boolean()) throw BadRequest{"stream must be a boolean", "stream"};
    c.stream = j["stream"].get<bool>();
  }
  if (j.contains("logprobs") && !j["logprobs"].is_null()) {
    if (!uint_at_most(j["logprobs"], 20)) throw BadRequest{"logprobs must be null or an integer in [0, 20]", "logprobs"};
    c.logprobs = j["logprobs"].get<int64_t>();
    b.top_logprobs = c.logprobs;
  }
  for (const auto& p : c.prompts) {
    const int64_t T = std::max<int64_t>(static_cast<int64_t>(p.size()), 1);
    if (T + b.max_new_tokens > P)
      throw BadRequest{str("This model's maximum context length is ", P, " tokens, however you requested ",
                           T + b.max_new_tokens, " tokens (", T, " in your prompt; ", b.max_new_tokens,
                           " for the completion)"), "max_tokens"};
  }
  return c;
}

}  // namespace

io::HttpResponse TextGenerationApi::completions(const io::HttpRequest& req) {
  Completion c;
  try {
    c = parse_completion(req.body, tok_, cfg_, opts_);
  } catch (const BadRequest& e) {
    return openai_error(400, e.message, e.param);
  } catch (const openai::BadRequest& e) {
    return openai::error_response(e);
  }

  if (c.prompts.size() * static_cast<size_t>(c.n) > 128)
    return openai_error(400, "at most 128 choices per request (prompts x n)", "n");
  const auto arrived = openai::Clock::now();
  auto guard = std::make_shared<CancelGuard>();
  auto streams = std::make_shared<std::vector<openai::ChoiceStream>>();
  try {
    for (size_t p = 0; p < c.prompts.size(); ++p)
      for (int64_t k = 0; k < c.n; ++k) {
        GenRequest r = c.base;
        r.prompt = c.prompts[p];
        r.stream = p * static_cast<size_t>(c.n) + static_cast<size_t>(k);
        guard->states.push_back(submit_(std::move(r)));
        streams->emplace_back(guard->states.back(), tok_, c.stop, tok_.eod(), opts_.metrics, arrived);
      }
  } catch (const Error& e) {
    return openai_error(400, e.message(), "prompt");
  }
  const std::string id = str("cmpl-", next_id_++);
  const int64_t created = std::chrono::duration_cast<std::chrono::seconds>(
                              std::chrono::system_clock::now().time_since_epoch()).count();
  int64_t prompt_tokens = 0;
  for (const auto& p : c.prompts) prompt_tokens += std::max<int64_t>(static_cast<int64_t>(p.size()), 1);
  const data::TextTokenizer& tok = tok_;
  const auto token_text = [&tok](int32_t t) { return tok.decode(&t, 1); };
  const auto top_json = [token_text](const TopLogprobs& top) {
    json o = json::object();
    for (const auto& [t, lp] : top) o[token_text(t)] = lp;
    return o;
  };
  const int64_t logprobs = c.logprobs;
  // The logprobs object of `tokens`, whose first token's text starts at byte `offset` of the choice.
  const auto logprobs_json = [token_text, top_json, logprobs](const std::vector<TokenEvent>& tokens, size_t& offset) {
    json toks = json::array(), token_lps = json::array(), tops = json::array(), offsets = json::array();
    for (const TokenEvent& e : tokens) {
      const std::string s = token_text(e.token);
      toks.push_back(s);
      token_lps.push_back(e.logprob);
      tops.push_back(logprobs > 0 ? top_json(e.top) : json(nullptr));
      offsets.push_back(offset);
      offset += s.size();
    }
    return json{{"tokens", toks}, {"token_logprobs", token_lps}, {"top_logprobs", tops}, {"text_offset", offsets}};
  };
  ServerMetrics* metrics = opts_.metrics;
  const auto usage = [prompt_tokens, streams, metrics] {
    int64_t completion = 0;
    for (const openai::ChoiceStream& s : *streams) completion += s.generated();
    if (metrics) metrics->on_tokens(prompt_tokens, completion);
    return json{{"prompt_tokens", prompt_tokens}, {"completion_tokens", completion},
                {"total_tokens", prompt_tokens + completion}};
  };

  if (!c.stream) {
    json choices = json::array();
    for (size_t i = 0; i < streams->size(); ++i) {
      std::string text, finish;
      std::vector<TokenEvent> tokens;
      while (!(*streams)[i].done()) {
        openai::ChoiceUpdate u = (*streams)[i].poll(1.0);
        text += u.text;
        tokens.insert(tokens.end(), u.tokens.begin(), u.tokens.end());
        if (u.done) finish = u.finish_reason;
      }
      size_t offset = 0;
      choices.push_back({{"index", i},
                         {"text", text},
                         {"logprobs", logprobs >= 0 ? logprobs_json(tokens, offset) : json(nullptr)},
                         {"finish_reason", finish}});
    }
    guard->armed = false;
    io::HttpResponse r;
    r.body = dump({{"id", id},
                   {"object", "text_completion"},
                   {"created", created},
                   {"model", c.model},
                   {"choices", choices},
                   {"usage", usage()}});
    return r;
  }

  // Server-sent events: one chunk per token (its text may wait for the rest of a UTF-8 character
  // or for what decides a stop string), a last chunk per choice with its finish_reason, then [DONE].
  auto offsets = std::make_shared<std::vector<size_t>>(streams->size(), 0);
  auto finished = std::make_shared<bool>(false);
  const std::string model = c.model;
  io::HttpResponse r;
  r.content_type = "text/event-stream";
  r.headers.emplace_back("Cache-Control", "no-cache");
  r.stream = [guard, streams, offsets, finished, id, created, model, logprobs, logprobs_json,
              usage](const std::function<bool(const std::string&)>& write) {
    if (*finished) return false;
    const auto chunk = [&](size_t i, const std::string& text, const json& lp, const json& finish) {
      const json j = {{"id", id},
                      {"object", "text_completion"},
                      {"created", created},
                      {"model", model},
                      {"choices", json::array({{{"index", i}, {"text", text}, {"logprobs", lp}, {"finish_reason", finish}}})}};
      return write("data: " + dump(j) + "\n\n");
    };
    bool waited = false;
    for (size_t i = 0; i < streams->size(); ++i) {
      openai::ChoiceStream& cs = (*streams)[i];
      if (cs.done()) continue;
      const openai::ChoiceUpdate u = cs.poll(waited ? 0.0 : 0.05);
      waited = true;
      if (!u.tokens.empty() || (u.done && !u.text.empty())) {
        const json lp = logprobs >= 0 && !u.tokens.empty() ? logprobs_json(u.tokens, (*offsets)[i]) : json(nullptr);
        if (!chunk(i, u.text, lp, u.done ? json(u.finish_reason) : json(nullptr))) return false;
      } else if (u.done && !chunk(i, "", nullptr, u.finish_reason)) {
        return false;
      }
    }
    if (std::all_of(streams->begin(), streams->end(), [](const openai::ChoiceStream& s) { return s.done(); })) {
      guard->armed = false;
      *finished = true;
      usage();
      write("data: [DONE]\n\n");
      return false;
    }
    return true;
  };
  r.abort = [guard] {
    for (auto& s : guard->states) s->cancel();
  };
  return r;
}

io::HttpResponse TextGenerationApi::models(const io::HttpRequest&) {
  io::HttpResponse r;
  r.body = dump({{"object", "list"},
                 {"data", json::array({{{"id", opts_.model_name},
                                        {"object", "model"},
                                        {"created", 0},
                                        {"owned_by", "mpitron"},
                                        {"max_model_len", cfg_.max_position_embeddings}}})}});
  return r;
}

}  // namespace mpitron
