// tests/apps/server_util.h — start apps/text_generation_server (alone or under mpirun) on a
// free port, wait until it listens, stop it with SIGTERM and read its exit status.
#pragma once
#include <doctest/doctest.h>
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "apps_test_util.h"

extern char** environ;

namespace apps_test {

struct Server {
  pid_t pid = -1;
  int port = 0;
  std::string log;

  // args: the command line after the program; mpi_np > 0 runs it under mpirun -np N.
  Server(const std::vector<std::string>& args, const std::string& log_path, int mpi_np = 0) : log(log_path) {
    // One OpenMP thread per process, as ctest runs the apps (2 shared cores).
    std::vector<std::string> cmd = {"/usr/bin/env", "OMP_NUM_THREADS=1"};
    if (mpi_np > 0)
      cmd.insert(cmd.end(), {"mpirun", "--allow-run-as-root", "--oversubscribe", "-np", std::to_string(mpi_np)});
    cmd.push_back("apps/text_generation_server");
    cmd.insert(cmd.end(), args.begin(), args.end());
    cmd.push_back("--port");
    cmd.push_back("0");
    std::vector<char*> argv;
    for (auto& s : cmd) argv.push_back(s.data());
    argv.push_back(nullptr);
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 1, log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    posix_spawn_file_actions_adddup2(&fa, 1, 2);
    REQUIRE(posix_spawn(&pid, argv[0], &fa, nullptr, argv.data(), environ) == 0);
    posix_spawn_file_actions_destroy(&fa);
    for (int i = 0; i < 1200 && port == 0; ++i) {  // up to 120 s (a loaded machine)
      const std::string s = slurp(log);
      const size_t p = s.find("listening on http://127.0.0.1:");
      if (p != std::string::npos) port = std::stoi(s.substr(p + 30));
      else std::this_thread::sleep_for(std::chrono::milliseconds(100));
      int st = 0;
      REQUIRE_MESSAGE(waitpid(pid, &st, WNOHANG) == 0, "server exited: ", slurp(log));
    }
    REQUIRE_MESSAGE(port > 0, slurp(log));
  }
  // SIGTERM; returns the exit status (-1: killed by a signal).
  int stop() {
    if (pid < 0) return -1;
    kill(pid, SIGTERM);
    int status = 0;
    waitpid(pid, &status, 0);
    pid = -1;
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  }
  // Waits for a server that exits by itself (--max-requests; under mpirun the way to see rank
  // 0 end the workers: mpirun exits 1 on SIGTERM whatever its ranks do). Returns the exit
  // status; -1 when killed by a signal or still running after timeout_s (then killed).
  int wait_exit(double timeout_s = 120) {
    if (pid < 0) return -1;
    int status = 0;
    for (int i = 0; i < static_cast<int>(timeout_s * 10); ++i) {
      if (waitpid(pid, &status, WNOHANG) == pid) {
        pid = -1;
        return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    return -1;  // the destructor kills it
  }
  ~Server() {
    if (pid > 0) {
      kill(pid, SIGKILL);
      waitpid(pid, nullptr, 0);
    }
  }
};

}  // namespace apps_test
