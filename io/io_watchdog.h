// io/io_watchdog.h — a deadline for one collective checkpoint I/O step.
//
// MPI-IO and parallel HDF5 calls cannot be cancelled or given a timeout: when
// one rank fails inside a collective write (a full disk) or dies, the others
// can wait in it for ever. Every collective step of a checkpoint save or load
// therefore runs under an IoDeadline. If the step has not finished after
// MPITRON_COMM_TIMEOUT_S seconds (default 300, 0 = never; the timeout of the
// communicators, parallel/communicator.h), the rank logs which step hung and
// aborts the whole job (MPI_Abort, exit status 1; without MPI it exits with
// status 1): a clear error instead of a hang. The previous checkpoint and
// the tracker file are untouched, since a step that has not finished has not
// renamed anything.
//
// It is a JobDeadline (parallel/job_exit.h): the one watchdog thread of the process
// serves it with every other deadline; deadlines may nest (the earliest one counts).
#pragma once
#include <string>

#include "parallel/job_exit.h"

namespace mpitron::io {

class IoDeadline {
 public:
  // `what`: the step, for the message ("write dataset 'model/wte' of '<path>'").
  explicit IoDeadline(std::string what);

 private:
  JobDeadline deadline_;
};

// The seconds a step may take (MPITRON_COMM_TIMEOUT_S, else 300; 0 = never).
double io_timeout_s();

}  // namespace mpitron::io
