// tests/apps/test_phase_timeout.cpp — heartbeats per phase (--ft-timeouts, issue 47): a
// rank whose main thread hangs in step 5 (MPITRON_FAULT hang: a hung kernel; its
// process lives on) overruns `--ft-timeouts step=3`; the job ends within the timeout +
// 10 s, the error names the phase, the iteration, the rank and its host, the rank's
// failure record says it was stuck itself, the checkpoint before is intact and the run
// resumes from it to the end. Also: a bad --ft-timeouts is refused naming the flag.
// Real mpirun, DP2 on the CPU.
// mpitron-test: label=reliability
// mpitron-test: timeout=300
#include <doctest/doctest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <thread>

#include <nlohmann/json.hpp>

#include "tests/apps/apps_test_util.h"
#include "tests/model/model_test_util.h"

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

namespace {

std::string job(const std::string& data, const std::string& save, const std::string& extra) {
  return "OMP_NUM_THREADS=1 mpirun --allow-run-as-root --oversubscribe --mca btl self,vader,tcp -np 2 apps/pretrain_gpt "
         "--num-layers 2 --hidden-size 16 --num-attention-heads 2 --seq-length 16 --max-position-embeddings 16 "
         "--micro-batch-size 2 --global-batch-size 4 --train-iters 8 --lr 1e-3 --data-path " + data +
         " --split 1,0,0 --log-interval 1 --eval-iters 0 --device cpu --save " + save + " --save-interval 2 " + extra;
}

}  // namespace

TEST_CASE("--ft-timeouts: a hung step ends the job within its timeout naming rank, host and phase") {
  REQUIRE_MESSAGE(fs::exists("apps/pretrain_gpt"), "build pretrain_gpt first (the test runs from the build dir)");
  apps_test::TempDir dir("phase_timeout");
  const std::string data = mpitron::testing::write_toy_dataset(dir.path, 7, 200);
  const std::string log = dir / "log";
  const std::string cmd = "exec env MPITRON_FAULT=hang:rank=1:step=5 " + job(data, dir / "ckpt", "--ft-timeouts step=3") +
                          " > " + log + " 2>&1";
  std::fflush(stdout);
  const pid_t pid = fork();
  if (pid == 0) {
    setpgid(0, 0);
    execl("/bin/sh", "sh", "-c", cmd.c_str(), static_cast<char*>(nullptr));
    _exit(127);
  }
  // From the hang to the end of the job.
  Clock::time_point hung{};
  bool seen = false;
  int st = 0, status = -1;
  const auto start = Clock::now();
  while (true) {
    if (!seen && apps_test::slurp(log).find("this thread hangs") != std::string::npos) {
      seen = true;
      hung = Clock::now();
    }
    if (waitpid(pid, &st, WNOHANG) == pid) {
      status = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
      break;
    }
    if (Clock::now() - start > std::chrono::seconds(200)) {  // never hang the suite
      kill(-pid, SIGKILL);
      waitpid(pid, &st, 0);
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  const double seconds = std::chrono::duration<double>(Clock::now() - hung).count();
  const std::string out = apps_test::slurp(log);
  INFO(out);
  REQUIRE(seen);
  MESSAGE("the hung step ended the job after ", seconds, " s (--ft-timeouts step=3)");
  CHECK(status != 0);
  CHECK(status != -1);
  CHECK(seconds < 3 + 10);
  CHECK(seconds > 2);
  CHECK(out.find("[rank 1] error: phase 'step' of iteration 5 on host ") != std::string::npos);
  CHECK(out.find("did not finish within 3 s") != std::string::npos);
  const nlohmann::json r = nlohmann::json::parse(apps_test::slurp(dir / "ckpt/failures/rank-1.json"));
  CHECK(r.at("cause") == "phase_timeout");
  CHECK(r.at("rank") == 1);
  CHECK(r.at("phase") == "step");
  CHECK(r.at("step") == 5);
  CHECK(r.at("message").get<std::string>().find("not waiting for a peer") != std::string::npos);
  // The checkpoint of iteration 4 is intact: the run resumes from it to the end.
  REQUIRE(fs::exists(dir / "ckpt/iter_0000004"));
  const int rc = std::system((job(data, dir / "ckpt", "--load " + (dir / "ckpt") + " --ft-timeouts step=auto") + " > " +
                              (dir / "resume.log") + " 2>&1").c_str());
  const std::string resumed = apps_test::slurp(dir / "resume.log");
  INFO(resumed);
  CHECK(WIFEXITED(rc));
  CHECK(WEXITSTATUS(rc) == 0);
  CHECK(resumed.find("at iteration 4") != std::string::npos);
  CHECK(resumed.find("iteration        8/") != std::string::npos);

  // Refused by name.
  CHECK(apps_test::run_app("pretrain_gpt", "--num-layers 2 --hidden-size 16 --num-attention-heads 2 --seq-length 16 "
                           "--micro-batch-size 2 --train-iters 2 --lr 1e-3 --mock-data --device cpu --ft-timeouts "
                           "step=soon", dir / "bad.log") == 1);
  CHECK(apps_test::slurp(dir / "bad.log").find("--ft-timeouts step=soon: step=soon is not a number of seconds") !=
        std::string::npos);
}
