// tensor/cuda/grouped_gemm.cu — the MoE experts' GEMMs (tensor/grouped_gemm.h) on CUDA.
//
//   y  rows g (c_g, M) = x rows g · w[g]ᵀ        [+ bias[g]]
//   dx rows g (c_g, K) = dy rows g · w[g]
//   dw[g]     (M, K)  += dy rows gᵀ · x rows g,  dbias[g] += Σ dy rows g
//
// One cublasGemmGroupedBatchedEx call per pass (one problem per non-empty group,
// group_size 1: the groups differ in rows) where cuBLAS allows it:
//   * A, B and C of one dtype: its supported combinations with CUBLAS_COMPUTE_32F are
//     f32/f32, bf16/bf16, f16/f16 (and f32 with CUBLAS_COMPUTE_32F_FAST_TF32); there is
//     no f32 C for 16-bit inputs, so an f32 dw of bf16/f16 weights goes per group;
//   * no epilogue: a forward with bias goes per group (cuBLASLt's bias epilogue);
//   * every matrix 16-byte aligned with 16-byte row strides (what the 16-bit and TF32
//     kernels need; asked of f32 too, one rule), dims within int.
// Otherwise (or when cuBLAS answers NOT_SUPPORTED, logged once) one cuBLASLt gemm per
// group through gemm.cu (gemm / gemm_backward on row slices), and dbias always: a
// deterministic column sum per group (gemm_backward).
//
// Layout (as gemm.cu): a row-major (R, C) matrix is the column-major (C, R) one, so
//   y:  Yᵀ (M, c)  = W'ᵀ · X'     A = w (K×M col-major, op T), B = x rows (K×c, op N)
//   dx: DXᵀ (K, c) = W' · DY'     A = w (K×M, op N),           B = dy rows (M×c, op N)
//   dw: DWᵀ (K, M) = X' · DY'ᵀ    A = x rows (K×c, op N),      B = dy rows (M×c, op T), beta 1
// The A/B/C pointer arrays must be in device memory (cuBLAS reads them from its kernel):
// one Scratch block from the caching allocator, filled by a cudaMemcpyAsync on the op's
// stream (the pageable host source is staged before the copy call returns) and released
// to that stream's free list after the call, so it is reused only by later work on it.
// alpha/beta are per-group host arrays (the handle's default host pointer mode).
// The cuBLAS handle (one per device, created here: cuBLASLt has no grouped API) is shared:
// its stream and workspace (the cuBLASLt workspace of the (device, stream), common.cu) are
// set under one mutex with the call.
#include <climits>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <vector>

#include "core/log.h"
#include "tensor/cuda/common.cuh"
#include "tensor/cuda/ops.h"

