// tests/cuda_sim/include/cublas_v2.h — the simulated device has cuBLASLt only (cublasLt.h).
#pragma once
#include "cublasLt.h"
