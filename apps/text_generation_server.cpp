// text_generation_server — Megatron-LM's REST text generation API on a checkpoint.
//   text_generation_server --load ckpt [--host 127.0.0.1] [--port 5000]
//   curl -X PUT http://127.0.0.1:5000/api -H 'Content-Type: application/json'
//        -d '{"prompts": ["Hello"], "tokens_to_generate": 32, "top_p": 0.9}'
// Request (PUT /api, JSON object; the fields of megatron/text_generation_server.py):
//   prompts             list of 1..128 strings (required; "" is an unconditional sample)
//   tokens_to_generate  int >= 0 (default 64): new tokens per prompt
//   temperature         number in (0, 100] (default 1.0)
//   top_k               int in [0, 1000] (default 0)     top_k == 1: greedy
//   top_p               number in [0, 1] (default 0.0)   top_k and top_p may not both be set
//   logprobs            bool (default false): also return each generated token's log-probability
//   random_seed         int >= 0 (default: the server's --seed)
// Any other field is a 400 naming it (Megatron's other fields — add_BOS, beam_width, … —
// are not built here; a misspelt field must not let a default apply silently). Answer 200 with
//   {"text": [prompt + generated text], "segments": [[token strings of prompt and generation]],
//    "logprobs": [[...]] (only when asked)}
// A bad request gets 400 with the reason as text/plain, any other path 404, another
// method on /api 405; the server keeps serving. Generation stops at <|endoftext|>.
// prompt tokens + tokens_to_generate may not exceed max_position_embeddings (400, as Megatron).
//
// The HTTP/1.1 server is ours (POSIX sockets, no library): one request per connection
// (Connection: close), bodies by Content-Length (no chunked uploads, at most 16 MiB),
// requests served one at a time, 10 s socket timeouts. Binds 127.0.0.1 by default;
// --port 0 picks a free port. It prints "listening on http://HOST:PORT" on stdout once
// ready, and exits cleanly on SIGTERM/SIGINT or after --max-requests requests.
#include "apps/app_main.h"
#include <arpa/inet.h>
#include <mpi.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <boost/program_options.hpp>
#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/json.h"
#include "core/log.h"
#include "data/text_tokenizer.h"
#include "data/tokenizer.h"
#include "model/inference/generate.h"
#include "model/inference/inference_flags.h"
#include "model/inference/inference_load.h"

using namespace mpitron;
namespace po = boost::program_options;

namespace {

volatile std::sig_atomic_t g_stop = 0;
void on_signal(int) { g_stop = 1; }

constexpr size_t kMaxHeader = 64 * 1024;
constexpr size_t kMaxBody = 16 * 1024 * 1024;

struct HttpError {
  int status;
  std::string reason;
};

struct Request {
  std::string method, path, body;
};

struct Response {
  int status = 200;
  std::string content_type = "application/json", body;
  std::string allow;  // for 405
};

const char* status_text(int s) {
  switch (s) {
    case 200: return "OK";
    case 400: return "Bad Request";
    case 404: return "Not Found";
    case 405: return "Method Not Allowed";
    case 408: return "Request Timeout";
    case 411: return "Length Required";
    case 413: return "Payload Too Large";
    case 500: return "Internal Server Error";
    case 501: return "Not Implemented";
    default: return "Error";
  }
}

std::string lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return s;
}

std::string trim(const std::string& s) {
  const size_t b = s.find_first_not_of(" \t"), e = s.find_last_not_of(" \t\r");
  return b == std::string::npos ? "" : s.substr(b, e - b + 1);
}

