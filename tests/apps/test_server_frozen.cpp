// A frozen rank under the model-parallel text_generation_server (issue 47, item 7) ends the job as
// a frozen rank ends training (docs/training.md "A frozen or failed rank"): mpirun exits non-zero
// within MPITRON_COMM_TIMEOUT_S plus a bounded grace, the log names the silent rank, the frozen
// process is gone, and a client whose request was in flight gets its connection closed instead of
// waiting for ever. Real mpirun, TP2, a rank frozen with SIGSTOP: the worker while idle (dynamic
// batching), the worker while requests run (one at a time), the driver while idle.
// mpitron-test: label=reliability
// mpitron-test: timeout=600
#include <doctest/doctest.h>
#include <signal.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <string>
#include <thread>

#include "apps_test_util.h"
#include "http_client.h"
#include "io/safetensors.h"
#include "model/inference/hf_convert.h"
#include "model/inference/inference_load.h"
#include "server_util.h"
#include "tests/parallel/rank_pid.h"

using namespace mpitron;
using apps_test::Server;
using apps_test::slurp;
using apps_test::TempDir;

namespace {

using Clock = std::chrono::steady_clock;
constexpr int kTimeoutS = 5;                  // MPITRON_COMM_TIMEOUT_S of the servers
constexpr double kBoundS = kTimeoutS + 30.0;  // training's bound (tests/parallel/test_frozen_rank.cpp)

std::string make_checkpoint(const TempDir& tmp) {
  const std::string ref = apps_test::kSource + "/tests/apps/ref/";
  const io::Safetensors st = io::read_safetensors(ref + "gpt2_tiny.safetensors");
  auto model = gpt_from_hf(st, hf_file_config(st, slurp(ref + "gpt2_tiny_config.json"), 0));
  save_model_checkpoint(tmp / "ckpt", *model, "test");
  return tmp / "ckpt";
}

double since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// SIGSTOPs world rank `rank` of the server's job; returns its pid.
pid_t freeze(const Server& srv, int rank) {
  const pid_t victim = mpitron_test::rank_pid(srv.pid, rank);
  REQUIRE_MESSAGE(victim > 0, "no process of world rank ", rank, " under mpirun ", srv.pid);
  REQUIRE(kill(victim, SIGSTOP) == 0);
  return victim;
}

// After the job ended: the frozen process is gone too (mpirun kills it).
void check_gone(pid_t victim) {
  bool gone = false;
  for (int i = 0; i < 100 && !gone; ++i) {
    gone = kill(victim, 0) != 0;
    if (!gone) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  if (!gone) kill(victim, SIGKILL);
  CHECK_MESSAGE(gone, "the frozen rank (pid ", victim, ") outlived the job");
}

// Waits for the job; checks it failed within the bound and that the log names the silent rank.
void check_ended(Server& srv, Clock::time_point frozen_at, int silent_rank) {
  const int status = srv.wait_exit(kBoundS + 30);
  const double s = since(frozen_at);
  const std::string log = slurp(srv.log);
  CHECK_MESSAGE(status != 0, "the server job did not end after a rank froze (status ", status, "): ", log);
  CHECK_MESSAGE(s < kBoundS, "the job ended ", s, " s after the freeze; the bound is ", kBoundS, " s: ", log);
  CHECK_MESSAGE(log.find("world rank " + std::to_string(silent_rank)) != std::string::npos,
                "the log does not name the silent world rank ", silent_rank, ": ", log);
  MESSAGE("ended ", s, " s after the freeze of world rank ", silent_rank);
}

struct Env {
  Env() { setenv("MPITRON_COMM_TIMEOUT_S", std::to_string(kTimeoutS).c_str(), 1); }
  ~Env() { unsetenv("MPITRON_COMM_TIMEOUT_S"); }
};

}  // namespace

TEST_CASE("TP2 server, dynamic batching, idle: a frozen worker ends the job") {
  TempDir tmp("srv_frozen_idle");
  Env env;
  Server srv({"--load", make_checkpoint(tmp), "--tensor-model-parallel-size", "2", "--inference-dynamic-batching"},
             tmp / "server.log", 2);
  REQUIRE(http_test::http(srv.port, "PUT", "/api", R"({"prompts": ["Hello"], "tokens_to_generate": 2})").status == 200);
  std::this_thread::sleep_for(std::chrono::milliseconds(500));  // idle now
  const pid_t victim = freeze(srv, 1);
  check_ended(srv, Clock::now(), 1);
  check_gone(victim);
}

TEST_CASE("TP2 server, one request at a time, busy: a frozen worker ends the job and frees the client") {
  TempDir tmp("srv_frozen_busy");
  Env env;
  Server srv({"--load", make_checkpoint(tmp), "--tensor-model-parallel-size", "2"}, tmp / "server.log", 2);
  // A client keeps the server busy; each answer is checked until the freeze.
  std::atomic<bool> stop{false};
  std::atomic<int> answered{0};
  std::atomic<double> last_wait{0};
  std::thread client([&] {
    while (!stop) {
      const auto t = Clock::now();
      int status = 0;
      try {
        status = http_test::http(srv.port, "PUT", "/api",
                                 R"({"prompts": ["Hello, my dog", "Once"], "tokens_to_generate": 64})").status;
      } catch (const std::exception&) {  // connect refused: the job has ended
      }
      last_wait = since(t);
      if (status != 200) break;  // the job ended: the connection closed without an answer
      ++answered;
    }
  });
  for (int i = 0; i < 600 && answered < 1; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  REQUIRE_MESSAGE(answered >= 1, slurp(srv.log));
  const auto t0 = Clock::now();
  const pid_t victim = freeze(srv, 1);
  check_ended(srv, t0, 1);
  stop = true;
  client.join();
  CHECK_MESSAGE(last_wait < kBoundS + 5, "the client in flight waited ", last_wait.load(), " s");
  check_gone(victim);
}

TEST_CASE("TP2 server, dynamic batching, idle: a frozen driver ends the job") {
  TempDir tmp("srv_frozen_driver");
  Env env;
  Server srv({"--load", make_checkpoint(tmp), "--tensor-model-parallel-size", "2", "--inference-dynamic-batching"},
             tmp / "server.log", 2);
  REQUIRE(http_test::http(srv.port, "PUT", "/api", R"({"prompts": ["Hello"], "tokens_to_generate": 2})").status == 200);
  const pid_t victim = freeze(srv, 0);
  check_ended(srv, Clock::now(), 0);
  check_gone(victim);
}
