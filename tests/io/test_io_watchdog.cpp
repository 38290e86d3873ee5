// IoDeadline (io/io_watchdog.h) ends the job when a checkpoint I/O step hangs: it is a
// JobDeadline (parallel/job_exit.h) served by the process's one watchdog thread. The
// child is this test binary run again (/proc/self/exe) with MPITRON_TEST_IO_HANG set and
// MPITRON_COMM_TIMEOUT_S=1: its step "hangs" (sleeps 30 s) under an IoDeadline, which must
// end it with exit status 1 within a few seconds, naming the step and the timeout.
// mpitron-test: label=reliability
#include <doctest/doctest.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>

#include "io/io_watchdog.h"

using namespace mpitron;

TEST_CASE("IoDeadline child: a step that never finishes (run only by the test below)") {
  if (!std::getenv("MPITRON_TEST_IO_HANG")) return;
  io::IoDeadline d("write dataset 'model/wte' of 'ckpt/iter_0000001'");
  std::this_thread::sleep_for(std::chrono::seconds(30));
  std::printf("the deadline did not fire\n");
}

TEST_CASE("IoDeadline: a hung checkpoint step ends the process with status 1 within the timeout, naming the step") {
  if (std::getenv("MPITRON_TEST_IO_HANG")) return;
  const std::string exe = std::filesystem::read_symlink("/proc/self/exe").string();
  const std::string log = (std::filesystem::temp_directory_path() / ("mpitron_io_hang_" + std::to_string(getpid()))).string();
  const auto t0 = std::chrono::steady_clock::now();
  const int rc = std::system(("MPITRON_TEST_IO_HANG=1 MPITRON_COMM_TIMEOUT_S=1 '" + exe +
                              "' --test-case='IoDeadline child*' > '" + log + "' 2>&1")
                                 .c_str());
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::stringstream out;
  out << std::ifstream(log).rdbuf();
  std::filesystem::remove(log);
  MESSAGE("child exit ", rc, " after ", s, " s:\n", out.str());
  CHECK(WIFEXITED(rc));
  CHECK(WEXITSTATUS(rc) != 0);
  CHECK(s < 20);
  CHECK(out.str().find("checkpoint I/O step (write dataset 'model/wte' of 'ckpt/iter_0000001') did not finish within 1 s") !=
        std::string::npos);
  CHECK(out.str().find("MPITRON_COMM_TIMEOUT_S") != std::string::npos);
  CHECK(out.str().find("the deadline did not fire") == std::string::npos);
}
