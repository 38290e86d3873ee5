// apps/text_generation_server over loopback, with an HTTP client written here (http_client.h):
//  * Megatron's PUT /api and OpenAI's POST /v1/completions (plain, token-id prompts, logprobs,
//    server-sent events), every bad request a 400 naming the field, the server serving after each;
//  * dynamic batching: 32 concurrent clients get exactly the answers they get one at a time
//    (greedy and seeded samples), with a KV pool too small for all of them (pauses in the log);
//  * prefix caching: clients sharing a long prompt prefix get the answers of the server without it;
//  * a client sending its header one byte a second does not delay the others; keep-alive; 413;
//    a streaming client that vanishes is cancelled; SIGTERM exits 0.
// The model is the PyTorch reference GPT-2 (tests/apps/ref/).
#include <doctest/doctest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <nlohmann/json.hpp>
#include <thread>

#include "apps_test_util.h"
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
using http_test::http_raw;
using http_test::Reply;
using json = nlohmann::json;

namespace {

std::string make_checkpoint(const TempDir& tmp) {
  const std::string ref = apps_test::kSource + "/tests/apps/ref/";
  const io::Safetensors st = io::read_safetensors(ref + "gpt2_tiny.safetensors");
  auto model = gpt_from_hf(st, hf_file_config(st, slurp(ref + "gpt2_tiny_config.json"), 0));
  save_model_checkpoint(tmp / "ckpt", *model, "test");
  return tmp / "ckpt";
}

// The answer without what differs between two identical requests (the id and the time).
std::string stable(const std::string& body) {
  json j = json::parse(body);
  j.erase("id");
  j.erase("created");
  return j.dump();
}

double seconds_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

}  // namespace