namespace mpitron::cuda {

namespace {

bool allow_tf32() {  // as gemm.cu: f32 inputs on TF32 tensor cores only when asked
  static const bool on = [] {
    const char* e = std::getenv("MPITRON_ALLOW_TF32");
    return e && std::strcmp(e, "1") == 0;
  }();
  return on;
}

// One problem of a grouped call as cuBLAS sees it (column-major, elements):
//   C (m, n) [ldc] = op(A) (m, k) [lda] · op(B) (k, n) [ldb] + beta · C
struct Problem {
  const void* a;
  const void* b;
  void* c;
  int64_t m, n, k, lda, ldb, ldc;
  float beta;
};

std::mutex g_blas_mu;
cublasHandle_t blas_handle(int device) {  // g_blas_mu held
  static auto* handles = new std::map<int, cublasHandle_t>();  // never destroyed: outlives static teardown
  auto it = handles->find(device);
  if (it != handles->end()) return it->second;
  cublasHandle_t h = nullptr;
  MPT_CUBLAS_CHECK(cublasCreate(&h));
  handles->emplace(device, h);
  return h;
}

bool aligned_stride(int64_t ld, size_t es) { return (static_cast<size_t>(ld) * es) % 16 == 0; }

// Whether cublasGemmGroupedBatchedEx takes these problems (see the header comment).
bool grouped_ok(const std::vector<Problem>& ps, size_t es) {
  for (const Problem& p : ps) {
    for (int64_t d : {p.m, p.n, p.k, p.lda, p.ldb, p.ldc})
      if (d > INT_MAX) return false;
    if (!aligned16(p.a) || !aligned16(p.b) || !aligned16(p.c)) return false;
    if (!aligned_stride(p.lda, es) || !aligned_stride(p.ldb, es) || !aligned_stride(p.ldc, es)) return false;
  }
  return true;
}

// All problems in one cublasGemmGroupedBatchedEx call on stream s (alpha 1, per-problem beta).
// False (logged once) when cuBLAS answers NOT_SUPPORTED: the caller runs a gemm per group.
bool run_grouped(int device, Stream s, DType dt, cublasOperation_t ta, cublasOperation_t tb,
                 const std::vector<Problem>& ps) {
  const size_t n = ps.size();
  if (n == 0) return true;
  std::vector<const void*> ptrs(3 * n);  // A[0..n) | B[0..n) | C[0..n)
  std::vector<int> m(n), nn(n), k(n), lda(n), ldb(n), ldc(n), size(n, 1);
  std::vector<float> alpha(n, 1.0f), beta(n);
  for (size_t i = 0; i < n; ++i) {
    const Problem& p = ps[i];
    ptrs[i] = p.a;
    ptrs[n + i] = p.b;
    ptrs[2 * n + i] = p.c;
    m[i] = static_cast<int>(p.m), nn[i] = static_cast<int>(p.n), k[i] = static_cast<int>(p.k);
    lda[i] = static_cast<int>(p.lda), ldb[i] = static_cast<int>(p.ldb), ldc[i] = static_cast<int>(p.ldc);
    beta[i] = p.beta;
  }
  const cudaStream_t st = stream_of(s);
  const size_t bytes = ptrs.size() * sizeof(void*);
  Scratch dptrs(device, bytes, s);
  MPT_CUDA_CHECK(cudaMemcpyAsync(dptrs.get(), ptrs.data(), bytes, cudaMemcpyHostToDevice, st));
  const auto* const* dp = dptrs.get<const void* const>();
  const cudaDataType_t t = cuda_dtype(dt);
  const cublasComputeType_t compute =
      dt == DType::F32 && allow_tf32() ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
  const std::vector<cublasOperation_t> tas(n, ta), tbs(n, tb);

  std::lock_guard<std::mutex> lock(g_blas_mu);
  const cublasHandle_t h = blas_handle(device);
  size_t ws_bytes = 0;
  void* ws = cublaslt_workspace(device, s, &ws_bytes);
  MPT_CUBLAS_CHECK(cublasSetStream(h, st));  // (resets the workspace: set it after)
  MPT_CUBLAS_CHECK(cublasSetWorkspace(h, ws, ws_bytes));
  const cublasStatus_t st_call = cublasGemmGroupedBatchedEx(
      h, tas.data(), tbs.data(), m.data(), nn.data(), k.data(), alpha.data(), dp, t, lda.data(), dp + n, t,
      ldb.data(), beta.data(), const_cast<void* const*>(dp + 2 * n), t, ldc.data(), static_cast<int>(n), size.data(),
      compute);
  if (st_call == CUBLAS_STATUS_NOT_SUPPORTED) {
    static bool warned = false;  // (g_blas_mu held)
    if (!warned)
      log_warn(str("grouped_gemm: cublasGemmGroupedBatchedEx does not support ", dtype_name(dt),
                   " here; running a gemm per group"));
    warned = true;
    return false;
  }
  MPT_CUBLAS_CHECK(st_call);
  return true;
}

GemmArgs linear() {  // y = x · wᵀ
  GemmArgs a;
  a.trans_b = true;
  return a;
}
const Tensor& or_none(const std::vector<Tensor>& v, size_t g) {
  static const Tensor none;
  return v.empty() ? none : v[g];
}
const char* at(const Tensor& t, int64_t elems) {
  return static_cast<const char*>(t.data_ptr()) + elems * static_cast<int64_t>(dtype_size(t.dtype()));
}

}  // namespace

void grouped_gemm(const Tensor& x, const std::vector<Tensor>& w, const std::vector<int64_t>& counts, const Tensor& y,
                  const std::vector<Tensor>& bias, Stream s) {
  DeviceGuard guard(x);
  const int64_t K = x.dim(1), M = y.dim(1);
  std::vector<Problem> ps;  // Yᵀ (M, c) = W'ᵀ (M, K) · X' (K, c)
  int64_t o = 0;
  for (size_t g = 0; g < counts.size(); o += counts[g], ++g)
    if (counts[g] > 0)
      ps.push_back({w[g].data_ptr(), at(x, o * K), const_cast<char*>(at(y, o * M)), M, counts[g], K, K, K, M, 0.0f});
  if (ps.empty() || M == 0) return;
  // K == 0 (y = 0 + bias) and biases go through gemm.cu, which handles both.
  const bool grouped = bias.empty() && K > 0 && grouped_ok(ps, dtype_size(x.dtype())) &&
                       run_grouped(x.device().index, s, x.dtype(), CUBLAS_OP_T, CUBLAS_OP_N, ps);
  path_count_add("grouped_gemm", grouped ? "grouped" : "per_group");
  if (grouped) return;
  o = 0;
  for (size_t g = 0; g < counts.size(); o += counts[g], ++g)
    if (counts[g] > 0)
      cuda::gemm(x.slice(0, o, o + counts[g]), w[g], y.slice(0, o, o + counts[g]), linear(), or_none(bias, g), s);
}

void grouped_gemm_backward(const Tensor& dy, const Tensor& x, const std::vector<Tensor>& w,
                           const std::vector<int64_t>& counts, const Tensor& dx, const std::vector<Tensor>& dw,
                           const std::vector<Tensor>& dbias, Stream s) {
  DeviceGuard guard(x);
  const DType dt = x.dtype();
  const size_t es = dtype_size(dt);
  const int64_t K = x.dim(1), M = dy.dim(1);
  std::vector<Problem> pdx, pdw;
  bool dw_same_dtype = true;
  int64_t o = 0;
  for (size_t g = 0; g < counts.size(); o += counts[g], ++g) {
    if (counts[g] == 0) continue;
    const int64_t c = counts[g];
    if (dx.defined())  // DXᵀ (K, c) = W' (K, M) · DY' (M, c)
      pdx.push_back({w[g].data_ptr(), at(dy, o * M), const_cast<char*>(at(dx, o * K)), K, c, M, K, M, K, 0.0f});
    if (!dw.empty() && dw[g].defined()) {  // DWᵀ (K, M) += X' (K, c) · DY'ᵀ (c, M)
      pdw.push_back({at(x, o * K), at(dy, o * M), dw[g].data_ptr(), K, M, c, K, M, K, 1.0f});
      dw_same_dtype = dw_same_dtype && dw[g].dtype() == dt;
    }
  }
  // M == 0 (dx = 0) goes through gemm.cu, which writes the zeros; K == 0: dx and dw are empty.
  const int dev = x.device().index;
  const bool dx_grouped = !pdx.empty() && M > 0 && K > 0 && grouped_ok(pdx, es) &&
                          run_grouped(dev, s, dt, CUBLAS_OP_N, CUBLAS_OP_N, pdx);
  const bool dw_grouped = !pdw.empty() && M > 0 && K > 0 && dw_same_dtype && grouped_ok(pdw, es) &&
                          run_grouped(dev, s, dt, CUBLAS_OP_N, CUBLAS_OP_T, pdw);
  if (!pdx.empty()) path_count_add("grouped_gemm_dx", dx_grouped ? "grouped" : "per_group");
  if (!pdw.empty()) path_count_add("grouped_gemm_dw", dw_grouped ? "grouped" : "per_group");
  // The rest per group: dx / dw where not grouped, and dbias (a column sum of the group's dy rows).
  o = 0;
  for (size_t g = 0; g < counts.size(); o += counts[g], ++g) {
    if (counts[g] == 0) continue;
    const int64_t e = o + counts[g];
    const Tensor dxg = dx.defined() && !dx_grouped ? dx.slice(0, o, e) : Tensor();
    const Tensor dwg = dw_grouped ? Tensor() : or_none(dw, g);
    const Tensor& dbg = or_none(dbias, g);
    if (dxg.defined() || dwg.defined() || dbg.defined())
      cuda::gemm_backward(dy.slice(0, o, e), x.slice(0, o, e), w[g], dxg, dwg, dbg, linear(), false, true, s);
  }
}

}  // namespace mpitron::cuda
