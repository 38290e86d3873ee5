// The doctest main shared by every test executable. Initialises MPI when the
// test was started under mpirun (so MPI tests and plain tests share one main).
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>
#include <mpi.h>

#include <cstdlib>

#include "core/error.h"

int main(int argc, char** argv) {
  const bool under_mpi = std::getenv("OMPI_COMM_WORLD_SIZE") || std::getenv("PMI_SIZE");
  if (under_mpi) {
    int provided = 0;
#if defined(MPITRON_CUDA_SIM)
    // The simulated device's NCCL stand-in makes MPI calls from its streams' threads.
    MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
#else
    MPI_Init_thread(&argc, &argv, MPI_THREAD_FUNNELED, &provided);
#endif
    int rank = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    mpitron::set_process_rank(rank);
  }
  doctest::Context ctx;
  ctx.applyCommandLine(argc, argv);
  int rc = ctx.run();
  if (under_mpi) {
    // Every rank must agree on failure, or ctest would see a partial pass.
    int any = rc != 0, all = 0;
    MPI_Allreduce(&any, &all, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    MPI_Finalize();
    rc = all;
  }
  return rc;
}