TEST_CASE("text_generation_server: PUT /api and POST /v1/completions, 400s naming the field, keeps serving, SIGTERM") {
  TempDir tmp("srv");
  Server srv({"--load", make_checkpoint(tmp)}, tmp / "server.log");  // one request at a time (Megatron's default)
  const int port = srv.port;

  // Megatron's shape.
  Reply r = http(port, "PUT", "/api",
                 R"({"prompts": ["Hello, my dog", ""], "tokens_to_generate": 5, "top_k": 1, "logprobs": true})");
  REQUIRE_MESSAGE(r.status == 200, r.body);
  CHECK(r.headers.find("Content-Type: application/json") != std::string::npos);
  auto j = json::parse(r.body);
  REQUIRE(j["text"].size() == 2);
  CHECK(j["text"][0].get<std::string>().rfind("Hello, my dog", 0) == 0);
  REQUIRE(j["segments"].size() == 2);
  CHECK(j["segments"][0].size() == 4 + 5);  // "Hello", ",", " my", " dog" + 5 new tokens
  REQUIRE(j["logprobs"].size() == 2);
  CHECK(j["logprobs"][0].size() == 5);
  // Deterministic: greedy twice, and sampling with the same random_seed twice.
  CHECK(http(port, "PUT", "/api", R"({"prompts": ["Hello, my dog", ""], "tokens_to_generate": 5, "top_k": 1})").body ==
        json({{"text", j["text"]}, {"segments", j["segments"]}}).dump());
  const std::string sample = R"({"prompts": ["Once"], "tokens_to_generate": 6, "top_p": 0.9, "random_seed": 5})";
  CHECK(http(port, "PUT", "/api", sample).body == http(port, "PUT", "/api", sample).body);

  // OpenAI's completions: the same greedy tokens as /api, usage, logprobs.
  r = http(port, "POST", "/v1/completions", R"({"prompt": "Hello, my dog", "max_tokens": 5, "temperature": 0,
                                                 "logprobs": 2, "model": "ckpt"})");
  REQUIRE_MESSAGE(r.status == 200, r.body);
  auto c = json::parse(r.body);
  CHECK(c["object"] == "text_completion");
  CHECK(c["model"] == "ckpt");
  REQUIRE(c["choices"].size() == 1);
  CHECK("Hello, my dog" + c["choices"][0]["text"].get<std::string>() == j["text"][0].get<std::string>());
  CHECK(c["choices"][0]["finish_reason"] == "length");
  CHECK(c["usage"]["prompt_tokens"] == 4);
  CHECK(c["usage"]["completion_tokens"] == 5);
  CHECK(c["usage"]["total_tokens"] == 9);
  const auto& lp = c["choices"][0]["logprobs"];
  REQUIRE(lp["tokens"].size() == 5);
  for (size_t i = 0; i < 5; ++i) {
    CHECK(std::abs(lp["token_logprobs"][i].get<double>() - j["logprobs"][0][i].get<double>()) < 1e-6);
    CHECK(lp["top_logprobs"][i].size() == 2);
  }
  // Token-id prompts and lists of prompts.
  r = http(port, "POST", "/v1/completions", R"({"prompt": [[15496, 11], "Hello,"], "max_tokens": 3, "temperature": 0})");
  REQUIRE_MESSAGE(r.status == 200, r.body);
  c = json::parse(r.body);
  REQUIRE(c["choices"].size() == 2);
  CHECK(c["choices"][0]["text"] == c["choices"][1]["text"]);  // "Hello," is 15496, 11
  // Streaming: the deltas add up to the whole text, then [DONE].
  r = http(port, "POST", "/v1/completions", R"({"prompt": "Hello, my dog", "max_tokens": 5, "temperature": 0, "stream": true})");
  REQUIRE_MESSAGE(r.status == 200, r.body);
  CHECK(r.headers.find("text/event-stream") != std::string::npos);
  std::string streamed, finish;
  size_t events = 0;
  for (size_t at = 0; (at = r.body.find("data: ", at)) != std::string::npos; at += 6) {
    const std::string ev = r.body.substr(at + 6, r.body.find("\n\n", at) - at - 6);
    if (ev == "[DONE]") {
      CHECK(r.body.find("data: ", at + 6) == std::string::npos);  // the last event
      continue;
    }
    const auto e = json::parse(ev);
    streamed += e["choices"][0]["text"].get<std::string>();
    if (!e["choices"][0]["finish_reason"].is_null()) finish = e["choices"][0]["finish_reason"];
    ++events;
  }
  CHECK(r.body.find("data: [DONE]") != std::string::npos);
  CHECK("Hello, my dog" + streamed == j["text"][0].get<std::string>());
  CHECK(finish == "length");
  CHECK(events == 6);  // 5 tokens + the finishing chunk
  r = http(port, "GET", "/v1/models", "");
  CHECK(r.status == 200);
  CHECK(json::parse(r.body)["data"][0]["id"] == "ckpt");

  // Bad requests: 400 with a reason (or 404/405), and the server keeps serving.
  const std::vector<std::pair<std::string, std::string>> bad = {
      {"{not json", "not valid JSON"},
      {R"(["a"])", "JSON object"},
      {R"({"tokens_to_generate": 3})", "prompts argument required"},
      {R"({"prompts": "abc"})", "list of strings"},
      {R"({"prompts": [1, 2]})", "list of strings"},
      {R"({"prompts": []})", "empty"},
      {R"({"prompts": ["a"], "tokens_to_generate": -1})", "tokens_to_generate"},
      {R"({"prompts": ["a"], "tokens_to_generate": "3"})", "tokens_to_generate"},
      {R"({"prompts": ["a"], "temperature": 0})", "temperature"},
      {R"({"prompts": ["a"], "top_k": 5, "top_p": 0.5})", "both top-k and top-p"},
      {R"({"prompts": ["a"], "top_p": 1.5})", "top_p"},
      {R"({"prompts": ["a"], "logprobs": "yes"})", "logprobs"},
      {R"({"prompts": ["a"], "tokens_to_generate": 100000})", "max_position_embeddings"},
      // issue #18: typed, bounded, no overflow, unknown fields named
      {R"({"prompts": ["a"], "tokens_to_generate": 9223372036854775807})", "max_position_embeddings"},
      {R"({"prompts": ["a"], "tokens_to_generate": 18446744073709551615})", "max_position_embeddings"},
      {R"({"prompts": ["a"], "tokens_to_generate": 2.5})", "tokens_to_generate"},
      {R"({"prompts": ["a"], "tokens_to_generat": 3})", "unknown field 'tokens_to_generat'"},
      {R"({"prompts": ["a"], "add_BOS": true})", "field 'add_BOS' is not supported"},
      {R"({"prompts": ["a"], "top_k": 18446744073709551615})", "top_k"},
      {R"({"prompts": ["a"], "top_k": -1})", "top_k"},
      {R"({"prompts": ["a"], "temperature": "1"})", "temperature"},
      {R"({"prompts": ["a"], "temperature": 1e308})", "temperature"},
      {R"({"prompts": ["a"], "random_seed": -1})", "random_seed"},
      {R"({"prompts": ["a"], "random_seed": 1.5})", "random_seed"}};
  for (const auto& [body, why] : bad) {
    const Reply b = http(port, "PUT", "/api", body);
    CHECK_MESSAGE(b.status == 400, body);
    CHECK_MESSAGE(b.body.find(why) != std::string::npos, body, " -> ", b.body);
  }
  // OpenAI errors: {"error": {"message", "type", "param"}} naming the field.
  const std::vector<std::pair<std::string, std::string>> bad_v1 = {
      {"{not json", ""},
      {R"({"max_tokens": 3})", "prompt"},
      {R"({"prompt": 5})", "prompt"},
      {R"({"prompt": []})", "prompt"},
      {R"({"prompt": [99999999]})", "prompt"},
      {R"({"prompt": [[1], 2]})", "prompt"},
      {R"({"prompt": "a", "max_tokens": "3"})", "max_tokens"},
      {R"({"prompt": "a", "max_tokens": 300})", "max_tokens"},
      {R"({"prompt": "a", "max_tokens": 9223372036854775807})", "max_tokens"},
      {R"({"prompt": "a", "max_tokens": 256})", "max_tokens"},  // 1 + 256 > 256 positions
      {R"({"prompt": "a", "temperature": -1})", "temperature"},
      {R"({"prompt": "a", "top_p": 0})", "top_p"},
      {R"({"prompt": "a", "top_k": -2})", "top_k"},
      {R"({"prompt": "a", "top_k": 1.5})", "top_k"},
      {R"({"prompt": "a", "seed": -3})", "seed"},
      {R"({"prompt": "a", "stream": "yes"})", "stream"},
      {R"({"prompt": "a", "logprobs": 50})", "logprobs"},
      {R"({"prompt": "a", "logprobs": true})", "logprobs"},
      {R"({"prompt": "a", "n": 17})", "n"},
      {R"({"prompt": "a", "echo": true})", "echo"},
      {R"({"prompt": "a", "stop": ["a", "b", "c", "d", "e"]})", "stop"},
      {R"({"prompt": "a", "stop": ""})", "stop"},
      {R"({"prompt": "a", "model": 7})", "model"},
      {R"({"prompt": "a", "max_tokenz": 3})", "max_tokenz"}};
  for (const auto& [body, param] : bad_v1) {
    const Reply b = http(port, "POST", "/v1/completions", body);
    CHECK_MESSAGE(b.status == 400, body);
    const auto e = json::parse(b.body)["error"];
    CHECK_MESSAGE(e["type"] == "invalid_request_error", body);
    CHECK_MESSAGE(!e["message"].get<std::string>().empty(), body);
    CHECK_MESSAGE((param.empty() ? e["param"].is_null() : e["param"] == param), body, " -> ", b.body);
  }
  CHECK(http(port, "GET", "/api", "").status == 405);
  CHECK(http(port, "GET", "/v1/completions", "").status == 405);
  CHECK(http(port, "PUT", "/other", "{}").status == 404);
  CHECK(http_raw(port, "garbage\r\n\r\n").status == 400);
  CHECK(http_raw(port, "PUT /api HTTP/1.1\r\nContent-Length: abc\r\n\r\n").status == 400);
  const Reply again = http(port, "PUT", "/api", R"({"prompts": ["Still"], "tokens_to_generate": 2})");
  CHECK(again.status == 200);
  CHECK(srv.stop() == 0);
}

