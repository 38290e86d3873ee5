// tests/cuda_sim/include/cublas_v2.h — the part of cuBLAS mpitron uses, for the simulated
// device: cuBLASLt (cublasLt.h) and, of the classic API, a handle with its stream and
// workspace and cublasGemmGroupedBatchedEx (tests/cuda_sim/cublaslt.cpp), which runs the
// reference GEMM of every problem with cuBLAS's column-major semantics.
#pragma once
#include "cublasLt.h"

typedef struct cublasContext* cublasHandle_t;

cublasStatus_t cublasCreate(cublasHandle_t* h);
cublasStatus_t cublasDestroy(cublasHandle_t h);
// As cuBLAS: setting the stream resets the workspace to the library's own.
cublasStatus_t cublasSetStream(cublasHandle_t h, cudaStream_t s);
cublasStatus_t cublasSetWorkspace(cublasHandle_t h, void* workspace, size_t bytes);
// For every group i and problem j < group_size[i] (pointer index p, counted over all groups):
//   C[p] (m_i, n_i) [ldc_i] = alpha_i · op_i(A[p]) · op_i(B[p]) + beta_i · C[p]
// Aarray, Barray, Carray: device arrays of device pointers; the other arrays on the host
// (alpha/beta: host pointer mode, f32 for the 32F compute types). Atype = Btype = Ctype:
// f32, bf16 or f16 with CUBLAS_COMPUTE_32F, f32 with CUBLAS_COMPUTE_32F_FAST_TF32.
cublasStatus_t cublasGemmGroupedBatchedEx(cublasHandle_t handle, const cublasOperation_t transa_array[],
                                          const cublasOperation_t transb_array[], const int m_array[],
                                          const int n_array[], const int k_array[], const void* alpha_array,
                                          const void* const Aarray[], cudaDataType_t Atype, const int lda_array[],
                                          const void* const Barray[], cudaDataType_t Btype, const int ldb_array[],
                                          const void* beta_array, void* const Carray[], cudaDataType_t Ctype,
                                          const int ldc_array[], int group_count, const int group_size[],
                                          cublasComputeType_t computeType);
