#include "core/profiler.h"

#ifdef MPITRON_WITH_CUDA
#include <cuda_profiler_api.h>
#include <cuda_runtime.h>

#include "core/device.h"
#endif

namespace mpitron {

// A failure is cleared and ignored: a profiler marker must never stop a run, nor
// leave an error for the next launch check to find.
void profiler_start() {
#ifdef MPITRON_WITH_CUDA
  if (cuda_available() && cudaProfilerStart() != cudaSuccess) cudaGetLastError();
#endif
}

void profiler_stop() {
#ifdef MPITRON_WITH_CUDA
  if (cuda_available() && cudaProfilerStop() != cudaSuccess) cudaGetLastError();
#endif
}

}  // namespace mpitron
