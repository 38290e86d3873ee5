// core/device_memory.h — how much memory a run on a device can use at most
// (what the memory estimate is checked against before anything is allocated).
#pragma once
#include <cstdint>

#include "core/device.h"

namespace mpitron {

// Physical RAM for the CPU; the GPU's total memory for a CUDA device.
int64_t device_memory_bytes(const Device& d);

}  // namespace mpitron
