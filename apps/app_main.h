// apps/app_main.h — what every single-process app's main() does: start MPI
// (so mpirun launches fail cleanly instead of running N copies), refuse more
// than one rank, turn any error into its message on stderr and exit code 1.
#pragma once
#include <mpi.h>

#include <cstdio>
#include <exception>
#include <functional>

#include "core/error.h"

namespace mpitron {

inline int run_single_process_app(int argc, char** argv, const char* name, const std::function<int()>& body) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_FUNNELED, &provided);
  int world = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  int rc = 0;
  try {
    MPT_CHECK(world == 1, str(name, " was started on ", world, " ranks; it runs on one process"),
              "run it without mpirun (or with -np 1)");
    rc = body();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s\n", e.what());
    rc = 1;
  }
  MPI_Finalize();
  return rc;
}

}  // namespace mpitron
