// tests/cuda_sim/sim.h — what the simulated device's runtime files share.
#pragma once
#include <string>

#include "cuda_runtime.h"

namespace mpitron::cuda::sim {
// Makes `e` the pending error of cudaGetLastError; cudaGetErrorString(e) returns `what`.
void set_launch_error(cudaError_t e, const std::string& what);
// Appends this process's launch counts to $MPITRON_CUDA_SIM_COUNTS (at exit).
void write_counts();
}  // namespace mpitron::cuda::sim
