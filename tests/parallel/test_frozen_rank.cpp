// tests/parallel/test_frozen_rank.cpp — a frozen rank (SIGSTOP: what a hung GPU
// or a stuck node looks like to the others) ends the whole job: every rank
// exits, mpirun returns non-zero within MPITRON_COMM_TIMEOUT_S plus a bounded
// grace, and the error names the collective and the silent rank (issue 26,
// class 1; parallel/job_exit.h). Real mpirun, pretrain_gpt on 2 ranks in DP2,
// TP2 and PP2, frozen after a checkpoint was saved, either rank.
// mpitron-test: label=reliability
// mpitron-test: timeout=600
#include <doctest/doctest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "tests/model/model_test_util.h"
#include "tests/parallel/rank_pid.h"

namespace fs = std::filesystem;
using namespace mpitron;
using mpitron_test::rank_pid;

namespace {

using Clock = std::chrono::steady_clock;
constexpr int kTimeoutS = 5;      // MPITRON_COMM_TIMEOUT_S of the runs
constexpr double kBoundS = kTimeoutS + 30.0;  // the bound: timeout + 30 s

std::string slurp(const std::string& p) {
  std::ifstream f(p, std::ios::binary);
  std::ostringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

int count_of(const std::string& hay, const std::string& needle) {
  int n = 0;
  for (size_t p = hay.find(needle); p != std::string::npos; p = hay.find(needle, p + 1)) ++n;
  return n;
}

struct Outcome {
  int status = -1;       // mpirun's exit status (-1: still running after the bound, killed)
  double seconds = 0;    // from the SIGSTOP to mpirun's exit
  std::string log;
};

// Runs pretrain_gpt on 2 ranks with `layout` flags, waits until a checkpoint is
// saved and a step after it is done, SIGSTOPs world rank `frozen`, and waits for mpirun.
// A step is many micro-batches (global batch 64), so the freeze lands inside a step's
// collectives, rarely inside a later save's collective HDF5 write (whose own watchdog
// would end the job instead of the communicator's timeout this test checks).
Outcome freeze_run(const std::string& data, const fs::path& dir, const std::string& layout, int frozen) {
  const std::string log = (dir / "log").string();
  const std::string cmd =
      "exec env MPITRON_COMM_TIMEOUT_S=" + std::to_string(kTimeoutS) +
      " OMP_NUM_THREADS=1 mpirun --allow-run-as-root --oversubscribe -np 2 --mca btl self,vader,tcp "
      "apps/pretrain_gpt --num-layers 2 --hidden-size 16 --num-attention-heads 2 --seq-length 16 "
      "--max-position-embeddings 16 --micro-batch-size 2 --global-batch-size 64 --train-iters 100000 --lr 1e-3 "
      "--data-path " + data + " --split 1,0,0 --log-interval 1 --eval-iters 0 --device cpu --save " +
      (dir / "ckpt").string() + " --save-interval 3 " + layout + " > " + log + " 2>&1";
  std::fflush(stdout);
  std::fflush(stderr);
  const pid_t mpirun = fork();
  if (mpirun == 0) {
    setpgid(0, 0);
    execl("/bin/sh", "sh", "-c", cmd.c_str(), static_cast<char*>(nullptr));
    _exit(127);
  }
  Outcome o;
  // A step after the first save (iteration 3) has finished.
  const auto start = Clock::now();
  while (Clock::now() - start < std::chrono::seconds(180)) {
    const std::string l = slurp(log);
    if (l.find("saved checkpoint iteration 3") != std::string::npos && l.find("iteration        4/") != std::string::npos)
      break;
    int st = 0;
    if (waitpid(mpirun, &st, WNOHANG) == mpirun) {
      o.log = slurp(log);
      FAIL("the job ended before a rank could be frozen:\n", o.log);
      return o;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  const pid_t victim = rank_pid(mpirun, frozen);
  REQUIRE_MESSAGE(victim > 0, "no process of world rank ", frozen, " under mpirun ", mpirun);
  REQUIRE(kill(victim, SIGSTOP) == 0);
  const auto t0 = Clock::now();
  int st = 0;
  while (true) {
    if (waitpid(mpirun, &st, WNOHANG) == mpirun) {
      o.status = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
      break;
    }
    if (Clock::now() - t0 > std::chrono::duration<double>(kBoundS + 30)) {  // the test's own bound: never hang
      kill(-mpirun, SIGKILL);
      waitpid(mpirun, &st, 0);
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  o.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  // No rank outlives the job: the frozen one included (mpirun kills it as it ends).
  bool victim_gone = false;
  for (int i = 0; i < 100 && !victim_gone; ++i) {
    victim_gone = kill(victim, 0) != 0;
    if (!victim_gone) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  if (!victim_gone) kill(victim, SIGKILL);
  CHECK_MESSAGE(victim_gone, "the frozen rank ", frozen, " (pid ", victim, ") was still there after mpirun ended");
  o.log = slurp(log);
  return o;
}

}  // namespace

TEST_CASE("a frozen rank ends the job: DP2, TP2, PP2, after a save, either rank") {
  REQUIRE_MESSAGE(fs::exists("apps/pretrain_gpt"), "build pretrain_gpt first (the test runs from the build dir)");
  const fs::path dir = testing::fresh_temp_dir("frozen_rank");
  const std::string data = testing::write_toy_dataset(dir, 5, 200);
  struct Case {
    std::string name;
    std::string layout;
    int frozen;
  };
  const std::vector<Case> cases = {
      {"dp2, rank 1 frozen", "", 1},
      {"dp2, rank 0 frozen", "", 0},
      {"tp2, rank 1 frozen", "--tensor-model-parallel-size 2", 1},
      {"pp2, rank 1 frozen", "--pipeline-model-parallel-size 2", 1},
      {"pp2, rank 0 frozen", "--pipeline-model-parallel-size 2", 0},
  };
  for (const Case& c : cases) {
    CAPTURE(c.name);
    const fs::path d = dir / std::to_string(&c - cases.data());
    fs::create_directories(d);
    const Outcome o = freeze_run(data, d, c.layout, c.frozen);
    const int survivor = 1 - c.frozen;
    INFO("log:\n", o.log.substr(o.log.size() > 6000 ? o.log.size() - 6000 : 0));
    MESSAGE(c.name, ": mpirun exited with ", o.status, " after ", o.seconds, " s");
    CHECK(o.status != 0);
    CHECK(o.status != -1);
    CHECK(o.seconds < kBoundS);
    CHECK(o.seconds >= kTimeoutS - 1);
    // The survivor names the collective that timed out and the silent rank.
    CHECK(count_of(o.log, str("[rank ", survivor, "] error: ")) >= 1);
    CHECK(o.log.find(str("timed out after ", kTimeoutS, " s on world rank ", survivor)) != std::string::npos);
    CHECK(o.log.find(str("world rank ", c.frozen, " (group rank ")) != std::string::npos);
    CHECK(o.log.find("no answer") != std::string::npos);
    // The checkpoint saved before the freeze is intact and committed.
    CHECK(fs::exists(d / "ckpt" / "iter_0000003"));
  }
  fs::remove_all(dir);
}