TEST_CASE("dynamic batching: 32 concurrent clients get their one-at-a-time answers, with a KV pool too small for all") {
  TempDir tmp("srv_dyn");
  // 24 KV blocks of 16 positions (2 KiB each): room for ~12 of the 32 requests at once.
  Server srv({"--load", make_checkpoint(tmp), "--inference-dynamic-batching", "--inference-dynamic-batching-block-size",
              "16", "--inference-dynamic-batching-buffer-size-gb", "0.0000458", "--inference-dynamic-batching-max-tokens",
              "64", "--enable-chunked-prefill", "--http-max-body-mb", "1"},
             tmp / "server.log");
  const int port = srv.port;
  REQUIRE_MESSAGE(slurp(srv.log).find("KV cache 24 blocks") != std::string::npos, slurp(srv.log));
  // 32 requests: greedy and seeded samples, through both APIs.
  std::vector<std::pair<std::string, std::string>> reqs;  // (path, body)
  for (int i = 0; i < 32; ++i) {
    const std::string prompt = "Request " + std::to_string(i) + (i % 3 ? " asks the model" : " says hello");
    if (i % 4 == 0)
      reqs.push_back({"/api", json({{"prompts", {prompt}}, {"tokens_to_generate", 20 + i % 5}, {"top_k", 1}}).dump()});
    else if (i % 4 == 1)
      reqs.push_back({"/api", json({{"prompts", {prompt, "second " + prompt}}, {"tokens_to_generate", 16},
                                    {"top_p", 0.9}, {"random_seed", i}}).dump()});
    else if (i % 4 == 2)
      reqs.push_back({"/v1/completions", json({{"prompt", prompt}, {"max_tokens", 24}, {"temperature", 0}}).dump()});
    else
      reqs.push_back({"/v1/completions", json({{"prompt", prompt}, {"max_tokens", 22}, {"temperature", 0.8},
                                               {"top_p", 0.95}, {"seed", 100 + i}, {"logprobs", 1}}).dump()});
  }
  const auto send = [&](size_t i) {
    return http(port, reqs[i].first == "/api" ? "PUT" : "POST", reqs[i].first, reqs[i].second);
  };
  std::vector<std::string> alone(reqs.size());
  for (size_t i = 0; i < reqs.size(); ++i) {
    const Reply r = send(i);
    REQUIRE_MESSAGE(r.status == 200, r.body);
    alone[i] = stable(r.body);
  }
  // A client that connects and sends its request 6 s later (within --http-timeout, 10 s) is
  // answered; the library's keep-alive wait (5 s) used to close it first. It runs beside
  // the 32 clients.
  int late_status = 0;
  std::thread late([&] {
    http_test::Connection c(port);
    std::this_thread::sleep_for(std::chrono::seconds(6));
    const std::string body = R"({"prompts": ["late"], "tokens_to_generate": 1})";
    if (c.send_raw("PUT /api HTTP/1.1\r\nHost: x\r\nContent-Length: " + std::to_string(body.size()) + "\r\n\r\n" + body))
      late_status = c.read_some().find("HTTP/1.1 200") == 0 ? 200 : -1;
  });
  std::vector<std::string> together(reqs.size());
  std::vector<std::thread> clients;
  for (size_t i = 0; i < reqs.size(); ++i)
    clients.emplace_back([&, i] {
      const Reply r = send(i);
      together[i] = r.status == 200 ? stable(r.body) : "HTTP " + std::to_string(r.status) + ": " + r.body;
    });
  for (auto& t : clients) t.join();
  for (size_t i = 0; i < reqs.size(); ++i) CHECK_MESSAGE(together[i] == alone[i], "request ", i, ": ", reqs[i].second);
  late.join();
  CHECK_MESSAGE(late_status == 200, "a request sent 6 s after its connection was not answered");

  // A burst: 128 clients connect at the same moment; every one is answered (with the
  // library's listen backlog of 5, some connections were reset by the kernel).
  {
    std::vector<int> status(128, 0);
    std::atomic<int> ready{0};
    std::vector<std::thread> burst;
    for (size_t i = 0; i < status.size(); ++i)
      burst.emplace_back([&, i] {
        ++ready;
        while (ready < static_cast<int>(status.size())) std::this_thread::yield();
        status[i] = http(port, "PUT", "/api", R"({"prompts": ["burst"], "tokens_to_generate": 1})").status;
      });
    for (auto& t : burst) t.join();
    CHECK_MESSAGE(std::count(status.begin(), status.end(), 200) == 128, "answered ",
                  std::count(status.begin(), status.end(), 200), " of 128");
  }

  // Keep-alive: several requests on one connection.
  {
    http_test::Connection conn(port);
    for (int k = 0; k < 3; ++k) {
      const Reply r = conn.request("POST", "/v1/completions", R"({"prompt": "keep", "max_tokens": 2})");
      CHECK(r.status == 200);
      CHECK(r.headers.find("Connection: close") == std::string::npos);
    }
  }
  // A body over --http-max-body-mb is refused (413) from its Content-Length, and the server goes on.
  CHECK(http_raw(port, "PUT /api HTTP/1.1\r\nHost: x\r\nContent-Length: 2097152\r\n\r\n").status == 413);

  // A slow client (its header one byte a second) does not delay the others: the same
  // requests take about as long while it trickles as they did before it came.
  double before_max = 0;
  for (int k = 0; k < 4; ++k) {
    const auto t0 = std::chrono::steady_clock::now();
    CHECK(send(static_cast<size_t>(k)).status == 200);
    before_max = std::max(before_max, seconds_since(t0));
  }
  std::atomic<bool> stop_slow{false};
  std::atomic<int> slow_sent{0};
  std::thread slow([&] {
    http_test::Connection c(port);
    const std::string head = "PUT /api HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow-Client: trickling one byte a second";
    for (size_t k = 0; k < head.size() && !stop_slow; ++k) {
      if (!c.send_raw(head.substr(k, 1))) break;
      ++slow_sent;
      std::this_thread::sleep_for(std::chrono::seconds(1));
    }
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(1500));
  for (int k = 0; k < 4; ++k) {
    const int sent_before = slow_sent;
    const auto t0 = std::chrono::steady_clock::now();
    const Reply r = send(static_cast<size_t>(k));
    const double dt = seconds_since(t0);
    CHECK(r.status == 200);
    CHECK(stable(r.body) == alone[static_cast<size_t>(k)]);
    CHECK_MESSAGE(dt < 3 * before_max + 1.0, "a request took ", dt, " s while a slow client trickled its header (",
                  before_max, " s before)");
    CHECK(sent_before >= 1);
  }
  const int trickled = slow_sent;
  stop_slow = true;
  slow.join();
  CHECK_MESSAGE(trickled >= 2, "the slow client sent ", trickled, " bytes");

  // A streaming client that goes away after its first event: the server goes on (its request
  // is cancelled when a write fails; the engine counts it).
  {
    const std::string body = R"({"prompt": "Gone", "max_tokens": 240, "stream": true})";
    http_test::Connection c(port);
    c.send_raw("POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: " +
               std::to_string(body.size()) + "\r\n\r\n" + body);
    CHECK(c.read_some().find("HTTP/1.1 200") == 0);
  }
  CHECK(send(2).status == 200);
  CHECK(send(3).status == 200);

  CHECK(srv.stop() == 0);
  const std::string log = slurp(srv.log);
  const size_t at = log.rfind("engine: ");
  REQUIRE_MESSAGE(at != std::string::npos, log);
  const std::string stats = log.substr(at, log.find('\n', at) - at);
  MESSAGE(stats);
  const size_t p = stats.find("pauses ");
  REQUIRE(p != std::string::npos);
  CHECK_MESSAGE(std::stoll(stats.substr(p + 7)) > 0, "no request was paused: ", stats);
  CHECK(stats.find("peak 24 of 24") != std::string::npos);
}

// Prefix caching (--inference-dynamic-batching-prefix-caching, lru): 12 concurrent clients whose
// prompts share ~120 tokens (7 blocks of 16) get the answers (tokens and log-probabilities) of the
// server without it, and so do the same requests sent again one by one (served from the blocks lru
// kept); the engine's exit line counts the shared blocks.
TEST_CASE("prefix caching: clients sharing a long prompt prefix get the answers of the server without it") {
  TempDir tmp("srv_prefix");
  const std::string ck = make_checkpoint(tmp);
  std::string system;
  for (int i = 0; i < 12; ++i) system += "The quick brown fox jumps over the lazy dog. ";
  std::vector<std::string> bodies;
  for (int i = 0; i < 12; ++i)
    bodies.push_back(json({{"prompt", system + "Question " + std::to_string(i) + ":"}, {"max_tokens", 8},
                           {"temperature", 0}, {"logprobs", 1}})
                         .dump());
  // The answers at once, then one by one, and the engine's exit line.
  std::string metrics;  // /metrics of the last server
  const auto serve = [&](const std::vector<std::string>& extra, const std::string& name, std::string& stats) {
    std::vector<std::string> args = {"--load", ck, "--inference-dynamic-batching", "--inference-dynamic-batching-block-size",
                                     "16"};
    args.insert(args.end(), extra.begin(), extra.end());
    Server srv(args, tmp / (name + ".log"));
    std::vector<std::string> out(2 * bodies.size());
    std::vector<std::thread> clients;
    for (size_t i = 0; i < bodies.size(); ++i)
      clients.emplace_back([&, i] {
        const Reply r = http(srv.port, "POST", "/v1/completions", bodies[i]);
        out[i] = r.status == 200 ? stable(r.body) : "HTTP " + std::to_string(r.status) + ": " + r.body;
      });
    for (auto& t : clients) t.join();
    for (size_t i = 0; i < bodies.size(); ++i) {
      const Reply r = http(srv.port, "POST", "/v1/completions", bodies[i]);
      out[bodies.size() + i] = r.status == 200 ? stable(r.body) : "HTTP " + std::to_string(r.status) + ": " + r.body;
    }
    metrics = http(srv.port, "GET", "/metrics", "").body;
    CHECK(srv.stop() == 0);
    const std::string log = slurp(srv.log);
    const size_t at = log.rfind("engine: ");
    stats = at == std::string::npos ? log : log.substr(at, log.find('\n', at) - at);
    return out;
  };
  std::string plain_stats, stats;
  const std::vector<std::string> want = serve({}, "plain", plain_stats);
  const std::vector<std::string> got = serve({"--inference-dynamic-batching-prefix-caching",
                                              "--inference-dynamic-batching-prefix-caching-eviction-policy", "lru"},
                                             "prefix", stats);
  for (size_t i = 0; i < want.size(); ++i) CHECK_MESSAGE(got[i] == want[i], "request ", i % bodies.size());
  MESSAGE(stats);
  CHECK(plain_stats.find("prefix cache") == std::string::npos);
  const size_t p = stats.find("prefix cache (lru): ");
  REQUIRE_MESSAGE(p != std::string::npos, stats);
  // 23 of the 24 requests share the first one's 7 blocks at least.
  CHECK_MESSAGE(std::stoll(stats.substr(p + 20)) >= 23 * 7, stats);
  // /metrics counts the same hits.
  const size_t m = metrics.find("\nmpitron_prefix_cache_hits_total ");
  REQUIRE_MESSAGE(m != std::string::npos, metrics);
  CHECK_MESSAGE(std::stoll(metrics.substr(m + 33)) == std::stoll(stats.substr(p + 20)), metrics, "\n", stats);
}
