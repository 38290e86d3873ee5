// tests/cuda_sim/include/cuda_sim_tools.h — the simulated device's tool interface
// (MPITRON_CUDA_SIM builds only), in the spirit of AddressSanitizer's
// <sanitizer/asan_interface.h>: calls a program makes so the simulator can check it.
#pragma once
#include <cstdint>

#include "cuda_runtime.h"

// A caching allocator handed out `bytes` of the block [p, p + block_bytes) of a
// cudaMalloc segment for work on stream s. The race check then treats the block
// as an allocation made here (its site), still remembering the last accesses of
// those bytes under earlier blocks; with AddressSanitizer, the bytes are made
// accessible and the slack poisoned, ordered on s after the work queued before.
void cudaSimBlockAllocated(void* p, size_t bytes, size_t block_bytes, cudaStream_t s);
// The block went back to the allocator's free list of stream s (poisoned, in s's order).
void cudaSimBlockReleased(void* p, size_t block_bytes, cudaStream_t s);
// Operations of stream a that started while stream b was running one (observed concurrency).
uint64_t cudaSimOverlappedOps(cudaStream_t a, cudaStream_t b);
