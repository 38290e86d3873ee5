// apps/text_generation_server speaking OpenAI's API as its official client does, over loopback with
// the HTTP client written here (http_client.h); tests/reference/openai_client_check.py sends the same
// requests with the `openai` package itself (its transcript: tests/apps/ref/openai_client_transcript.json).
//  * POST /v1/chat/completions: the prompt is the chat template's rendering (data/chat_template.h),
//    tokenised: usage.prompt_tokens counts it, and greedy chat equals greedy /v1/completions of it;
//    stream (chunk framing, the role first, one finish_reason, include_usage, [DONE]); n with a seed
//    (reproducible, choice 0 = the n=1 answer); stop (cut before it, finish_reason "stop", in the
//    stream too, and in /v1/completions); logprobs/top_logprobs; every bad field a 400 error object
//    naming it; an unknown model 404; unknown routes 404 and other methods 405 as error objects.
//  * a chat answer ends at the template's eos_token (when it is one token);
//  * a template's raise_exception is a 400 with its message; a server without a template answers 400
//    naming the missing template; an unsupported construct stops the server at start-up naming it.
//  * GET /health, GET /v1/models (OpenAI's list), GET /metrics (Prometheus text, counting the above).
// The model is the PyTorch reference GPT-2 (tests/apps/ref/gpt2_tiny*), its chat template the fixture
// tests/apps/ref/gpt2_tiny_tokenizer_config.json.
#include <doctest/doctest.h>

#include <chrono>
#include <fstream>
#include <thread>
#include <nlohmann/json.hpp>

#include "apps_test_util.h"
#include "core/error.h"
#include "data/chat_template.h"
#include "data/tokenizer.h"
#include "http_client.h"
#include "io/safetensors.h"
#include "model/inference/hf_convert.h"
#include "model/inference/inference_load.h"
#include "server_util.h"

using namespace mpitron;
using apps_test::Server;
using apps_test::slurp;
using apps_test::TempDir;
using http_test::http;
using http_test::Reply;
using json = nlohmann::json;

namespace {

const std::string kRef = apps_test::kSource + "/tests/apps/ref/";
const std::string kChatConfig = kRef + "gpt2_tiny_tokenizer_config.json";

std::string make_checkpoint(const TempDir& tmp) {
  const io::Safetensors st = io::read_safetensors(kRef + "gpt2_tiny.safetensors");
  auto model = gpt_from_hf(st, hf_file_config(st, slurp(kRef + "gpt2_tiny_config.json"), 0));
  save_model_checkpoint(tmp / "ckpt", *model, "test");
  return tmp / "ckpt";
}

json post(int port, const std::string& path, const json& body, int want_status = 200) {
  const Reply r = http(port, "POST", path, body.dump());
  CHECK_MESSAGE(r.status == want_status, body.dump(), " -> ", r.body);
  return json::parse(r.body);
}

// The events of a server-sent-events body: each "data: X\n\n"; X parsed unless "[DONE]".
struct Sse {
  std::vector<json> chunks;
  bool done_last = false;
  bool framed = true;  // every event is "data: ...\n\n" and nothing else is there
};
Sse parse_sse(const std::string& body) {
  Sse s;
  size_t at = 0;
  while (at < body.size()) {
    if (body.compare(at, 6, "data: ") != 0) {
      s.framed = false;
      break;
    }
    const size_t end = body.find("\n\n", at);
    if (end == std::string::npos) {
      s.framed = false;
      break;
    }
    const std::string ev = body.substr(at + 6, end - at - 6);
    at = end + 2;
    if (ev == "[DONE]") {
      s.done_last = at == body.size();
      break;
    }
    s.chunks.push_back(json::parse(ev));
  }
  return s;
}

// The answer without what differs between two identical requests (the id and the time).
json stable(json j) {
  j.erase("id");
  j.erase("created");
  return j;
}

const json kMessages = json::array({{{"role", "system"}, {"content", "You are terse."}},
                                    {{"role", "user"}, {"content", "Name a colour."}}});

}  // namespace

