// apps/text_generation_server over loopback: good and bad requests with a tiny
// HTTP client written here, the server keeps serving after errors, and stops
// cleanly on SIGTERM. The model is the PyTorch reference GPT-2 (tests/apps/ref/).
#include <arpa/inet.h>
#include <doctest/doctest.h>
#include <netinet/in.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fcntl.h>

#include <chrono>
#include <nlohmann/json.hpp>
#include <thread>

#include "apps_test_util.h"
#include "io/safetensors.h"
#include "model/inference/inference_load.h"

extern char** environ;

using namespace mpitron;
using apps_test::TempDir;
using apps_test::slurp;

namespace {

struct Reply {
  int status = 0;
  std::string headers, body;
};

// One HTTP/1.1 exchange on 127.0.0.1:port; the raw request is sent as given.
Reply http_raw(int port, const std::string& request) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  REQUIRE(fd >= 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
  REQUIRE(connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
  size_t off = 0;
  while (off < request.size()) {
    const ssize_t n = send(fd, request.data() + off, request.size() - off, MSG_NOSIGNAL);
    REQUIRE(n > 0);
    off += static_cast<size_t>(n);
  }
  std::string in;
  char buf[4096];
  for (ssize_t n; (n = recv(fd, buf, sizeof buf, 0)) > 0;) in.append(buf, static_cast<size_t>(n));
  close(fd);
  Reply r;
  const size_t he = in.find("\r\n\r\n");
  REQUIRE(he != std::string::npos);
  r.headers = in.substr(0, he);
  r.body = in.substr(he + 4);
  REQUIRE(r.headers.rfind("HTTP/1.1 ", 0) == 0);
  r.status = std::stoi(r.headers.substr(9, 3));
  return r;
}

Reply http(int port, const std::string& method, const std::string& path, const std::string& body) {
  return http_raw(port, method + " " + path + " HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n" +
                            "Content-Length: " + std::to_string(body.size()) + "\r\n\r\n" + body);
}

}  // namespace

TEST_CASE("text_generation_server: PUT /api, 400s with reasons, keeps serving, SIGTERM") {
  TempDir tmp("srv");
  const std::string ref = apps_test::kSource + "/tests/apps/ref/";
  {
    const io::Safetensors st = io::read_safetensors(ref + "gpt2_tiny.safetensors");
    auto model = gpt_from_hf_gpt2(st, hf_gpt2_config(st, slurp(ref + "gpt2_tiny_config.json"), 0));
    save_model_checkpoint(tmp / "ckpt", *model, "test");
  }
  // Start the server on a free port; it prints "listening on http://127.0.0.1:PORT".
  const std::string log = tmp / "server.log";
  std::vector<std::string> args = {"apps/text_generation_server", "--load", tmp / "ckpt", "--port", "0"};
  std::vector<char*> argv;
  for (auto& s : args) argv.push_back(s.data());
  argv.push_back(nullptr);
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 1, log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_adddup2(&fa, 1, 2);
  pid_t pid = -1;
  REQUIRE(posix_spawn(&pid, argv[0], &fa, nullptr, argv.data(), environ) == 0);
  posix_spawn_file_actions_destroy(&fa);
  int port = 0;
  for (int i = 0; i < 600 && port == 0; ++i) {  // up to 60 s (a loaded machine)
    const std::string s = slurp(log);
    const size_t p = s.find("listening on http://127.0.0.1:");
    if (p != std::string::npos) port = std::stoi(s.substr(p + 30));
    else std::this_thread::sleep_for(std::chrono::milliseconds(100));
    int st = 0;
    REQUIRE_MESSAGE(waitpid(pid, &st, WNOHANG) == 0, "server exited: ", slurp(log));
  }
  REQUIRE_MESSAGE(port > 0, slurp(log));

  // A good request: Megatron's shape.
  Reply r = http(port, "PUT", "/api",
                 R"({"prompts": ["Hello, my dog", ""], "tokens_to_generate": 5, "top_k": 1, "logprobs": true})");
  REQUIRE_MESSAGE(r.status == 200, r.body);
  CHECK(r.headers.find("Content-Type: application/json") != std::string::npos);
  auto j = nlohmann::json::parse(r.body);
  REQUIRE(j["text"].size() == 2);
  CHECK(j["text"][0].get<std::string>().rfind("Hello, my dog", 0) == 0);
  REQUIRE(j["segments"].size() == 2);
  CHECK(j["segments"][0].size() == 4 + 5);  // "Hello", ",", " my", " dog" + 5 new tokens
  REQUIRE(j["logprobs"].size() == 2);
  CHECK(j["logprobs"][0].size() == 5);
  // Deterministic: greedy twice, and sampling with the same random_seed twice.
  CHECK(http(port, "PUT", "/api", R"({"prompts": ["Hello, my dog", ""], "tokens_to_generate": 5, "top_k": 1})").body ==
        nlohmann::json({{"text", j["text"]}, {"segments", j["segments"]}}).dump());
  const std::string sample = R"({"prompts": ["Once"], "tokens_to_generate": 6, "top_p": 0.9, "random_seed": 5})";
  CHECK(http(port, "PUT", "/api", sample).body == http(port, "PUT", "/api", sample).body);

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
  CHECK(http(port, "GET", "/api", "").status == 405);
  CHECK(http(port, "PUT", "/other", "{}").status == 404);
  CHECK(http_raw(port, "garbage\r\n\r\n").status == 400);
  CHECK(http_raw(port, "PUT /api HTTP/1.1\r\nContent-Length: abc\r\n\r\n").status == 400);
  const Reply again = http(port, "PUT", "/api", R"({"prompts": ["Still"], "tokens_to_generate": 2})");
  CHECK(again.status == 200);

  REQUIRE(kill(pid, SIGTERM) == 0);
  int status = 0;
  REQUIRE(waitpid(pid, &status, 0) == pid);
  CHECK_MESSAGE(WIFEXITED(status), slurp(log));
  CHECK(WEXITSTATUS(status) == 0);
}
