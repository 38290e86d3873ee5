// tests/cuda_sim/cublaslt.cpp — cuBLASLt on the simulated device: a reference GEMM
// (and cuBLAS's cublasGemmGroupedBatchedEx, the same GEMM per problem: see the end).
//
// Semantics are cuBLASLt's (column-major): with op(X) = X or Xᵀ per TRANSA/TRANSB,
//   D[b] (m, n) = alpha · op(A[b]) (m, k) · op(B[b]) (k, n) + beta · C[b]  [+ bias (m) per column]
// where each layout is (rows, cols, ld) column-major with an optional batch count
// and strided-batch offset (elements). Accumulation is f32 in k order, one rounding
// to D's type. Layout shapes, types, batch counts, ld ≥ rows and the alignments
// promised through the preference (MIN_ALIGNMENT_*) are checked: a violation is
// CUBLAS_STATUS_INVALID_VALUE with a message on stderr, where real cuBLASLt might
// silently pick a kernel that faults. The GEMM is an operation of its stream
// (tests/cuda_sim/streams.cpp): checked for races over the exact bytes of A, B,
// C, D and the bias, then run by the stream's worker.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "cublasLt.h"
#include "cublas_v2.h"
#include "tests/cuda_sim/sim.h"

struct cublasLtContext {
  int unused = 0;
};
struct cublasLtMatmulDescOpaque_sim {
  cublasComputeType_t compute;
  cublasOperation_t ta = CUBLAS_OP_N, tb = CUBLAS_OP_N;
  cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_DEFAULT;
  const void* bias = nullptr;
  int32_t bias_type = -1;
};
struct cublasLtMatrixLayoutOpaque_sim {
  cudaDataType_t type;
  uint64_t rows, cols;
  int64_t ld;
  int32_t batch = 1;
  int64_t stride = 0;
};
struct cublasLtMatmulPreferenceOpaque_sim {
  uint64_t ws = 0;
  uint32_t align[4] = {256, 256, 256, 256};
  uint32_t reduction_schemes = CUBLASLT_REDUCTION_SCHEME_MASK;  // the reference GEMM never splits K
};

namespace {

cublasStatus_t misuse(const std::string& what) {
  std::fprintf(stderr, "cuda-sim cuBLASLt: %s\n", what.c_str());
  return CUBLAS_STATUS_INVALID_VALUE;
}

size_t type_size(cudaDataType_t t) {
  switch (t) {
    case CUDA_R_32F: return 4;
    case CUDA_R_16F: return 2;
    case CUDA_R_16BF: return 2;
    case CUDA_R_32I: return 4;
  }
  return 0;
}

float load(const void* p, cudaDataType_t t, int64_t i) {
  switch (t) {
    case CUDA_R_32F: return static_cast<const float*>(p)[i];
    case CUDA_R_16F: {
      _Float16 h;
      std::memcpy(&h, static_cast<const char*>(p) + 2 * i, 2);
      return static_cast<float>(h);
    }
    case CUDA_R_16BF: {
      uint32_t u = uint32_t(static_cast<const uint16_t*>(p)[i]) << 16;
      float f;
      std::memcpy(&f, &u, 4);
      return f;
    }
    default: return 0.0f;
  }
}

void store(void* p, cudaDataType_t t, int64_t i, float v) {
  switch (t) {
    case CUDA_R_32F: static_cast<float*>(p)[i] = v; break;
    case CUDA_R_16F: {
      const _Float16 h = static_cast<_Float16>(v);
      std::memcpy(static_cast<char*>(p) + 2 * i, &h, 2);
      break;
    }
    case CUDA_R_16BF: {
      uint32_t u;
      std::memcpy(&u, &v, 4);
      if ((u & 0x7fffffffu) > 0x7f800000u) {
        u = (u >> 16) | 0x40;
      } else {
        u += 0x7fffu + ((u >> 16) & 1u);
        u >>= 16;
      }
      static_cast<uint16_t*>(p)[i] = static_cast<uint16_t>(u);
      break;
    }
    default: break;
  }
}

// Shape checks shared by the heuristic and the matmul.
cublasStatus_t check(const cublasLtMatmulDescOpaque_sim& d, const cublasLtMatrixLayoutOpaque_sim& a,
                     const cublasLtMatrixLayoutOpaque_sim& b, const cublasLtMatrixLayoutOpaque_sim& c,
                     const cublasLtMatrixLayoutOpaque_sim& dl) {
  const uint64_t m = d.ta == CUBLAS_OP_N ? a.rows : a.cols, k = d.ta == CUBLAS_OP_N ? a.cols : a.rows;
  const uint64_t kb = d.tb == CUBLAS_OP_N ? b.rows : b.cols, n = d.tb == CUBLAS_OP_N ? b.cols : b.rows;
  const auto dims = [](const cublasLtMatrixLayoutOpaque_sim& l) {
    return "(" + std::to_string(l.rows) + "x" + std::to_string(l.cols) + " ld " + std::to_string(l.ld) + ")";
  };
  if (k != kb || dl.rows != m || dl.cols != n || c.rows != m || c.cols != n)
    return misuse("inconsistent shapes: A " + dims(a) + (d.ta ? "ᵀ" : "") + " B " + dims(b) + (d.tb ? "ᵀ" : "") +
                  " C " + dims(c) + " D " + dims(dl));
  for (const auto* l : {&a, &b, &c, &dl})
    if (l->ld < static_cast<int64_t>(l->rows) || l->ld < 1) return misuse("leading dimension below rows: " + dims(*l));
  if (a.type != b.type) return misuse("A and B differ in type");
  if (c.type != dl.type || (dl.type != a.type && dl.type != CUDA_R_32F)) return misuse("unsupported C/D type");
  if (a.batch != dl.batch || b.batch != dl.batch || c.batch != dl.batch) return misuse("batch counts differ");
  if (d.epilogue == CUBLASLT_EPILOGUE_BIAS && d.bias_type != dl.type) return misuse("bias type is not D's type");
  return CUBLAS_STATUS_SUCCESS;
}

}  // namespace

