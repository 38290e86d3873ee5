// text_generation_server — Megatron-LM's REST text generation API, and OpenAI's completions and
// chat completions APIs (with /health and Prometheus /metrics), on a checkpoint, for many users.
//   text_generation_server --load ckpt [--host 127.0.0.1] [--port 5000] --inference-dynamic-batching
//   mpirun -np 4 text_generation_server --load ckpt --tensor-model-parallel-size 2 --pipeline-model-parallel-size 2 ...
//   curl -X PUT http://127.0.0.1:5000/api -H 'Content-Type: application/json'
//        -d '{"prompts": ["Hello"], "tokens_to_generate": 32, "top_p": 0.9}'
//   curl http://127.0.0.1:5000/v1/completions -H 'Content-Type: application/json'
//        -d '{"prompt": "Hello", "max_tokens": 32, "stream": true}'
// The requests and answers: model/inference/text_api.h. The HTTP layer: io/http_server.h
// (cpp-httplib: concurrent connections, keep-alive, size and time limits).
//
// Rank 0 (tp 0 of pipeline stage 0) serves HTTP and runs the dynamic engine on its main
// thread; every step is broadcast to the other ranks of the tensor × pipeline layout,
// which only compute (as Megatron's server: rank 0 takes requests, broadcasts the work).
// With --inference-dynamic-batching requests are batched continuously over the paged KV
// cache; without it the server answers one request at a time (Megatron's static mode;
// the prompts of that request are batched). It prints "listening on http://HOST:PORT"
// when ready (--port 0 picks a free port), logs each request and, every 10 s while busy
// and at exit, the engine's counters (steps, tokens, KV blocks, pauses, evictions), and
// exits 0 on SIGTERM/SIGINT or after --max-requests HTTP requests.
// A T5 checkpoint (pretrain_t5, or a Hugging Face T5 through convert_checkpoint) is served one
// request at a time, on one process or under TP: the prompt is the encoder's input, the answer the
// decoder's tokens (model/inference/t5_engine.h); --inference-dynamic-batching is refused for it by name. What is
// served is a ServedModel (model/inference/served_model.h): this file never asks which kind.
#include "apps/app_main.h"
#include <mpi.h>
#include <signal.h>

#include <atomic>
#include <boost/program_options.hpp>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <mutex>

#include "core/error.h"
#include "core/log.h"
#include "core/timer.h"
#include "data/text_tokenizer.h"
#include "io/http_server.h"
#include "model/flags/inference_flags.h"
#include "model/inference/served_model.h"
#include "model/training/pretrain_flags.h"
#include "model/inference/inference_load.h"
#include "model/inference/openai_stream.h"
#include "model/inference/server_metrics.h"
#include "model/inference/text_api.h"

using namespace mpitron;
namespace po = boost::program_options;