// Reads one request from fd; throws HttpError for malformed ones.
Request read_request(int fd) {
  std::string buf;
  char chunk[8192];
  size_t header_end;
  while ((header_end = buf.find("\r\n\r\n")) == std::string::npos) {
    if (buf.size() > kMaxHeader) throw HttpError{413, "request header larger than 64 KiB"};
    const ssize_t n = recv(fd, chunk, sizeof chunk, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) throw HttpError{408, "timed out reading the request"};
    if (n <= 0) throw HttpError{400, "connection closed before the end of the request header"};
    buf.append(chunk, static_cast<size_t>(n));
  }
  Request r;
  const std::string head = buf.substr(0, header_end);
  const size_t eol = head.find("\r\n");
  const std::string line = head.substr(0, eol);
  const size_t s1 = line.find(' '), s2 = line.rfind(' ');
  if (s1 == std::string::npos || s2 == s1) throw HttpError{400, "malformed request line"};
  r.method = line.substr(0, s1);
  r.path = line.substr(s1 + 1, s2 - s1 - 1);
  const std::string version = line.substr(s2 + 1);
  if (version != "HTTP/1.1" && version != "HTTP/1.0") throw HttpError{400, "unsupported HTTP version " + version};
  int64_t content_length = -1;
  bool chunked = false;
  size_t pos = eol == std::string::npos ? head.size() : eol + 2;
  while (pos < head.size()) {
    size_t e = head.find("\r\n", pos);
    if (e == std::string::npos) e = head.size();
    const std::string h = head.substr(pos, e - pos);
    pos = e + 2;
    const size_t colon = h.find(':');
    if (colon == std::string::npos) throw HttpError{400, "malformed header line"};
    const std::string key = lower(trim(h.substr(0, colon))), value = trim(h.substr(colon + 1));
    if (key == "content-length") {
      char* end = nullptr;
      errno = 0;
      const long long v = std::strtoll(value.c_str(), &end, 10);
      if (value.empty() || *end != '\0' || errno != 0 || v < 0) throw HttpError{400, "bad Content-Length"};
      content_length = v;
    } else if (key == "transfer-encoding" && lower(value) != "identity") {
      chunked = true;
    }
  }
  if (chunked) throw HttpError{501, "chunked request bodies are not supported; send Content-Length"};
  if (content_length < 0) content_length = 0;
  if (static_cast<size_t>(content_length) > kMaxBody) throw HttpError{413, "request body larger than 16 MiB"};
  r.body = buf.substr(header_end + 4);
  while (r.body.size() < static_cast<size_t>(content_length)) {
    const ssize_t n = recv(fd, chunk, sizeof chunk, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) throw HttpError{408, "timed out reading the request body"};
    if (n <= 0) throw HttpError{400, "connection closed before the end of the body (Content-Length)"};
    r.body.append(chunk, static_cast<size_t>(n));
  }
  r.body.resize(static_cast<size_t>(content_length));
  return r;
}

