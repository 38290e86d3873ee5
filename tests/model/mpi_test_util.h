// tests/model/mpi_test_util.h — what the multi-rank trainer tests share: the
// world rank and size, one temp directory for all ranks, a toy dataset in it.
#pragma once
#include <mpi.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include <doctest/doctest.h>

#include "model/params.h"

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

// Replicated parameters (norms, position embeddings, row-parallel biases) must be
// bitwise identical on every tensor-parallel rank after training.
inline void check_tp_replicas_identical(const ParamSet& ps, MPI_Comm tp_comm) {
  std::vector<float> mine;
  for (const ParamInfo& p : ps.infos())
    if (p.tp.axis < 0) {
      const std::vector<float> v = ps.values().flat_range(p.offset, p.numel()).to_floats();
      mine.insert(mine.end(), v.begin(), v.end());
    }
  std::vector<float> first(mine);
  MPI_Bcast(first.data(), static_cast<int>(first.size()), MPI_FLOAT, 0, tp_comm);
  CHECK_MESSAGE(std::memcmp(first.data(), mine.data(), mine.size() * sizeof(float)) == 0,
                "replicated parameters differ between tensor-parallel ranks");
}

}  // namespace mpitron::testing