const char* cublasGetStatusName(cublasStatus_t s) {
  switch (s) {
    case CUBLAS_STATUS_SUCCESS: return "CUBLAS_STATUS_SUCCESS";
    case CUBLAS_STATUS_NOT_INITIALIZED: return "CUBLAS_STATUS_NOT_INITIALIZED";
    case CUBLAS_STATUS_ALLOC_FAILED: return "CUBLAS_STATUS_ALLOC_FAILED";
    case CUBLAS_STATUS_INVALID_VALUE: return "CUBLAS_STATUS_INVALID_VALUE";
    case CUBLAS_STATUS_EXECUTION_FAILED: return "CUBLAS_STATUS_EXECUTION_FAILED";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "CUBLAS_STATUS_NOT_SUPPORTED";
  }
  return "CUBLAS_STATUS_UNKNOWN";
}
const char* cublasGetStatusString(cublasStatus_t s) {
  if (s == CUBLAS_STATUS_EXECUTION_FAILED) return cudaGetErrorString(cudaErrorIllegalState);  // the race report
  return s == CUBLAS_STATUS_INVALID_VALUE ? "invalid value (simulated cuBLASLt: see stderr)" : cublasGetStatusName(s);
}

cublasStatus_t cublasLtCreate(cublasLtHandle_t* h) {
  *h = new cublasLtContext;
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtDestroy(cublasLtHandle_t h) {
  delete h;
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulDescCreate(cublasLtMatmulDesc_t* d, cublasComputeType_t compute, cudaDataType_t scale) {
  if (scale != CUDA_R_32F) return misuse("scale type must be f32");
  *d = new cublasLtMatmulDescOpaque_sim{compute};
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t d) {
  delete d;
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t d, cublasLtMatmulDescAttributes_t a,
                                              const void* buf, size_t bytes) {
  switch (a) {
    case CUBLASLT_MATMUL_DESC_TRANSA:
      if (bytes != sizeof(int32_t)) return misuse("TRANSA size");
      std::memcpy(&d->ta, buf, 4);
      break;
    case CUBLASLT_MATMUL_DESC_TRANSB:
      if (bytes != sizeof(int32_t)) return misuse("TRANSB size");
      std::memcpy(&d->tb, buf, 4);
      break;
    case CUBLASLT_MATMUL_DESC_EPILOGUE:
      if (bytes != sizeof(int32_t)) return misuse("EPILOGUE size");
      std::memcpy(&d->epilogue, buf, 4);
      if (d->epilogue != CUBLASLT_EPILOGUE_DEFAULT && d->epilogue != CUBLASLT_EPILOGUE_BIAS)
        return misuse("only the DEFAULT and BIAS epilogues are simulated");
      break;
    case CUBLASLT_MATMUL_DESC_BIAS_POINTER:
      if (bytes != sizeof(void*)) return misuse("BIAS_POINTER size");
      std::memcpy(&d->bias, buf, sizeof(void*));
      break;
    case CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE:
      if (bytes != sizeof(int32_t)) return misuse("BIAS_DATA_TYPE size");
      std::memcpy(&d->bias_type, buf, 4);
      break;
    default: return misuse("matmul attribute " + std::to_string(a) + " is not simulated");
  }
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t* l, cudaDataType_t t, uint64_t rows, uint64_t cols,
                                          int64_t ld) {
  if (type_size(t) == 0) return misuse("layout type");
  *l = new cublasLtMatrixLayoutOpaque_sim{t, rows, cols, ld};
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t l) {
  delete l;
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatrixLayoutSetAttribute(cublasLtMatrixLayout_t l, cublasLtMatrixLayoutAttribute_t a,
                                                const void* buf, size_t bytes) {
  if (a == CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT && bytes == sizeof(int32_t)) {
    std::memcpy(&l->batch, buf, 4);
    return l->batch >= 1 ? CUBLAS_STATUS_SUCCESS : misuse("batch count < 1");
  }
  if (a == CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET && bytes == sizeof(int64_t)) {
    std::memcpy(&l->stride, buf, 8);
    return CUBLAS_STATUS_SUCCESS;
  }
  return misuse("layout attribute " + std::to_string(a) + " (or its size) is not simulated");
}
cublasStatus_t cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t* p) {
  *p = new cublasLtMatmulPreferenceOpaque_sim;
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t p) {
  delete p;
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulPreferenceSetAttribute(cublasLtMatmulPreference_t p,
                                                    cublasLtMatmulPreferenceAttributes_t a, const void* buf,
                                                    size_t bytes) {
  if (a == CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES && bytes == sizeof(uint64_t)) {
    std::memcpy(&p->ws, buf, 8);
    return CUBLAS_STATUS_SUCCESS;
  }
  if (a == CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK && bytes == sizeof(uint32_t)) {
    std::memcpy(&p->reduction_schemes, buf, 4);
    return (p->reduction_schemes & ~uint32_t{CUBLASLT_REDUCTION_SCHEME_MASK}) == 0
               ? CUBLAS_STATUS_SUCCESS
               : misuse("reduction scheme mask " + std::to_string(p->reduction_schemes) + " has unknown bits");
  }
  if (a >= CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES && a <= CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES &&
      bytes == sizeof(uint32_t)) {
    std::memcpy(&p->align[a - CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES], buf, 4);
    return CUBLAS_STATUS_SUCCESS;
  }
  return misuse("preference attribute " + std::to_string(a) + " (or its size) is not simulated");
}

cublasStatus_t cublasLtMatmulAlgoGetHeuristic(cublasLtHandle_t h, cublasLtMatmulDesc_t d, cublasLtMatrixLayout_t a,
                                              cublasLtMatrixLayout_t b, cublasLtMatrixLayout_t c,
                                              cublasLtMatrixLayout_t dl, cublasLtMatmulPreference_t p,
                                              int requested, cublasLtMatmulHeuristicResult_t* results, int* found) {
  if (!h || !d || !a || !b || !c || !dl || !p || requested < 1) return misuse("heuristic: null argument");
  const cublasStatus_t st = check(*d, *a, *b, *c, *dl);
  if (st != CUBLAS_STATUS_SUCCESS) return st;
  // The "algorithm" remembers the alignments it was chosen for.
  results[0] = cublasLtMatmulHeuristicResult_t{};
  for (int i = 0; i < 4; ++i) results[0].algo.data[i] = p->align[i];
  results[0].state = CUBLAS_STATUS_SUCCESS;
  *found = 1;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmul(cublasLtHandle_t h, cublasLtMatmulDesc_t d, const void* alpha, const void* A,
                              cublasLtMatrixLayout_t la, const void* B, cublasLtMatrixLayout_t lb, const void* beta,
                              const void* C, cublasLtMatrixLayout_t lc, void* D, cublasLtMatrixLayout_t ld,
                              const cublasLtMatmulAlgo_t* algo, void* workspace, size_t workspace_bytes,
                              cudaStream_t stream) {
  if (!h || !d || !la || !lb || !lc || !ld || !alpha || !beta) return misuse("matmul: null argument");
  const cublasStatus_t st = check(*d, *la, *lb, *lc, *ld);
  if (st != CUBLAS_STATUS_SUCCESS) return st;
  if (algo) {
    const void* ptrs[4] = {A, B, C, D};
    const cublasLtMatrixLayoutOpaque_sim* ls[4] = {la, lb, lc, ld};
    for (int i = 0; i < 4; ++i) {
      const uint64_t need = algo->data[i];
      const uint64_t stride_bytes = ls[i]->batch > 1 ? ls[i]->stride * type_size(ls[i]->type) : 0;
      if (need && (reinterpret_cast<uintptr_t>(ptrs[i]) % need != 0 || (stride_bytes % need) != 0))
        return misuse(std::string("operand ") + "ABCD"[i] + " is less aligned than the " + std::to_string(need) +
                      " bytes promised to the heuristic");
    }
  }
  if (d->epilogue == CUBLASLT_EPILOGUE_BIAS && !d->bias) return misuse("BIAS epilogue without a bias pointer");
  // Copies: the descriptors may change or go before the stream runs the GEMM.
  const cublasLtMatmulDescOpaque_sim dd = *d;
  const cublasLtMatrixLayoutOpaque_sim a = *la, b = *lb, c = *lc, dl = *ld;
  const float al = *static_cast<const float*>(alpha), be = *static_cast<const float*>(beta);
  const auto extent = [](const cublasLtMatrixLayoutOpaque_sim& l) {  // bytes from the pointer
    const int64_t last = (l.batch > 1 ? (l.batch - 1) * l.stride : 0) + (int64_t(l.cols) - 1) * l.ld + int64_t(l.rows);
    return static_cast<size_t>(l.rows && l.cols ? last : 0) * type_size(l.type);
  };
  std::vector<mpitron::cuda::sim::Access> acc = {{A, extent(a), false}, {B, extent(b), false}, {D, extent(dl), true}};
  if (be != 0.0f) acc.push_back({C, extent(c), false});
  if (dd.epilogue == CUBLASLT_EPILOGUE_BIAS) acc.push_back({dd.bias, dl.rows * type_size(dl.type), false});
  const cudaError_t e = mpitron::cuda::sim::enqueue(stream, "cublasLtMatmul", std::move(acc), [=] {
    const bool ta = dd.ta != CUBLAS_OP_N, tb = dd.tb != CUBLAS_OP_N;
    const int64_t m = dl.rows, n = dl.cols, k = ta ? a.rows : a.cols;
    std::vector<float> at(static_cast<size_t>(m * k)), bt(static_cast<size_t>(n * k));
    for (int32_t bi = 0; bi < dl.batch; ++bi) {
      const auto off = [&](const cublasLtMatrixLayoutOpaque_sim& l) { return l.batch > 1 ? bi * l.stride : 0; };
      const int64_t oa = off(a), ob = off(b), oc = off(c), od = off(dl);
      // at[i][l] = op(A)(i, l), bt[j][l] = op(B)(l, j): contiguous in l for the dot products.
      for (int64_t i = 0; i < m; ++i)
        for (int64_t l = 0; l < k; ++l) at[i * k + l] = load(A, a.type, oa + (ta ? i * a.ld + l : l * a.ld + i));
      for (int64_t j = 0; j < n; ++j)
        for (int64_t l = 0; l < k; ++l) bt[j * k + l] = load(B, b.type, ob + (tb ? l * b.ld + j : j * b.ld + l));
      for (int64_t j = 0; j < n; ++j) {
        for (int64_t i = 0; i < m; ++i) {
          const float* x = &at[i * k];
          const float* y = &bt[j * k];
          float sum = 0.0f;
          for (int64_t l = 0; l < k; ++l) sum += x[l] * y[l];
          float v = al * sum;
          if (be != 0.0f) v += be * load(C, c.type, oc + j * c.ld + i);
          if (dd.epilogue == CUBLASLT_EPILOGUE_BIAS) v += load(dd.bias, dl.type, i);
          store(D, dl.type, od + j * dl.ld + i, v);
        }
      }
    }
  });
  return e == cudaSuccess ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_EXECUTION_FAILED;
}

// ---- cuBLAS: the handle and cublasGemmGroupedBatchedEx -----------------------------------
// Every problem is the reference GEMM above (f32 accumulation in k order, one rounding to
// C's type), with alpha/beta read from the host when the call is made (host pointer mode).
// Checked, as misuse (CUBLAS_STATUS_INVALID_VALUE, or NOT_SUPPORTED for a type combination
// cuBLAS does not list): the type combination, dims and leading dimensions, pointer arrays
// in device memory, and 16-byte aligned matrices for 16-bit and TF32 types (cuBLAS asks
// that they be "properly aligned", ideally to 16 bytes; mpitron promises 16).
// The pointer arrays are device memory a kernel reads when it runs; the simulator has to
// know the matrices' bytes for the race check when the call is queued, so it waits until
// the stream has run what was queued before (the copy filling the arrays) and reads them
// then. Arrays written on another stream, ordered only by an event, would be read early:
// write them on the calling stream (as tensor/cuda/grouped_gemm.cu does).
struct cublasContext {
  cudaStream_t stream = nullptr;
  void* workspace = nullptr;
  size_t workspace_bytes = 0;
};

cublasStatus_t cublasCreate(cublasHandle_t* h) {
  if (!h) return misuse("cublasCreate: null handle pointer");
  *h = new cublasContext;
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasDestroy(cublasHandle_t h) {
  delete h;
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasSetStream(cublasHandle_t h, cudaStream_t s) {
  if (!h) return CUBLAS_STATUS_NOT_INITIALIZED;
  h->stream = s;
  h->workspace = nullptr;  // cuBLAS: back to the default workspace pool
  h->workspace_bytes = 0;
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasSetWorkspace(cublasHandle_t h, void* workspace, size_t bytes) {
  if (!h) return CUBLAS_STATUS_NOT_INITIALIZED;
  if (bytes && !mpitron::cuda::sim::is_device_memory(workspace)) return misuse("cublasSetWorkspace: not device memory");
  h->workspace = workspace;
  h->workspace_bytes = bytes;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasGemmGroupedBatchedEx(cublasHandle_t handle, const cublasOperation_t transa_array[],
                                          const cublasOperation_t transb_array[], const int m_array[],
                                          const int n_array[], const int k_array[], const void* alpha_array,
                                          const void* const Aarray[], cudaDataType_t Atype, const int lda_array[],
                                          const void* const Barray[], cudaDataType_t Btype, const int ldb_array[],
                                          const void* beta_array, void* const Carray[], cudaDataType_t Ctype,
                                          const int ldc_array[], int group_count, const int group_size[],
                                          cublasComputeType_t computeType) {
  namespace sim = mpitron::cuda::sim;
  if (!handle) return CUBLAS_STATUS_NOT_INITIALIZED;
  if (group_count < 0) return misuse("grouped gemm: group_count < 0");
  if (group_count == 0) return CUBLAS_STATUS_SUCCESS;
  if (!transa_array || !transb_array || !m_array || !n_array || !k_array || !alpha_array || !lda_array ||
      !ldb_array || !beta_array || !ldc_array || !group_size || !Aarray || !Barray || !Carray)
    return misuse("grouped gemm: null argument");
  if (Atype != Btype || Atype != Ctype) {
    std::fprintf(stderr, "cuda-sim cuBLAS: grouped gemm: Atype, Btype and Ctype must be equal\n");
    return CUBLAS_STATUS_NOT_SUPPORTED;
  }
  const bool fast = computeType == CUBLAS_COMPUTE_32F_FAST_TF32;
  if (!(computeType == CUBLAS_COMPUTE_32F && (Atype == CUDA_R_32F || Atype == CUDA_R_16F || Atype == CUDA_R_16BF)) &&
      !(fast && Atype == CUDA_R_32F)) {
    std::fprintf(stderr, "cuda-sim cuBLAS: grouped gemm: unsupported type / compute type combination\n");
    return CUBLAS_STATUS_NOT_SUPPORTED;
  }
  const size_t es = type_size(Atype);
  const bool need16 = fast || Atype != CUDA_R_32F;
  struct One {  // one problem, its group's parameters copied
    const void *a, *b;
    void* c;
    bool ta, tb;
    int64_t m, n, k, lda, ldb, ldc;
    float alpha, beta;
  };
  int64_t total = 0;
  for (int i = 0; i < group_count; ++i) {
    if (group_size[i] < 0) return misuse("grouped gemm: group_size < 0");
    total += group_size[i];
  }
  const size_t ptr_bytes = static_cast<size_t>(total) * sizeof(void*);
  for (const void* arr : {static_cast<const void*>(Aarray), static_cast<const void*>(Barray),
                          static_cast<const void*>(Carray)})
    if (total && !sim::is_device_memory(arr)) return misuse("grouped gemm: the pointer arrays must be in device memory");
  // Read the arrays once the stream has run everything queued before this call (see above).
  sim::Stream* st = sim::stream_of(handle->stream);
  const sim::Clock clock = sim::clock_of(st);
  const int sid = sim::stream_id(st);
  if (clock.size() > static_cast<size_t>(sid) && clock[static_cast<size_t>(sid)] > 0)
    sim::host_wait(st, clock[static_cast<size_t>(sid)]);  // (an explicit seq: the host learns nothing)
  std::vector<One> ps;
  std::vector<sim::Access> acc = {{Aarray, ptr_bytes, false}, {Barray, ptr_bytes, false}, {Carray, ptr_bytes, false}};
  const float* alphas = static_cast<const float*>(alpha_array);
  const float* betas = static_cast<const float*>(beta_array);
  const auto extent = [&](int64_t rows, int64_t cols, int64_t ld) {
    return rows && cols ? static_cast<size_t>((cols - 1) * ld + rows) * es : size_t{0};
  };
  int64_t p = 0;
  for (int i = 0; i < group_count; ++i) {
    One o{};
    o.ta = transa_array[i] != CUBLAS_OP_N;
    o.tb = transb_array[i] != CUBLAS_OP_N;
    o.m = m_array[i], o.n = n_array[i], o.k = k_array[i];
    o.lda = lda_array[i], o.ldb = ldb_array[i], o.ldc = ldc_array[i];
    o.alpha = alphas[i], o.beta = betas[i];
    const int64_t ar = o.ta ? o.k : o.m, ac = o.ta ? o.m : o.k, br = o.tb ? o.n : o.k, bc = o.tb ? o.k : o.n;
    if (o.m < 0 || o.n < 0 || o.k < 0) return misuse("grouped gemm: negative m, n or k in group " + std::to_string(i));
    if (o.lda < std::max<int64_t>(1, ar) || o.ldb < std::max<int64_t>(1, br) || o.ldc < std::max<int64_t>(1, o.m))
      return misuse("grouped gemm: leading dimension below rows in group " + std::to_string(i));
    for (int j = 0; j < group_size[i]; ++j, ++p) {
      o.a = Aarray[p], o.b = Barray[p], o.c = Carray[p];
      if (o.m == 0 || o.n == 0) continue;
      for (const void* q : {o.a, o.b, static_cast<const void*>(o.c)})
        if (need16 && reinterpret_cast<uintptr_t>(q) % 16 != 0)
          return misuse("grouped gemm: a 16-bit / TF32 matrix pointer is not 16-byte aligned (problem " +
                        std::to_string(p) + ")");
      if (o.k > 0) {
        acc.push_back({o.a, extent(ar, ac, o.lda), false});
        acc.push_back({o.b, extent(br, bc, o.ldb), false});
      }
      if (o.beta != 0.0f) acc.push_back({o.c, extent(o.m, o.n, o.ldc), false});
      acc.push_back({o.c, extent(o.m, o.n, o.ldc), true});
      ps.push_back(o);
    }
  }
  const cudaDataType_t t = Atype;
  const cudaError_t e = sim::enqueue(handle->stream, "cublasGemmGroupedBatchedEx", std::move(acc), [ps, t] {
    std::vector<float> at, bt;
    for (const One& o : ps) {
      // at[i][l] = op(A)(i, l), bt[j][l] = op(B)(l, j): contiguous in l for the dot products.
      at.resize(static_cast<size_t>(o.m * o.k));
      bt.resize(static_cast<size_t>(o.n * o.k));
      for (int64_t i = 0; i < o.m; ++i)
        for (int64_t l = 0; l < o.k; ++l) at[i * o.k + l] = load(o.a, t, o.ta ? i * o.lda + l : l * o.lda + i);
      for (int64_t j = 0; j < o.n; ++j)
        for (int64_t l = 0; l < o.k; ++l) bt[j * o.k + l] = load(o.b, t, o.tb ? l * o.ldb + j : j * o.ldb + l);
      for (int64_t j = 0; j < o.n; ++j)
        for (int64_t i = 0; i < o.m; ++i) {
          float sum = 0.0f;
          for (int64_t l = 0; l < o.k; ++l) sum += at[i * o.k + l] * bt[j * o.k + l];
          float v = o.alpha * sum;
          if (o.beta != 0.0f) v += o.beta * load(o.c, t, j * o.ldc + i);
          store(o.c, t, j * o.ldc + i, v);
        }
    }
  });
  return e == cudaSuccess ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_EXECUTION_FAILED;
}