void send_all(int fd, const std::string& s) {
  size_t off = 0;
  while (off < s.size()) {
    const ssize_t n = send(fd, s.data() + off, s.size() - off, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;  // the client went away: nothing to do
    off += static_cast<size_t>(n);
  }
}

void send_response(int fd, const Response& r) {
  std::string h = str("HTTP/1.1 ", r.status, " ", status_text(r.status), "\r\nContent-Type: ", r.content_type,
                      "\r\nContent-Length: ", r.body.size(), "\r\nConnection: close\r\n");
  if (!r.allow.empty()) h += "Allow: " + r.allow + "\r\n";
  send_all(fd, h + "\r\n" + r.body);
}

class Api {
 public:
  Api(GPT& model, const data::TextTokenizer& tok, uint64_t seed)
      : model_(model), tok_(tok), enc_(tok.make_encoder()), seed_(seed) {}

  Response handle(const Request& req) {
    if (req.path != "/api") return {404, "text/plain", "not found: the API is PUT /api\n", ""};
    if (req.method != "PUT") return {405, "text/plain", "use PUT /api\n", "PUT"};
    try {
      return {200, "application/json", generate_json(req.body), ""};
    } catch (const HttpError& e) {
      return {e.status, "text/plain", e.reason + "\n", ""};
    } catch (const Error& e) {  // e.g. a prompt longer than the model's positions
      return {400, "text/plain", e.message() + "\n", ""};
    }
  }

 private:
  static HttpError bad(const std::string& why) { return HttpError{400, why}; }

  std::string generate_json(const std::string& body) {
    nlohmann::json j;
    try {
      j = parse_json_text(body, "the body");
    } catch (const Error& e) {
      throw bad(e.message());
    }
    if (!j.is_object()) throw bad("the body must be a JSON object");
    static const char* const kFields[] = {"prompts", "tokens_to_generate", "temperature", "top_k",
                                          "top_p",   "logprobs",           "random_seed"};
    static const char* const kMegatronOnly[] = {"add_BOS", "all_probs", "top_p_decay", "top_p_bound",
                                                "stop_on_double_eol", "stop_on_eol", "prevent_newline_after_colon",
                                                "no_log", "beam_width", "length_penalty", "stop_token"};
    for (auto it = j.begin(); it != j.end(); ++it) {
      const std::string& k = it.key();
      if (std::find(std::begin(kFields), std::end(kFields), k) != std::end(kFields)) continue;
      if (std::find(std::begin(kMegatronOnly), std::end(kMegatronOnly), k) != std::end(kMegatronOnly))
        throw bad(str("field '", k, "' is not supported by this server"));
      throw bad(str("unknown field '", k, "'; the fields are prompts, tokens_to_generate, temperature, top_k, top_p, "
                    "logprobs, random_seed"));
    }
    if (!j.contains("prompts")) throw bad("prompts argument required");
    const auto& jp = j["prompts"];
    if (!jp.is_array()) throw bad("prompts is not a list of strings");
    if (jp.empty()) throw bad("prompts is empty");
    if (jp.size() > 128) throw bad("Maximum number of prompts is 128");
    std::vector<std::string> prompts;
    for (const auto& p : jp) {
      if (!p.is_string()) throw bad("prompts is not a list of strings");
      prompts.push_back(p.get<std::string>());
    }
    GenerateOptions o;
    o.eod = tok_.eod();
    o.max_new_tokens = 64;
    o.sampling.seed = seed_;
    if (j.contains("tokens_to_generate")) {
      const auto& v = j["tokens_to_generate"];
      if (!v.is_number_integer() || (!v.is_number_unsigned() && v.get<int64_t>() < 0))
        throw bad("tokens_to_generate must be an integer greater than or equal to 0");
      // Bounded by the context before any arithmetic (2^63 - 1 must not overflow the length check).
      const int64_t P = model_.config().max_position_embeddings;
      if (v.get<uint64_t>() > static_cast<uint64_t>(P))
        throw bad(str("tokens_to_generate ", v.dump(), " exceeds the model's context (max_position_embeddings ", P,
                      ")"));
      o.max_new_tokens = static_cast<int64_t>(v.get<uint64_t>());
    }
    bool logprobs = false;
    if (j.contains("logprobs")) {
      if (!j["logprobs"].is_boolean()) throw bad("logprobs must be a boolean value");
      logprobs = j["logprobs"].get<bool>();
    }
    if (j.contains("temperature")) {
      const auto& v = j["temperature"];
      if (!v.is_number() || !(v.get<double>() > 0.0 && v.get<double>() <= 100.0))
        throw bad("temperature must be a positive number less than or equal to 100.0");
      o.sampling.temperature = v.get<float>();
    }
    if (j.contains("top_k")) {
      const auto& v = j["top_k"];
      const bool ok = v.is_number_integer() && (v.is_number_unsigned() ? v.get<uint64_t>() <= 1000
                                                                         : v.get<int64_t>() >= 0 && v.get<int64_t>() <= 1000);
      if (!ok)
        throw bad("top_k must be an integer equal to or greater than 0 and less than or equal to 1000");
      o.sampling.top_k = v.get<int64_t>();
    }
    if (j.contains("top_p")) {
      const auto& v = j["top_p"];
      if (!v.is_number() || v.get<double>() < 0.0 || v.get<double>() > 1.0)
        throw bad("top_p must be a number between 0 and 1");
      o.sampling.top_p = v.get<float>();
    }
    if (o.sampling.top_k > 0 && o.sampling.top_p > 0.0f) throw bad("cannot set both top-k and top-p samplings.");
    if (j.contains("random_seed")) {
      const auto& v = j["random_seed"];
      if (!v.is_number_integer() || (!v.is_number_unsigned() && v.get<int64_t>() < 0))
        throw bad("random_seed must be a non-negative integer");
      o.sampling.seed = v.get<uint64_t>();
    }
    std::vector<std::vector<int32_t>> ids;
    for (const std::string& p : prompts) {
      if (data::find_invalid_utf8(p) >= 0) throw bad("a prompt is not valid UTF-8");
      ids.push_back(enc_->encode(p));
      const int64_t total = static_cast<int64_t>(std::max<size_t>(ids.back().size(), 1)) + o.max_new_tokens;
      if (total > model_.config().max_position_embeddings)
        throw bad(str("Length of prompt + tokens_to_generate longer than allowed: ", total, " tokens > max_position_embeddings ",
                      model_.config().max_position_embeddings));
    }
    const GenerateOutput g = generate(model_, ids, o);
    nlohmann::json text = nlohmann::json::array(), segments = nlohmann::json::array(), lps = nlohmann::json::array();
    for (size_t i = 0; i < prompts.size(); ++i) {
      text.push_back(prompts[i] + tok_.decode(g.generated[i]));
      nlohmann::json seg = nlohmann::json::array();
      for (int32_t t : ids[i]) seg.push_back(tok_.decode(&t, 1));
      for (int32_t t : g.generated[i]) seg.push_back(tok_.decode(&t, 1));
      segments.push_back(seg);
      lps.push_back(g.logprobs[i]);
    }
    nlohmann::json out = {{"text", text}, {"segments", segments}};
    if (logprobs) out["logprobs"] = lps;
    return out.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  }

  GPT& model_;
  const data::TextTokenizer& tok_;
  std::unique_ptr<data::TextEncoder> enc_;
  uint64_t seed_;
};

int run(int argc, char** argv) {
  std::string load, host = "127.0.0.1", vocab_file, merge_file, tokenizer_type = "GPT2BPETokenizer", tokenizer_model;
  int port = 5000;
  int64_t max_requests = 0, tp = 1, pp = 1;
  uint64_t seed = 1234;
  po::options_description d("text_generation_server: Megatron's PUT /api text generation over HTTP");
  d.add_options()("help,h", "print this help")
      ("load", po::value(&load)->required(), "checkpoint directory")
      ("host", po::value(&host), "address to bind (default 127.0.0.1; 0.0.0.0 exposes it to the network)")
      ("port", po::value(&port), "TCP port (default 5000; 0 picks a free one)")
      ("seed", po::value(&seed), "default random_seed of requests (default 1234)")
      ("max-requests", po::value(&max_requests), "exit after this many requests (default 0: serve until SIGTERM)")
      ("vocab-file", po::value(&vocab_file), "GPT-2 vocab (default: bundled assets/gpt2)")
      ("merge-file", po::value(&merge_file), "GPT-2 merges (default: bundled assets/gpt2)")
      ("tokenizer-type", po::value(&tokenizer_type)->default_value("GPT2BPETokenizer"), data::kTokenizerTypes)
      ("tokenizer-model", po::value(&tokenizer_model), "tokenizer.json (HuggingFaceTokenizer) or tokenizer.model")
      ("tensor-model-parallel-size", po::value(&tp), "must be 1: inference runs on one process (a checkpoint of any layout loads here)")
      ("pipeline-model-parallel-size", po::value(&pp), "must be 1: inference runs on one process (a checkpoint of any layout loads here)")
      ("micro-batch-size", po::value<int64_t>(), "accepted from Megatron's server script: requests are decoded one at a time");
  InferenceFlags inf;  // the pretraining GPT_ARGS a Megatron server script passes too
  add_inference_flags(d, inf, /*with_seq_length=*/true);
  po::variables_map vm;
  if (!parse_app_flags(argc, argv, d, vm, "text_generation_server")) return 0;
  check_inference_flags(vm, inf);
  if (vm.count("micro-batch-size")) inf.notes.push_back("--micro-batch-size: requests are decoded one at a time");
  if (checkpoint_exists(load)) check_against_checkpoint(vm, inf, read_checkpoint_config(load), load);
  for (const std::string& n : inf.notes) log_info(n);
  MPT_CHECK(tp == 1 && pp == 1, "text_generation_server runs on one process: parallel sizes must be 1", "");
  MPT_CHECK(port >= 0 && port <= 65535, str("--port ", port, " is not a TCP port"), "");
  MPT_CHECK(max_requests >= 0, str("--max-requests must be >= 0 (0: serve until SIGTERM), got ", max_requests), "");
  const auto tok_ptr = data::make_tokenizer({tokenizer_type, tokenizer_model, vocab_file, merge_file});
  const data::TextTokenizer& tok = *tok_ptr;
  const Device dev = cuda_available() ? Device::cuda(0) : Device::cpu();
  InferenceModel m = load_model_for_inference(load, dev, inf.dtype());
  MPT_CHECK(m.model->config().vocab_size == tok.vocab_size(), "the checkpoint's vocabulary differs from the tokenizer's",
            "pass the tokenizer flags the model was trained with (--tokenizer-type, --tokenizer-model or --vocab-file/--merge-file)");
  Api api(*m.model, tok, seed);

  const int srv = socket(AF_INET, SOCK_STREAM, 0);
  MPT_CHECK(srv >= 0, str("socket: ", std::strerror(errno)), "");
  const int one = 1;
  setsockopt(srv, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  const std::string bind_host = host == "localhost" ? "127.0.0.1" : host;
  MPT_CHECK(inet_pton(AF_INET, bind_host.c_str(), &addr.sin_addr) == 1, str("--host ", host, " is not an IPv4 address"),
            "use e.g. 127.0.0.1 or 0.0.0.0");
  if (bind(srv, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 || listen(srv, 16) != 0) {
    const std::string why = std::strerror(errno);
    close(srv);
    MPT_THROW(str("cannot listen on ", host, ":", port, ": ", why), "pick another --port (0: any free port)");
  }
  socklen_t len = sizeof addr;
  getsockname(srv, reinterpret_cast<sockaddr*>(&addr), &len);
  struct sigaction sa{};
  sa.sa_handler = on_signal;
  sigaction(SIGTERM, &sa, nullptr);
  sigaction(SIGINT, &sa, nullptr);
  std::printf("listening on http://%s:%d (model %s, %s)\n", bind_host.c_str(), ntohs(addr.sin_port), m.dir.c_str(),
              dev.name().c_str());
  std::fflush(stdout);

  int64_t served = 0;
  while (!g_stop && (max_requests == 0 || served < max_requests)) {
    pollfd p{srv, POLLIN, 0};
    const int pr = poll(&p, 1, 200);
    if (pr <= 0) continue;  // timeout or EINTR: re-check the stop flag
    const int fd = accept(srv, nullptr, nullptr);
    if (fd < 0) continue;
    timeval tv{10, 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
    Response resp;
    std::string what = "?";
    try {
      const Request req = read_request(fd);
      what = req.method + " " + req.path;
      resp = api.handle(req);
    } catch (const HttpError& e) {
      resp = {e.status, "text/plain", e.reason + "\n", ""};
    } catch (const std::exception& e) {
      resp = {500, "text/plain", std::string(e.what()) + "\n", ""};
    }
    send_response(fd, resp);
    close(fd);
    ++served;
    log_info(what, " -> ", resp.status);
  }
  close(srv);
  log_info("served ", served, " requests; exiting");
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  return run_single_process_app(argc, argv, "text_generation_server", [&] { return run(argc, argv); });
}
