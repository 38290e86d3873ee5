// tests/model/mpi_test_util.h — what the multi-rank trainer tests share: the
// world rank and size, one temp directory for all ranks, a toy dataset in it.
#pragma once
#include <mpi.h>
#include <unistd.h>

#include <filesystem>
#include <string>

#include "tests/model/model_test_util.h"

namespace mpitron::testing {

inline int world_rank() {
  int r = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}
inline int world_size() {
  int n = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  return n;
}

// <tmp>/mpitron_<name>_<pid of rank 0>: the same directory on every rank.
inline std::filesystem::path shared_dir(const std::string& name) {
  int pid = static_cast<int>(::getpid());
  MPI_Bcast(&pid, 1, MPI_INT, 0, MPI_COMM_WORLD);
  return std::filesystem::temp_directory_path() / ("mpitron_" + name + "_" + std::to_string(pid));
}

// Rank 0 empties `dir` and writes the toy dataset there; returns its prefix on every rank.
inline std::string make_shared_dataset(const std::filesystem::path& dir, uint32_t seed, int docs) {
  if (world_rank() == 0) {
    std::filesystem::remove_all(dir);
    std::filesystem::create_directories(dir);
    write_toy_dataset(dir, seed, docs);
  }
  MPI_Barrier(MPI_COMM_WORLD);
  return (dir / "toy_text_document").string();
}

}  // namespace mpitron::testing