TEST_CASE("text_generation_server: OpenAI chat completions, completions, health, models, metrics") {
  TempDir tmp("openai");
  const std::string ckpt = make_checkpoint(tmp);
  Server srv({"--load", ckpt, "--inference-dynamic-batching", "--chat-template", kChatConfig}, tmp / "server.log");
  const int port = srv.port;
  int chat_ok = 0;  // 200 answers of /v1/chat/completions, for /metrics

  Reply r = http(port, "GET", "/health", "");
  CHECK(r.status == 200);
  CHECK(json::parse(r.body)["status"] == "ok");
  r = http(port, "GET", "/v1/models", "");
  REQUIRE(r.status == 200);
  const json models = json::parse(r.body);
  CHECK(models["object"] == "list");
  CHECK(models["data"][0]["id"] == "ckpt");
  CHECK(models["data"][0]["object"] == "model");

  // The prompt is the template's rendering, tokenised as is.
  const data::Tokenizer gpt2(apps_test::kSource + "/assets/gpt2/gpt2-vocab.json",
                             apps_test::kSource + "/assets/gpt2/gpt2-merges.txt");
  const std::string rendered = data::ChatTemplate::load(kChatConfig).apply(nlohmann::ordered_json::parse(kMessages.dump()), true);
  CHECK(rendered == "System: You are terse.\nUser: Name a colour.\nAssistant:");
  const int64_t prompt_tokens = static_cast<int64_t>(gpt2.encode(rendered).size());

  SUBCASE("plain, greedy: the completion of the rendered prompt; usage") {
    const json c = post(port, "/v1/chat/completions", {{"model", "ckpt"}, {"messages", kMessages}, {"max_tokens", 6}, {"temperature", 0}});
    ++chat_ok;
    CHECK(c["object"] == "chat.completion");
    CHECK(c["id"].get<std::string>().rfind("chatcmpl-", 0) == 0);
    CHECK(c["model"] == "ckpt");
    REQUIRE(c["choices"].size() == 1);
    CHECK(c["choices"][0]["index"] == 0);
    CHECK(c["choices"][0]["message"]["role"] == "assistant");
    CHECK(c["choices"][0]["logprobs"].is_null());
    CHECK(c["choices"][0]["finish_reason"] == "length");
    CHECK(c["usage"]["prompt_tokens"] == prompt_tokens);
    CHECK(c["usage"]["completion_tokens"] == 6);
    CHECK(c["usage"]["total_tokens"] == prompt_tokens + 6);
    const json t = post(port, "/v1/completions", {{"prompt", rendered}, {"max_tokens", 6}, {"temperature", 0}});
    CHECK(c["choices"][0]["message"]["content"] == t["choices"][0]["text"]);
    // max_completion_tokens is the same limit (and wins over max_tokens).
    const json m = post(port, "/v1/chat/completions",
                        {{"messages", kMessages}, {"max_completion_tokens", 2}, {"max_tokens", 9}, {"temperature", 0}});
    ++chat_ok;
    CHECK(m["usage"]["completion_tokens"] == 2);
    // One prompt of token ids longer than the 128-prompt limit on a list of prompts is one prompt.
    const json ids = post(port, "/v1/completions", {{"prompt", std::vector<int>(200, 464)}, {"max_tokens", 2}, {"temperature", 0}});
    CHECK_MESSAGE(ids["usage"]["prompt_tokens"] == 200, ids.dump());
  }

  SUBCASE("stream: role first, content deltas, one finish_reason, usage, [DONE]") {
    const json plain = post(port, "/v1/chat/completions", {{"messages", kMessages}, {"max_tokens", 7}, {"temperature", 0}});
    r = http(port, "POST", "/v1/chat/completions",
             json({{"messages", kMessages}, {"max_tokens", 7}, {"temperature", 0}, {"stream", true},
                   {"stream_options", {{"include_usage", true}}}}).dump());
    chat_ok += 2;
    REQUIRE(r.status == 200);
    CHECK(r.headers.find("text/event-stream") != std::string::npos);
    const Sse s = parse_sse(r.body);
    CHECK(s.framed);
    CHECK(s.done_last);
    REQUIRE(s.chunks.size() >= 3);
    CHECK(s.chunks[0]["choices"][0]["delta"]["role"] == "assistant");
    std::string content;
    int finishes = 0;
    for (size_t k = 0; k + 1 < s.chunks.size(); ++k) {
      const json& ch = s.chunks[k];
      CHECK(ch["object"] == "chat.completion.chunk");
      CHECK(ch["id"] == s.chunks[0]["id"]);
      CHECK(ch["usage"].is_null());
      REQUIRE(ch["choices"].size() == 1);
      const json& d = ch["choices"][0]["delta"];
      if (d.contains("content")) content += d["content"].get<std::string>();
      if (!ch["choices"][0]["finish_reason"].is_null()) {
        ++finishes;
        CHECK(ch["choices"][0]["finish_reason"] == "length");
      }
    }
    CHECK(finishes == 1);
    CHECK(s.chunks.size() == 1 + 7 + 1 + 1);  // role, a chunk per token, the finish, the usage
    CHECK(content == plain["choices"][0]["message"]["content"].get<std::string>());
    const json& last = s.chunks.back();
    CHECK(last["choices"].empty());
    CHECK(last["usage"] == plain["usage"]);
    // Without include_usage no chunk has a usage key.
    r = http(port, "POST", "/v1/chat/completions",
             json({{"messages", kMessages}, {"max_tokens", 2}, {"stream", true}}).dump());
    ++chat_ok;
    const Sse s2 = parse_sse(r.body);
    CHECK(s2.done_last);
    for (const json& ch : s2.chunks) CHECK(!ch.contains("usage"));
  }

  SUBCASE("n with a seed: reproducible choices; choice 0 is the n=1 answer") {
    const json req = {{"messages", kMessages}, {"max_tokens", 5}, {"n", 2}, {"seed", 11}, {"temperature", 1}};
    const json a = post(port, "/v1/chat/completions", req), b = post(port, "/v1/chat/completions", req);
    chat_ok += 2;
    REQUIRE(a["choices"].size() == 2);
    CHECK(a["choices"][0]["index"] == 0);
    CHECK(a["choices"][1]["index"] == 1);
    CHECK(stable(a) == stable(b));
    CHECK(a["choices"][0]["message"] != a["choices"][1]["message"]);
    CHECK(a["usage"]["prompt_tokens"] == prompt_tokens);
    CHECK(a["usage"]["completion_tokens"] == 10);
    json one = req;
    one["n"] = 1;
    CHECK(post(port, "/v1/chat/completions", one)["choices"][0] == a["choices"][0]);
    one["seed"] = 12;
    CHECK(post(port, "/v1/chat/completions", one)["choices"][0] != a["choices"][0]);
    chat_ok += 2;
    // /v1/completions takes n too: prompt p, choice k is choices[p*n + k].
    const json t = post(port, "/v1/completions", {{"prompt", json::array({"a", "b"})}, {"max_tokens", 3}, {"n", 2}, {"seed", 4}});
    REQUIRE(t["choices"].size() == 4);
    for (int i = 0; i < 4; ++i) CHECK(t["choices"][i]["index"] == i);
  }

  SUBCASE("stop: cut before the first stop text, finish_reason stop; streamed and in /v1/completions") {
    const json full = post(port, "/v1/chat/completions", {{"messages", kMessages}, {"max_tokens", 12}, {"temperature", 0}});
    const std::string text = full["choices"][0]["message"]["content"];
    REQUIRE(text.size() >= 8);
    const std::string stop = text.substr(5, 3);  // a stop that starts inside the answer
    const size_t cut = text.find(stop);
    const json req = {{"messages", kMessages}, {"max_tokens", 12}, {"temperature", 0}, {"stop", json::array({"never there", stop})}};
    const json c = post(port, "/v1/chat/completions", req);
    CHECK(c["choices"][0]["message"]["content"] == text.substr(0, cut));
    CHECK(c["choices"][0]["finish_reason"] == "stop");
    CHECK(c["usage"]["completion_tokens"].get<int64_t>() < 12);
    json sreq = req;
    sreq["stream"] = true;
    r = http(port, "POST", "/v1/chat/completions", sreq.dump());
    chat_ok += 3;
    const Sse s = parse_sse(r.body);
    std::string content, finish;
    for (const json& ch : s.chunks) {
      if (ch["choices"][0]["delta"].contains("content")) content += ch["choices"][0]["delta"]["content"].get<std::string>();
      if (!ch["choices"][0]["finish_reason"].is_null()) finish = ch["choices"][0]["finish_reason"];
    }
    CHECK(content == text.substr(0, cut));  // the stop text never went out, not even in part
    CHECK(finish == "stop");
    const json t = post(port, "/v1/completions", {{"prompt", rendered}, {"max_tokens", 12}, {"temperature", 0}, {"stop", stop}});
    CHECK(t["choices"][0]["text"] == text.substr(0, cut));
    CHECK(t["choices"][0]["finish_reason"] == "stop");
    // A stop string longer than what is generated never matches: the whole text, finish "length".
    const json l = post(port, "/v1/chat/completions", {{"messages", kMessages}, {"max_tokens", 12}, {"temperature", 0},
                                                       {"stop", text + "x"}});
    ++chat_ok;
    CHECK(l["choices"][0]["message"]["content"] == text);
    CHECK(l["choices"][0]["finish_reason"] == "length");
  }

  SUBCASE("logprobs and top_logprobs") {
    const json c = post(port, "/v1/chat/completions",
                        {{"messages", kMessages}, {"max_tokens", 4}, {"temperature", 0}, {"logprobs", true}, {"top_logprobs", 3}});
    ++chat_ok;
    const json& content = c["choices"][0]["logprobs"]["content"];
    REQUIRE(content.size() == 4);
    std::string joined;
    for (const json& e : content) {
      const std::string tok = e["token"];
      joined += tok;
      std::string from_bytes;
      for (int b : e["bytes"]) from_bytes += static_cast<char>(b);
      CHECK(from_bytes == tok);
      CHECK(e["logprob"].get<double>() <= 0.0);
      REQUIRE(e["top_logprobs"].size() == 3);
      CHECK(e["top_logprobs"][0]["token"] == tok);  // greedy: the chosen token is the most likely
      CHECK(e["top_logprobs"][0]["logprob"] == e["logprob"]);
      CHECK(e["top_logprobs"][1]["logprob"].get<double>() <= e["top_logprobs"][0]["logprob"].get<double>());
    }
    CHECK(joined == c["choices"][0]["message"]["content"].get<std::string>());
  }

  SUBCASE("bad requests: OpenAI's error object naming the field; unknown model 404; routes 404/405") {
    const std::vector<std::tuple<json, int, std::string>> bad = {
        {{{"max_tokens", 3}}, 400, "messages"},
        {{{"messages", json::array()}}, 400, "messages"},
        {{{"messages", "hi"}}, 400, "messages"},
        {{{"messages", json::array({{{"content", "no role"}}})}}, 400, "messages"},
        {{{"messages", json::array({{{"role", "user"}, {"content", 5}}})}}, 400, "messages"},
        {{{"messages", kMessages}, {"n", 0}}, 400, "n"},
        {{{"messages", kMessages}, {"n", 17}}, 400, "n"},
        {{{"messages", kMessages}, {"stop", json::array({"a", "b", "c", "d", "e"})}}, 400, "stop"},
        {{{"messages", kMessages}, {"stop", 3}}, 400, "stop"},
        {{{"messages", kMessages}, {"top_logprobs", 2}}, 400, "top_logprobs"},
        {{{"messages", kMessages}, {"logprobs", true}, {"top_logprobs", 21}}, 400, "top_logprobs"},
        {{{"messages", kMessages}, {"temperature", -1}}, 400, "temperature"},
        {{{"messages", kMessages}, {"top_p", 0}}, 400, "top_p"},
        {{{"messages", kMessages}, {"seed", -1}}, 400, "seed"},
        {{{"messages", kMessages}, {"max_tokens", 1000}}, 400, "max_tokens"},
        {{{"messages", kMessages}, {"max_completion_tokens", -2}}, 400, "max_completion_tokens"},
        {{{"messages", kMessages}, {"stream", "yes"}}, 400, "stream"},
        {{{"messages", kMessages}, {"stream_options", {{"include_usage", true}}}}, 400, "stream_options"},
        {{{"messages", kMessages}, {"presence_penalty", 0.5}}, 400, "presence_penalty"},
        {{{"messages", kMessages}, {"tools", json::array({{{"type", "function"}}})}}, 400, "tools"},
        {{{"messages", kMessages}, {"messagez", 1}}, 400, "messagez"},
        {{{"messages", kMessages}, {"chat_template_kwargs", 3}}, 400, "chat_template_kwargs"},
        {{{"messages", kMessages}, {"model", "gpt-4"}}, 404, "model"},
    };
    for (const auto& [body, status, param] : bad) {
      const Reply b = http(port, "POST", "/v1/chat/completions", body.dump());
      CHECK_MESSAGE(b.status == status, body.dump(), " -> ", b.body);
      const json e = json::parse(b.body)["error"];
      CHECK_MESSAGE(e["type"] == "invalid_request_error", b.body);
      CHECK_MESSAGE(e["param"] == param, body.dump(), " -> ", b.body);
      CHECK(!e["message"].get<std::string>().empty());
      CHECK(e.contains("code"));
    }
    CHECK(json::parse(http(port, "POST", "/v1/chat/completions", R"({"messages": [{"role": "user", "content": "x"}], "model": "m"})").body)
              ["error"]["code"] == "model_not_found");
    CHECK(http(port, "POST", "/v1/completions", R"({"prompt": "a", "model": "gpt-4"})").status == 404);
    r = http(port, "POST", "/v1/chat/completions", "{not json");
    CHECK(r.status == 400);
    CHECK(json::parse(r.body)["error"]["type"] == "invalid_request_error");
    r = http(port, "GET", "/v1/chat/completions", "");
    CHECK(r.status == 405);
    CHECK(json::parse(r.body)["error"]["type"] == "invalid_request_error");
    r = http(port, "POST", "/v1/nothing", "{}");
    CHECK(r.status == 404);
    CHECK(json::parse(r.body)["error"]["message"].get<std::string>().find("/v1/nothing") != std::string::npos);
  }

  SUBCASE("metrics: Prometheus text counting what was served") {
    for (int i = 0; i < 2; ++i) post(port, "/v1/chat/completions", {{"messages", kMessages}, {"max_tokens", 3}});
    chat_ok += 2;
    http(port, "GET", "/no/such/path", "");
    // The gauges are the engine's snapshot after its latest step, and a response is counted once it
    // has gone out (on its connection's thread): the last answers may arrive a moment before both.
    const std::string chat_series =
        str("\nmpitron_http_requests_total{method=\"POST\",path=\"/v1/chat/completions\",status=\"200\"} ", chat_ok, "\n");
    for (int i = 0; i < 100; ++i) {
      r = http(port, "GET", "/metrics", "");
      if (r.body.find("\nmpitron_requests_running 0\n") != std::string::npos && r.body.find(chat_series) != std::string::npos &&
          r.body.find("path=\"other\",status=\"404\"} 1\n") != std::string::npos)
        break;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    REQUIRE(r.status == 200);
    CHECK(r.headers.find("text/plain") != std::string::npos);
    const std::string m = r.body;
    const auto value = [&m](const std::string& series) {
      const size_t at = m.find("\n" + series + " ");
      REQUIRE_MESSAGE(at != std::string::npos, series, "\n", m);
      return std::stod(m.substr(at + series.size() + 2));
    };
    CHECK(value("mpitron_http_requests_total{method=\"POST\",path=\"/v1/chat/completions\",status=\"200\"}") == chat_ok);
    CHECK(value("mpitron_http_requests_total{method=\"GET\",path=\"other\",status=\"404\"}") == 1);
    CHECK(value("mpitron_prompt_tokens_total") >= 2 * prompt_tokens);
    CHECK(value("mpitron_generation_tokens_total") >= 6);
    CHECK(value("mpitron_time_to_first_token_seconds_count") >= 2);
    CHECK(value("mpitron_time_to_first_token_seconds_bucket{le=\"+Inf\"}") == value("mpitron_time_to_first_token_seconds_count"));
    CHECK(value("mpitron_time_per_output_token_seconds_count") >= 4);
    CHECK(value("mpitron_kv_cache_blocks_total") > 0);
    CHECK(value("mpitron_kv_cache_blocks_used") == 0);
    CHECK(value("mpitron_requests_running") == 0);
    CHECK(value("mpitron_engine_steps_total") > 0);
    CHECK(m.find("# TYPE mpitron_time_to_first_token_seconds histogram") != std::string::npos);
  }
  CHECK(srv.stop() == 0);
}

TEST_CASE("text_generation_server: chat templates that raise, a model without one, one that does not parse") {
  TempDir tmp("openai_tmpl");
  const std::string ckpt = make_checkpoint(tmp);
  {  // Gemma's template refuses a system message: a 400 with its words; without one it renders.
    Server srv({"--load", ckpt, "--chat-template", apps_test::kSource + "/tests/data/chat_templates/gemma.jinja"},
               tmp / "gemma.log");
    const json e = post(srv.port, "/v1/chat/completions", {{"messages", kMessages}}, 400)["error"];
    CHECK(e["message"].get<std::string>().find("System role not supported") != std::string::npos);
    CHECK(e["param"] == "messages");
    const json ok = post(srv.port, "/v1/chat/completions",
                         {{"messages", json::array({{{"role", "user"}, {"content", "hi"}}})}, {"max_tokens", 2}});
    CHECK(ok["usage"]["completion_tokens"] == 2);
    CHECK(srv.stop() == 0);
  }
  {  // A chat answer ends at the template's eos_token when that is one token: make the third greedy
     // token of the fixture's answer the eos_token of a copy of its config.
    std::vector<std::string> tokens;
    {
      Server srv({"--load", ckpt, "--chat-template", kChatConfig}, tmp / "eos_a.log");
      const json c = post(srv.port, "/v1/chat/completions",
                          {{"messages", kMessages}, {"max_tokens", 6}, {"temperature", 0}, {"logprobs", true}});
      for (const json& e : c["choices"][0]["logprobs"]["content"]) tokens.push_back(e["token"]);
      CHECK(srv.stop() == 0);
    }
    REQUIRE(tokens.size() == 6);
    const data::Tokenizer gpt2(apps_test::kSource + "/assets/gpt2/gpt2-vocab.json",
                               apps_test::kSource + "/assets/gpt2/gpt2-merges.txt");
    REQUIRE(gpt2.encode(tokens[2]).size() == 1);
    REQUIRE(tokens[0] != tokens[2]);
    REQUIRE(tokens[1] != tokens[2]);
    json cfg = json::parse(slurp(kChatConfig));
    cfg["eos_token"] = tokens[2];
    {
      std::ofstream f(tmp / "eos_config.json");
      f << cfg.dump();
    }
    Server srv({"--load", ckpt, "--chat-template", tmp / "eos_config.json"}, tmp / "eos_b.log");
    const json c = post(srv.port, "/v1/chat/completions", {{"messages", kMessages}, {"max_tokens", 6}, {"temperature", 0}});
    CHECK(c["choices"][0]["message"]["content"] == tokens[0] + tokens[1]);
    CHECK(c["choices"][0]["finish_reason"] == "stop");
    CHECK(c["usage"]["completion_tokens"] == 3);  // the eos token is generated, not shown
    CHECK(srv.stop() == 0);
  }
  {  // GPT-2 publishes no template: chat completions say so, the rest serves on.
    Server srv({"--load", ckpt}, tmp / "none.log");
    const json e = post(srv.port, "/v1/chat/completions", {{"messages", kMessages}}, 400)["error"];
    CHECK(e["message"].get<std::string>().find("no chat template") != std::string::npos);
    CHECK(e["message"].get<std::string>().find("--chat-template") != std::string::npos);
    CHECK(e["code"] == "no_chat_template");
    CHECK(post(srv.port, "/v1/completions", {{"prompt", "a"}, {"max_tokens", 1}})["choices"].size() == 1);
    CHECK(srv.stop() == 0);
  }
  // A construct outside the subset: the server does not start, and says which and where.
  apps_test::TempDir d("openai_bad");
  const std::string bad = d / "bad.jinja";
  {
    std::ofstream f(bad);
    f << "{% for m in messages %}\n{{ m.content | wordwrap(10) }}\n{% endfor %}";
  }
  const int rc = apps_test::run_app("text_generation_server", "--load " + ckpt + " --port 0 --chat-template " + bad,
                                    tmp / "bad.log");
  CHECK(rc != 0);
  const std::string log = slurp(tmp / "bad.log");
  CHECK_MESSAGE(log.find("unknown filter 'wordwrap'") != std::string::npos, log);
  CHECK_MESSAGE(log.find(bad) != std::string::npos, log);
  CHECK_MESSAGE(log.find("line 2") != std::string::npos, log);
}