namespace {

volatile std::sig_atomic_t g_stop = 0;
void on_signal(int) { g_stop = 1; }

struct Args {
  std::string load, host = "127.0.0.1", vocab_file, merge_file, tokenizer_type = "GPT2BPETokenizer", tokenizer_model;
  std::string chat_template;  // --chat-template: a tokenizer_config.json or a Jinja file
  int port = 5000;
  int64_t max_requests = 0, vocab_extra_ids = 0;
  uint64_t seed = 1234;
  io::HttpLimits http;
  InferenceFlags inf;  // the pretraining GPT_ARGS a Megatron server script passes too
};

bool parse(int argc, char** argv, Args& a) {
  double body_mib = 16;
  po::options_description d("text_generation_server: Megatron's PUT /api and OpenAI's /v1/completions and "
                            "/v1/chat/completions over HTTP");
  d.add_options()("help,h", "print this help")
      ("load", po::value(&a.load)->required(), "checkpoint directory")
      ("host", po::value(&a.host), "address to bind (default 127.0.0.1; 0.0.0.0 exposes it to the network)")
      ("port", po::value(&a.port), "TCP port (default 5000; 0 picks a free one)")
      ("seed", po::value(&a.seed), "default random_seed / seed of requests (default 1234)")
      ("max-requests", po::value(&a.max_requests), "exit after this many HTTP requests (default 0: serve until SIGTERM)")
      ("http-threads", po::value(&a.http.threads),
       "connections served at once (default 128); a slow client holds one of them")
      ("http-timeout", po::value(&a.http.read_timeout_s),
       "seconds a connection may stay silent while sending a request or receiving an answer (default 10)")
      ("http-max-body-mb", po::value(&body_mib), "largest request body in MiB (default 16; larger: 413)")
      ("vocab-file", po::value(&a.vocab_file), "GPT-2 vocab (default: bundled assets/gpt2)")
      ("merge-file", po::value(&a.merge_file), "GPT-2 merges (default: bundled assets/gpt2)")
      ("tokenizer-type", po::value(&a.tokenizer_type)->default_value("GPT2BPETokenizer"), data::kTokenizerTypes)
      ("tokenizer-model", po::value(&a.tokenizer_model), "tokenizer.json (HuggingFaceTokenizer) or tokenizer.model")
      ("chat-template", po::value(&a.chat_template),
       "the chat template of /v1/chat/completions: a tokenizer_config.json (its chat_template) or a Jinja file "
       "(default: the tokenizer_config.json beside --tokenizer-model, if it has one)")
      ("vocab-extra-ids", po::value(&a.vocab_extra_ids),
       "<extra_id_j> sentinels appended to a WordPiece vocab (pretrain_t5's; a T5 then decodes from [BOS] to [EOS])")
      ("micro-batch-size", po::value<int64_t>(),
       "accepted from Megatron's server script; no effect (the engine's batch is set by the dynamic batching "
       "flags)");
  add_inference_flags(d, a.inf, /*with_seq_length=*/true, pretrain_flag_descriptions());
  po::variables_map vm;
  if (!parse_app_flags(argc, argv, d, vm, "text_generation_server", /*megatron=*/true)) return false;
  check_inference_flags(vm, a.inf);
  if (vm.count("micro-batch-size"))
    a.inf.notes.push_back("--micro-batch-size: the engine batches up to --inference-dynamic-batching-max-requests");
  if (checkpoint_exists(a.load)) check_against_checkpoint(vm, a.inf, read_checkpoint_config(a.load), a.load, /*allow_t5=*/true);
  MPT_CHECK(a.vocab_extra_ids >= 0, str("--vocab-extra-ids must be >= 0, got ", a.vocab_extra_ids), "");
  MPT_CHECK(a.port >= 0 && a.port <= 65535, str("--port ", a.port, " is not a TCP port"), "");
  MPT_CHECK(a.max_requests >= 0, str("--max-requests must be >= 0 (0: serve until SIGTERM), got ", a.max_requests), "");
  MPT_CHECK(a.http.threads >= 1 && a.http.threads <= 10000, str("--http-threads must be in [1, 10000], got ", a.http.threads), "");
  MPT_CHECK(a.http.read_timeout_s > 0 && a.http.read_timeout_s <= 3600,
            str("--http-timeout must be in (0, 3600] seconds, got ", a.http.read_timeout_s), "");
  MPT_CHECK(body_mib > 0 && body_mib <= 1024, str("--http-max-body-mb must be in (0, 1024], got ", body_mib), "");
  a.http.write_timeout_s = a.http.read_timeout_s;
  a.http.max_body = static_cast<size_t>(body_mib * 1024 * 1024);
  return true;
}

int run(int argc, char** argv) {
  Args a;
  if (!parse(argc, argv, a)) return 0;
  std::string no_chat_template;  // parsed on every rank: an unsupported template stops the job at start-up
  const auto chat_template = data::ChatTemplate::find(a.chat_template, a.tokenizer_model, no_chat_template);
  data::TokenizerSpec spec{a.tokenizer_type, a.tokenizer_model, a.vocab_file, a.merge_file};
  spec.vocab_extra_ids = a.vocab_extra_ids;
  const auto tok_ptr = data::make_tokenizer(spec);
  const data::TextTokenizer& tok = *tok_ptr;
  const DynamicBatchingFlags& b = a.inf.batching;
  ServingSetup setup{a.inf, &tok, a.vocab_extra_ids, 0};
  // Static mode serves one request of up to 128 prompts at a time.
  setup.max_requests = b.max_requests > 0 ? b.max_requests : b.enabled ? 64 : 128;
  const std::unique_ptr<ServedModel> model = open_served_model(MPI_COMM_WORLD, a.load, setup);
  ServedModel& engine = *model;
  for (const std::string& n : a.inf.notes) log_info(n);
  MPT_CHECK(engine.config().vocab_size == tok.vocab_size(), "the checkpoint's vocabulary differs from the tokenizer's",
            "pass the tokenizer flags the model was trained with (--tokenizer-type, --tokenizer-model or "
            "--vocab-file/--merge-file, --vocab-extra-ids)");
  if (!engine.is_driver()) {
    engine.serve();
    return 0;
  }
  TextGenerationApi::Options ao;
  ao.seed = a.seed;
  ao.model_name = std::filesystem::path(a.load).filename().string();
  if (ao.model_name.empty()) ao.model_name = std::filesystem::path(a.load).parent_path().filename().string();
  ServerMetrics metrics;
  ao.chat_template = chat_template;
  ao.no_chat_template = no_chat_template;
  ao.metrics = &metrics;
  if (chat_template) log_info("chat template: ", chat_template->name());
  TextGenerationApi api(tok, engine.config(), ao, [&engine](GenRequest r) { return engine.submit(std::move(r)); });

  // Static mode: one request at a time (held until its answer, or its stream, is done).
  std::mutex one_at_a_time;
  const bool serial = !b.enabled;
  const auto guarded = [&](io::HttpResponse (TextGenerationApi::*fn)(const io::HttpRequest&)) {
    return [&, fn](const io::HttpRequest& req) {
      if (!serial) return (api.*fn)(req);
      auto lock = std::make_shared<std::unique_lock<std::mutex>>(one_at_a_time);
      io::HttpResponse r = (api.*fn)(req);
      if (r.stream) {  // the lock travels with the stream and is released when it ends
        auto inner = std::move(r.stream);
        r.stream = [inner, lock](const std::function<bool(const std::string&)>& w) {
          const bool more = inner(w);
          if (!more && lock->owns_lock()) lock->unlock();
          return more;
        };
      }
      return r;
    };
  };
  io::HttpServer http(a.http);
  http.route("PUT", "/api", guarded(&TextGenerationApi::megatron));
  http.route("POST", "/v1/completions", guarded(&TextGenerationApi::completions));
  http.route("POST", "/v1/chat/completions", guarded(&TextGenerationApi::chat_completions));
  http.route("GET", "/v1/models", [&](const io::HttpRequest& req) { return api.models(req); });
  http.route("GET", "/health", [&](const io::HttpRequest& req) { return api.health(req); });
  http.route("GET", "/metrics", [&](const io::HttpRequest& req) { return api.metrics(req); });
  http.set_error_format([](int status, const std::string& message) { return openai::error_response(status, message); });
  std::atomic<int64_t> served{0};
  http.on_response([&](const std::string& line) {
    log_info(line);
    ++served;
  });
  http.on_served([&](const io::HttpServed& s) { metrics.on_response(s.method, s.path, s.routed, s.status); });
  struct sigaction sa{};
  sa.sa_handler = on_signal;
  sigaction(SIGTERM, &sa, nullptr);
  sigaction(SIGINT, &sa, nullptr);
  metrics.publish(engine.stats());  // the engine is up: /health answers 200 from the first request
  const int port = http.start(a.host, a.port);
  log_info("model ", engine.checkpoint_dir(), " on ", engine.describe());
  std::printf("listening on http://%s:%d\n", a.host == "localhost" ? "127.0.0.1" : a.host.c_str(), port);
  std::fflush(stdout);

  // The engine runs here, on the main thread (the only one that talks to the other ranks).
  Timer since_log;
  int64_t logged_steps = 0;
  const auto log_stats = [&] {
    const int64_t steps = engine.steps();
    if (steps != logged_steps) log_info(engine.stats_line());
    logged_steps = steps;
  };
  bool stopping = false;
  Timer since_stop;
  // A rank that stops answering (a step's collective or a heartbeat timed out, naming it) ends the
  // whole job here, as training does (docs/training.md "A frozen or failed rank"): the clients'
  // connections close instead of waiting for ever. Not by unwinding: the connection threads wait
  // for answers the engine can no longer give, and the HTTP server's destructor would wait for them.
  try {
    while (!(stopping && http.stopped() && !engine.has_work())) {
      if (!stopping && (g_stop || (a.max_requests > 0 && served >= a.max_requests))) {
        stopping = true;
        since_stop.reset();
        http.stop();  // no new connections; the ones in progress are answered
      }
      if (engine.has_work()) {
        engine.step();
      } else {
        engine.wait_for_work(0.05);
        engine.heartbeat();
      }
      metrics.publish(engine.stats());  // /metrics' gauges: the engine after its last step
      if (since_log.seconds() > 10) {
        log_stats();
        since_log.reset();
      }
      if (stopping && !engine.has_work() && since_stop.seconds() > a.http.read_timeout_s + 5) {
        // A client still trickling a request in holds its connection thread: do not wait for it.
        logged_steps = -1;
        log_stats();
        log_warn("connections still open ", since_stop.seconds(), " s after the stop; exiting without them");
        engine.stop_workers();
        std::fflush(stdout);
        std::fflush(stderr);
        MPI_Finalize();
        std::_Exit(0);
      }
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s\n", e.what());
    std::fprintf(stderr, "text_generation_server: serving ends here; every rank of the job is stopped (MPI_Abort)\n");
    std::fflush(stdout);
    std::fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  http.join();
  logged_steps = -1;
  log_stats();
  engine.stop_workers();
  log_info("served ", served.load(), " requests; exiting");
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  return run_inference_app(argc, argv, [&] { return run(argc, argv); });
}
