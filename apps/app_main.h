// apps/app_main.h — what every app's main() does: start MPI, turn any error into
// its message on stderr and exit code 1. A single-process app refuses more than
// one rank (so mpirun launches fail cleanly instead of running N copies); an
// inference app (generate_text, evaluate, text_generation_server) runs on the
// ranks of its tensor × pipeline layout and, when one rank fails after the
// others started working with it, ends the whole job (MPI_Abort) instead of
// leaving the others waiting.
#pragma once
#include <mpi.h>

#include <boost/program_options.hpp>
#include <cstdio>
#include <iostream>
#include <exception>
#include <functional>

#include "core/error.h"
#include "model/flags/flag_given.h"
#include "model/flags/megatron_compat.h"
#include "parallel/job_exit.h"

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

// Rank 0 prints errors plainly, the others with their rank; with more than one
// rank a failure aborts the job (a rank may be waiting for the failed one).
inline int run_inference_app(int argc, char** argv, const std::function<int()>& body) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_FUNNELED, &provided);
  int rank = 0, world = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  set_process_rank(world > 1 ? rank : -1);
  // A collective that timed out (a frozen or dead rank) arms the job's exit deadline: the job
  // ends even if unwinding the error waits on the silent rank (parallel/job_exit.h).
  install_job_exit();
  int rc = 0;
  try {
    rc = body();
  } catch (const std::exception& e) {
    if (rank == 0) std::fprintf(stderr, "%s\n", e.what());
    else std::fprintf(stderr, "[rank %d] %s\n", rank, e.what());
    std::fflush(stderr);
    if (world > 1) MPI_Abort(MPI_COMM_WORLD, 1);
    rc = 1;
  }
  MPI_Finalize();
  return rc;
}

// Parses argv against `d` into `vm`: prints the help (on rank 0) and returns false for
// --help; an unknown flag, a missing required one or a bad value is an Error
// naming the app and pointing at --help. `megatron`: argparse semantics as
// pretrain_gpt parses (a repeated flag's last value wins, 1_000 is 1000), for
// tools that take a pretraining script's arguments.
inline bool parse_app_flags(int argc, char** argv, const boost::program_options::options_description& d,
                            boost::program_options::variables_map& vm, const char* name, bool megatron = false) {
  namespace po = boost::program_options;
  try {
    po::parsed_options parsed = po::command_line_parser(argc, argv).options(d).run();
    if (megatron) {
      strip_digit_underscores(parsed.options);
      keep_last_occurrence(parsed.options, d);
    }
    check_parsed_values(parsed, d, name);
    po::store(parsed, vm);
    if (vm.count("help")) {
      int rank = 0, init = 0;
      MPI_Initialized(&init);
      if (init) MPI_Comm_rank(MPI_COMM_WORLD, &rank);
      if (rank == 0) std::cout << d << "\n";
      return false;
    }
    po::notify(vm);
  } catch (const po::error& e) {
    MPT_THROW(str(name, ": ", e.what()), str("run ", name, " --help for the flags it supports"));
  }
  return true;
}

}  // namespace mpitron
