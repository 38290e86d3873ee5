// tests/io/io_test_util.h — shared helpers for the io tests: a scratch directory
// shared by all ranks, the world communicator when running under mpirun, and
// running the Python reference checks.
#pragma once
#include <doctest/doctest.h>
#include <mpi.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <string>

#include "core/error.h"

namespace mpitron::test {

inline bool mpi_running() {
  int init = 0, fin = 0;
  MPI_Initialized(&init);
  MPI_Finalized(&fin);
  return init && !fin;
}
inline MPI_Comm world() { return mpi_running() ? MPI_COMM_WORLD : MPI_COMM_NULL; }
inline int world_rank() {
  int r = 0;
  if (mpi_running()) MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}
inline int world_size() {
  int n = 1;
  if (mpi_running()) MPI_Comm_size(MPI_COMM_WORLD, &n);
  return n;
}
inline void world_barrier() {
  if (mpi_running()) MPI_Barrier(MPI_COMM_WORLD);
}

// A fresh directory under the system temp dir, the same path on every rank,
// removed (by rank 0) when the test ends.
class ScratchDir {
 public:
  explicit ScratchDir(const std::string& tag) {
    long long id = static_cast<long long>(getpid());
    if (mpi_running()) MPI_Bcast(&id, 1, MPI_LONG_LONG, 0, MPI_COMM_WORLD);
    path_ = (std::filesystem::temp_directory_path() / str("mpitron_io_", tag, "_", id)).string();
    if (world_rank() == 0) {
      std::filesystem::remove_all(path_);
      std::filesystem::create_directories(path_);
    }
    world_barrier();
  }
  ~ScratchDir() {
    world_barrier();
    std::error_code ec;
    if (world_rank() == 0 && !std::getenv("MPITRON_KEEP_TEST_FILES")) std::filesystem::remove_all(path_, ec);
  }
  const std::string& path() const { return path_; }
  std::string operator/(const std::string& name) const { return (std::filesystem::path(path_) / name).string(); }

 private:
  std::string path_;
};

// Runs tests/io/<script> with /usr/bin/python3. Exit status 77 means the
// Python package it needs is missing: reported as SKIPPED, not as a pass.
// Returns true when the check ran and passed.
inline bool run_python_check(const std::string& script, const std::string& args, const char* needs) {
  const std::string cmd =
      str("/usr/bin/python3 ", MPITRON_SOURCE_DIR, "/tests/io/", script, " ", args, " 2>&1");
  const int rc = std::system(cmd.c_str());
  const int code = WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
  if (code == 77) {
    MESSAGE("SKIPPED: ", script, ": Python package '", needs, "' is not importable by /usr/bin/python3");
    return false;
  }
  CHECK_MESSAGE(code == 0, script, " failed (exit ", code, "): ", cmd);
  return code == 0;
}

}  // namespace mpitron::test
