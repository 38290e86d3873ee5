// io/io_watchdog.cpp — IoDeadline: a JobDeadline (parallel/job_exit.h, the process's one
// watchdog thread) with the checkpoint I/O step's message.
#include "io/io_watchdog.h"

#include "core/log.h"
#include "parallel/communicator.h"

namespace mpitron::io {

double io_timeout_s() {
  static const double t = comm_timeout_from_env();
  return t;
}

IoDeadline::IoDeadline(std::string what)
    : deadline_(str("checkpoint I/O step (", what, ")"),
                "another rank failed or hung inside collective MPI-IO/HDF5 I/O, which cannot be cancelled (a full or "
                "read-only disk, a dead rank); the job is aborted instead of hanging. The previous checkpoint and "
                "latest_checkpointed_iteration.txt are intact. MPITRON_COMM_TIMEOUT_S sets the timeout (0 = never).",
                io_timeout_s()) {}

}  // namespace mpitron::io
