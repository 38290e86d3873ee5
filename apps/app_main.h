// apps/app_main.h — what every single-process app's main() does: start MPI
// (so mpirun launches fail cleanly instead of running N copies), refuse more
// than one rank, turn any error into its message on stderr and exit code 1.
#pragma once
#include <mpi.h>

#include <boost/program_options.hpp>
#include <cstdio>
#include <iostream>
#include <exception>
#include <functional>

#include "core/error.h"
#include "model/flag_given.h"

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

// Parses argv against `d` into `vm`: prints the help and returns false for
// --help; an unknown flag, a missing required one or a bad value is an Error
// naming the app and pointing at --help.
inline bool parse_app_flags(int argc, char** argv, const boost::program_options::options_description& d,
                            boost::program_options::variables_map& vm, const char* name) {
  namespace po = boost::program_options;
  try {
    const po::parsed_options parsed = po::parse_command_line(argc, argv, d);
    refuse_negative_unsigned(parsed, d, name);
    po::store(parsed, vm);
    if (vm.count("help")) {
      std::cout << d << "\n";
      return false;
    }
    po::notify(vm);
  } catch (const po::error& e) {
    MPT_THROW(str(name, ": ", e.what()), str("run ", name, " --help for the flags it supports"));
  }
  return true;
}

}  // namespace mpitron
