// pretrain_gpt under a job scheduler: SIGTERM or SIGUSR1 (Slurm's warning
// before the time limit) with --exit-signal-handler finishes the step, saves,
// and exits 0; --keep-last removes older checkpoints only after the new one.
#include <doctest/doctest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "tests/model/model_test_util.h"

namespace fs = std::filesystem;
using namespace mpitron;

namespace {

// Starts pretrain_gpt with `extra` flags, stdout/stderr to `log`; returns its pid.
pid_t start_trainer(const std::string& data, const std::string& log, std::vector<std::string> extra) {
  std::vector<std::string> args = {"apps/pretrain_gpt", "--num-layers", "1", "--hidden-size", "16",
                                   "--num-attention-heads", "2", "--seq-length", "16", "--micro-batch-size", "2",
                                   "--train-iters", "100000", "--lr", "1e-3", "--data-path", data, "--split", "1,0,0",
                                   "--log-interval", "1", "--eval-iters", "0", "--device", "cpu"};
  args.insert(args.end(), extra.begin(), extra.end());
  std::fflush(stdout);
  std::fflush(stderr);
  const pid_t pid = fork();
  if (pid == 0) {
    FILE* f = std::freopen(log.c_str(), "w", stdout);
    (void)f;
    dup2(fileno(stdout), 2);
    std::vector<char*> argv;
    for (auto& s : args) argv.push_back(s.data());
    argv.push_back(nullptr);
    execv(argv[0], argv.data());
    _exit(127);
  }
  return pid;
}

// Waits until `text` occurs at least `count` times in the log.
bool wait_for_text(const std::string& log, const std::string& text, double seconds, int count = 1) {
  const auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  while (std::chrono::steady_clock::now() < end) {
    std::ifstream f(log);
    std::string all((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    int n = 0;
    for (size_t p = all.find(text); p != std::string::npos; p = all.find(text, p + 1)) ++n;
    if (n >= count) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return false;
}

int wait_exit(pid_t pid, double seconds) {
  const auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  int status = 0;
  while (std::chrono::steady_clock::now() < end) {
    if (waitpid(pid, &status, WNOHANG) == pid) return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  kill(pid, SIGKILL);
  waitpid(pid, &status, 0);
  return -1;
}

// Kills the child if a REQUIRE leaves the test early (no orphaned trainer).
struct ChildGuard {
  pid_t pid;
  ~ChildGuard() {
    int status = 0;
    if (pid > 0 && waitpid(pid, &status, WNOHANG) == 0) {
      kill(pid, SIGKILL);
      waitpid(pid, &status, 0);
    }
  }
};

}  // namespace

TEST_CASE("SIGTERM and SIGUSR1 save a checkpoint and exit 0; --keep-last prunes after committing") {
  REQUIRE_MESSAGE(fs::exists("apps/pretrain_gpt"), "build pretrain_gpt first (the test runs from the build dir)");
  const fs::path dir = testing::fresh_temp_dir("signals_sig");
  const std::string data = testing::write_toy_dataset(dir, 3, 100);
  const std::string save = (dir / "ckpt").string();
  int64_t previous = 0;
  for (int sig : {SIGTERM, SIGUSR1}) {
    CAPTURE(sig);
    const std::string log = (dir / ("log" + std::to_string(sig))).string();
    std::vector<std::string> extra = {"--exit-signal-handler", "--save", save, "--save-interval", "3",
                                      "--keep-last", "2"};
    if (fs::exists(save)) extra.insert(extra.end(), {"--load", save});
    const pid_t pid = start_trainer(data, log, extra);
    ChildGuard guard{pid};
    REQUIRE(wait_for_text(log, "elapsed time per iteration", 120, 7));  // seven steps done
    kill(pid, sig);
    CHECK(wait_exit(pid, 120) == 0);
    CHECK(wait_for_text(log, "on signal", 1));
    std::ifstream tracker(save + "/latest_checkpointed_iteration.txt");
    int64_t it = 0;
    tracker >> it;
    CHECK(it >= previous + 7);  // the step in flight finished, then it saved
    previous = it;
    CHECK(fs::exists(save + "/iter_" + std::string(7 - std::to_string(it).size(), '0') + std::to_string(it)));
    int kept = 0;
    for (const auto& e : fs::directory_iterator(save)) kept += e.path().filename().string().rfind("iter_", 0) == 0;
    CHECK(kept <= 2);
  }
  fs::remove_all(dir);
}

TEST_CASE("without --exit-signal-handler SIGTERM keeps its default meaning") {
  REQUIRE(fs::exists("apps/pretrain_gpt"));
  const fs::path dir = testing::fresh_temp_dir("signals_nosig");
  const std::string data = testing::write_toy_dataset(dir, 3, 100);
  const std::string log = (dir / "log").string();
  const pid_t pid = start_trainer(data, log, {});
  ChildGuard guard{pid};
  REQUIRE(wait_for_text(log, "elapsed time per iteration", 120, 2));
  kill(pid, SIGTERM);
  CHECK(wait_exit(pid, 60) == 128 + SIGTERM);
  fs::remove_all(dir);
}
