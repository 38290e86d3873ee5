// core/profiler.h — marks the span of a run that an external GPU profiler records.
//
// Started with --profile-from-start off, Nsight Compute (ncu) and Nsight
// Systems record only between profiler_start() and profiler_stop(): the timed
// steps of a benchmark, say, without its set-up and warm-up (bench_train
// --profile, tools/gpu_check.sh). cudaProfilerStart / cudaProfilerStop; nothing
// without CUDA, and nothing when no profiler is attached.
#pragma once

namespace mpitron {

void profiler_start();
void profiler_stop();

}  // namespace mpitron
