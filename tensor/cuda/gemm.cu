// tensor/cuda/gemm.cu — matrix products on cuBLASLt, forward and backward.
//
//   gemm:           out (B?, M, N) = alpha · op(a) · op(b) + beta · out [+ bias (N)]
//   gemm_backward:  da = dout·op(b)ᵀ (or op(b)·doutᵀ when trans_a), db = op(a)ᵀ·dout
//                   (or doutᵀ·op(a) when trans_b), dbias = Σ_rows dout.
//                   accumulate_a → da += ; accumulate_b → db += and dbias += .
//
// Layout trick: our tensors are row-major, cuBLASLt is column-major. A row-major
// (R, C) matrix is the column-major (C, R) matrix with the same bytes, so
//   out (M, N) = op(a)·op(b)   ⇔   outᵀ (N, M) = op(b)ᵀ · op(a)ᵀ
// and we hand cuBLASLt A := b, B := a, m := N, n := M (no data moves).
//
// Precision: accumulation and alpha/beta are f32 (CUBLAS_COMPUTE_32F). f32
// inputs are exact f32 unless MPITRON_ALLOW_TF32=1 (then TF32 tensor cores).
// Out may be f32 for bf16/f16 inputs (f32 gradients of 16-bit weights).
//
// Batching: a 3-D operand has one leading batch dim, a 2-D operand is shared by
// all batches (batch stride 0). When a is batched, not transposed and b is
// shared, the batch is folded into M (one big GEMM, better for cuBLASLt).
// Gradients of a shared operand are summed over the batch: by folding the batch
// into K where the layout allows it, otherwise by one GEMM per batch with beta=1.
//
// Plans (descriptors, layouts and the heuristic's algorithm) are cached by a key
// of everything the heuristic sees: shapes, strides, ops, dtypes, epilogue and
// pointer alignments. A cuBLASLt workspace per (device, stream) comes from the
// caching allocator (common.cu).
#include <array>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>

#include "core/log.h"
#include "tensor/cuda/common.cuh"
#include "tensor/cuda/internal.h"
#include "tensor/cuda/ops.h"
#include "tensor/cuda/reduce.cuh"
#include "tensor/elementwise.h"

namespace mpitron::cuda {

namespace {

using Operand = MatOperand;

Operand operand_of(const Tensor& t) {
  const int64_t r = t.dim(-2), c = t.dim(-1);
  return {t.data_ptr(), r, c, c, t.ndim() == 3 ? r * c : 0};
}

bool allow_tf32() {
  static const bool on = [] {
    const char* e = std::getenv("MPITRON_ALLOW_TF32");
    return e && std::strcmp(e, "1") == 0;
  }();
  return on;
}

// ---- bias (and K == 0) without the cuBLASLt epilogue -------------------------------
// out[r, c] = (read_out ? beta · out[r, c] : 0) + (bias ? bias[c] : 0)
template <typename T>
__global__ void bias_rows_kernel(T* out, int64_t rows, int64_t cols, float beta, bool read_out, const T* bias) {
  const int64_t n = rows * cols;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    float v = read_out ? beta * to_float(out[i]) : 0.0f;
    if (bias) v += to_float(bias[i % cols]);
    out[i] = from_float<T>(v);
  }
}

void bias_rows(void* out, DType dt, int64_t rows, int64_t cols, float beta, bool read_out, const void* bias,
               cudaStream_t st) {
  if (rows * cols == 0) return;
  MPT_DISPATCH_DEV_FLOAT(dt, "gemm bias", [&](auto tag) {
    using T = decltype(tag);
    MPT_LAUNCH(grid_for(rows * cols, 256), 256, 0, st, bias_rows_kernel<T>)(
        static_cast<T*>(out), rows, cols, beta, read_out, static_cast<const T*>(bias));
  });
  MPT_KERNEL_CHECK("gemm bias");
}

// Column-sum functor for dbias: the value of dout at (row, col).
template <typename T> struct RowValues {
  const T* d;
  int64_t cols;
  __device__ float2 operator()(int64_t r, int c) const { return make_float2(to_float(d[r * cols + c]), 0.0f); }
};

// Alignment (bytes, <= 256) of a base pointer and of every batch entry after it.
int operand_alignment(const void* p, size_t batch_stride_bytes) {
  int al = ptr_alignment(p);
  if (batch_stride_bytes) al = std::min(al, ptr_alignment(reinterpret_cast<const void*>(batch_stride_bytes)));
  return al;
}

// ---- plan cache -------------------------------------------------------------------------
struct Plan {
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t la = nullptr, lb = nullptr, lc = nullptr;
  cublasLtMatmulAlgo_t algo{};
  bool ok = false;
};
using PlanKey = std::array<int64_t, 24>;

std::mutex g_plan_mu;
std::map<PlanKey, Plan>& plan_cache() {
  static auto* cache = new std::map<PlanKey, Plan>();  // never destroyed: handles outlive static teardown
  return *cache;
}

cublasLtMatrixLayout_t make_layout(cudaDataType_t t, int64_t rows, int64_t cols, int64_t ld, int64_t batch,
                                   int64_t bstride) {
  cublasLtMatrixLayout_t l = nullptr;
  MPT_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&l, t, static_cast<uint64_t>(rows), static_cast<uint64_t>(cols), ld));
  if (batch > 1) {
    const int32_t b = static_cast<int32_t>(batch);
    MPT_CUBLAS_CHECK(cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &b, sizeof(b)));
    MPT_CUBLAS_CHECK(
        cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &bstride, sizeof(bstride)));
  }
  return l;
}

// Descriptors, layouts and the heuristic's first choice for one problem (ok=false: none).
Plan make_plan(cublasLtHandle_t h, cublasComputeType_t compute, cudaDataType_t tin, cudaDataType_t tout,
               const Operand& a, bool ta, const Operand& b, bool tb, int64_t out_ld, int64_t out_bstride, int64_t m,
               int64_t n, int64_t batch, const void* bias, size_t ws_bytes, int align_a, int align_b,
               int align_out) {
  Plan p;
  MPT_CUBLAS_CHECK(cublasLtMatmulDescCreate(&p.desc, compute, CUDA_R_32F));
  // cuBLASLt's A is our b, its B is our a (see the header comment).
  const cublasOperation_t op_a = tb ? CUBLAS_OP_T : CUBLAS_OP_N, op_b = ta ? CUBLAS_OP_T : CUBLAS_OP_N;
  MPT_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSA, &op_a, sizeof(op_a)));
  MPT_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSB, &op_b, sizeof(op_b)));
  if (bias) {
    const cublasLtEpilogue_t epi = CUBLASLT_EPILOGUE_BIAS;
    const int32_t bias_t = tout;  // bias has out's dtype (gemm.h)
    MPT_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof(epi)));
    MPT_CUBLAS_CHECK(
        cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bias_t, sizeof(bias_t)));
    // Before the heuristic: it infers the bias alignment from this pointer (a
    // parameter view in the flat buffer may be only 2- or 4-byte aligned).
    MPT_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof(bias)));
  }
  p.la = make_layout(tin, b.cols, b.rows, b.ld, batch, b.bstride);
  p.lb = make_layout(tin, a.cols, a.rows, a.ld, batch, a.bstride);
  p.lc = make_layout(tout, n, m, out_ld, batch, out_bstride);

  cublasLtMatmulPreference_t pref = nullptr;
  MPT_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
  MPT_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws_bytes,
                                                        sizeof(ws_bytes)));
  // The default assumes 256-byte alignment; views into a buffer may be less aligned.
  // (cuBLASLt's A is our b.)
  const uint32_t al_a = align_b, al_b = align_a, al_c = align_out;
  MPT_CUBLAS_CHECK(
      cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &al_a, sizeof(al_a)));
  MPT_CUBLAS_CHECK(
      cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &al_b, sizeof(al_b)));
  MPT_CUBLAS_CHECK(
      cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &al_c, sizeof(al_c)));
  MPT_CUBLAS_CHECK(
      cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &al_c, sizeof(al_c)));
  if (tout != CUDA_R_32F) {
    // Split-K partial sums only in f32 (the compute type): the in-place and output-type
    // schemes keep them in D's 16-bit type, a rounding per partial (seen on an H200: a
    // bf16 GEMM with K = 32 and a 4-byte aligned bias off by ~20 bf16 ulps of the result).
    const uint32_t schemes = CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE;
    MPT_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK, &schemes,
                                                          sizeof(schemes)));
  }
  cublasLtMatmulHeuristicResult_t res{};
  int found = 0;
  const cublasStatus_t hs = cublasLtMatmulAlgoGetHeuristic(h, p.desc, p.la, p.lb, p.lc, p.lc, pref, 1, &res, &found);
  cublasLtMatmulPreferenceDestroy(pref);
  p.ok = hs == CUBLAS_STATUS_SUCCESS && found > 0;
  if (p.ok) p.algo = res.algo;
  return p;
}

}  // namespace

// out (batch, M, N) [row stride out_ld, batch stride out_bstride] =
//   alpha · op(a) · op(b) + beta · out [+ bias]   (internal.h)
void strided_matmul(int device, Stream s, DType in_dt, DType out_dt, Operand a, bool ta, Operand b, bool tb,
                    void* out, int64_t out_ld, int64_t out_bstride, int64_t batch, float alpha, float beta, const void* bias) {
  int64_t m = ta ? a.cols : a.rows;
  const int64_t k = ta ? a.rows : a.cols;
  const int64_t n = tb ? b.rows : b.cols;
  const cudaStream_t st = stream_of(s);
  if (m == 0 || n == 0 || batch == 0) return;
  if (k == 0) {  // op(a)·op(b) is zero: out = beta·out + bias
    if (bias) path_count_add("gemm", "bias_kernel");
    for (int64_t i = 0; i < batch; ++i)
      bias_rows(static_cast<char*>(out) + i * out_bstride * dtype_size(out_dt), out_dt, m, n, beta, beta != 0.0f,
                bias, st);
    return;
  }
  // Fold the batch into M: a is (batch·M, K) row-major and b is shared.
  if (batch > 1 && !ta && b.bstride == 0 && a.bstride == m * a.ld && out_bstride == m * out_ld) {
    a.rows *= batch;
    m *= batch;
    batch = 1;
  }
  if (batch == 1) a.bstride = b.bstride = out_bstride = 0;

  const cudaDataType_t tin = cuda_dtype(in_dt), tout = cuda_dtype(out_dt);
  const cublasComputeType_t compute =
      in_dt == DType::F32 && allow_tf32() ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
  const bool use_bias_epilogue = bias != nullptr;
  // Alignment cuBLASLt may assume: of the base pointer and of every batch entry.
  const size_t in_es = dtype_size(in_dt), out_es = dtype_size(out_dt);
  const int al_a = operand_alignment(a.ptr, a.bstride * in_es), al_b = operand_alignment(b.ptr, b.bstride * in_es);
  const int al_out = operand_alignment(out, out_bstride * out_es);
  const PlanKey key{device,
                    static_cast<int64_t>(in_dt),
                    static_cast<int64_t>(out_dt),
                    ta,
                    tb,
                    m,
                    n,
                    k,
                    a.ld,
                    b.ld,
                    out_ld,
                    a.bstride,
                    b.bstride,
                    out_bstride,
                    batch,
                    use_bias_epilogue,
                    al_a,
                    al_b,
                    al_out,
                    bias ? ptr_alignment(bias) : 0,
                    static_cast<int64_t>(compute),
                    0,
                    0,
                    0};

  bool bias_separately = false, per_batch = false;
  {
    std::lock_guard<std::mutex> lock(g_plan_mu);  // plans are shared: the bias pointer is set per call
    const cublasLtHandle_t h = cublaslt_handle(device);
    size_t ws_bytes = 0;
    void* ws = cublaslt_workspace(device, s, &ws_bytes);
    auto& cache = plan_cache();
    auto it = cache.find(key);
    if (it == cache.end()) it = cache.emplace(key, make_plan(h, compute, tin, tout, a, ta, b, tb, out_ld, out_bstride,
                                                           m, n, batch, bias, ws_bytes, al_a, al_b, al_out)).first;
    Plan& p = it->second;
    bool lt_ok = false;
    if (p.ok) {
      if (use_bias_epilogue)  // the plan's key holds the bias alignment; this call's pointer has the same
        MPT_CUBLAS_CHECK(
            cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof(bias)));
      const cublasStatus_t ms = cublasLtMatmul(h, p.desc, &alpha, b.ptr, p.la, a.ptr, p.lb, &beta, out, p.lc, out,
                                               p.lc, &p.algo, ws, ws_bytes, st);
      if (!use_bias_epilogue) MPT_CUBLAS_CHECK(ms);
      lt_ok = ms == CUBLAS_STATUS_SUCCESS;
      if (!lt_ok) {
        // The epilogue was refused at run time: this plan applies its bias separately from now on.
        p.ok = false;
        log_warn(str("gemm: cuBLASLt rejected the bias epilogue (", cublasGetStatusName(ms), ") for m=", m,
                     " n=", n, " k=", k, " bias alignment ", ptr_alignment(bias), "; using a separate bias kernel"));
      }
    }
    if (lt_ok) {
      path_count_add("gemm", use_bias_epilogue ? "epilogue_bias" : "lt");
      return;
    }
    // Not run: the heuristic found no algorithm, or cuBLASLt refused the bias epilogue.
    if (!use_bias_epilogue && batch > 1) {
      per_batch = true;  // e.g. no kernel for a stride-0 (shared) operand: one GEMM per batch entry
    } else if (!use_bias_epilogue) {
      MPT_THROW(str("cuBLASLt has no algorithm for gemm ", dtype_name(in_dt), "->", dtype_name(out_dt), " m=", m,
                    " n=", n, " k=", k, " batch=", batch, ta ? " trans_a" : "", tb ? " trans_b" : ""),
                "check the shapes and the alignment of the operands (views at odd offsets)");
    } else {
      bias_separately = true;
    }
  }
  if (bias_separately) path_count_add("gemm", "bias_kernel");
  if (per_batch) {
    for (int64_t i = 0; i < batch; ++i)
      strided_matmul(device, s, in_dt, out_dt, a.at(i, in_dt), ta, b.at(i, in_dt), tb,
                     static_cast<char*>(out) + i * out_bstride * dtype_size(out_dt), out_ld, 0, 1, alpha, beta,
                     nullptr);
    return;
  }
  if (bias_separately) {
    // Some dtype combinations have no fused-bias kernel: GEMM, then a bias pass.
    strided_matmul(device, s, in_dt, out_dt, a, ta, b, tb, out, out_ld, out_bstride, batch, alpha, beta, nullptr);
    for (int64_t i = 0; i < batch; ++i)
      bias_rows(static_cast<char*>(out) + i * out_bstride * dtype_size(out_dt), out_dt, m, n, 1.0f, true, bias, st);
  }
}

namespace {
void matmul(int device, Stream s, DType in_dt, DType out_dt, Operand a, bool ta, Operand b, bool tb, void* out,
            int64_t out_ld, int64_t out_bstride, int64_t batch, float alpha, float beta, const void* bias) {
  strided_matmul(device, s, in_dt, out_dt, a, ta, b, tb, out, out_ld, out_bstride, batch, alpha, beta, bias);
}
}  // namespace

// out (B?, M, N) = alpha · op(a) · op(b) + beta · out [+ bias (N)]
void gemm(const Tensor& a, const Tensor& b, const Tensor& out, const GemmArgs& args, const Tensor& bias, Stream s) {
  DeviceGuard g(a);
  const Operand oa = operand_of(a), ob = operand_of(b);
  const int64_t m = out.dim(-2), n = out.dim(-1);
  const int64_t batch = out.ndim() == 3 ? out.dim(0) : 1;
  matmul(a.device().index, s, a.dtype(), out.dtype(), oa, args.trans_a, ob, args.trans_b, out.data_ptr(), n,
         out.ndim() == 3 ? m * n : 0, batch, args.alpha, args.beta, bias.defined() ? bias.data_ptr() : nullptr);
}

// The gradient of an operand shared by every batch entry is a sum of one GEMM per
// entry. Summed into a bf16/f16 gradient with beta = 1, the running sum would be
// rounded to 16 bits after every entry (errors grow with the batch: the simulated
// device's gemm test caught it); the entries are summed in an f32 buffer instead
// and the result is added (accumulate) or written once. per_entry(i, out, out_dt, beta)
// runs entry i's GEMM into `out`.
template <class PerEntry>
void sum_over_batch(const Tensor& grad, bool accumulate, int64_t batch, PerEntry per_entry, Stream s) {
  if (grad.dtype() == DType::F32) {
    for (int64_t i = 0; i < batch; ++i) per_entry(i, grad.data_ptr(), DType::F32, i == 0 && !accumulate ? 0.0f : 1.0f);
    return;
  }
  const Tensor acc = Tensor::empty(grad.shape(), DType::F32, grad.device(), s);
  for (int64_t i = 0; i < batch; ++i) per_entry(i, acc.data_ptr(), DType::F32, i == 0 ? 0.0f : 1.0f);
  ::mpitron::axpby(1.0f, acc, accumulate ? 1.0f : 0.0f, grad, s);
}

// Gradients of out = op(a)·op(b) + bias given dout (B?, M, N); see gemm.h.
void gemm_backward(const Tensor& dout, const Tensor& a, const Tensor& b, const Tensor& da, const Tensor& db,
                   const Tensor& dbias, const GemmArgs& args, bool accumulate_a, bool accumulate_b, Stream s) {
  DeviceGuard g(a);
  const int dev = a.device().index;
  const DType dt = a.dtype();
  const bool ta = args.trans_a, tb = args.trans_b;
  const Operand oa = operand_of(a), ob = operand_of(b), od = operand_of(dout);
  const int64_t m = dout.dim(-2), n = dout.dim(-1);
  const int64_t batch = dout.ndim() == 3 ? dout.dim(0) : 1;

  if (da.defined()) {
    // !ta: da (M, K) = dout · op(b)ᵀ = matmul(dout, b, trans = !tb)
    //  ta: da (K, M) = op(b) · doutᵀ = matmul(b [tb], dout [T])
    const float beta = accumulate_a ? 1.0f : 0.0f;
    const int64_t r = da.dim(-2), c = da.dim(-1);
    if (a.ndim() == 3 || batch == 1) {
      const int64_t bs = a.ndim() == 3 ? r * c : 0;
      if (!ta)
        matmul(dev, s, dt, da.dtype(), od, false, ob, !tb, da.data_ptr(), c, bs, batch, 1.0f, beta, nullptr);
      else
        matmul(dev, s, dt, da.dtype(), ob, tb, od, true, da.data_ptr(), c, bs, batch, 1.0f, beta, nullptr);
    } else {
      // a shared by every batch entry: da = Σ_batch (…), one GEMM per batch entry, summed in f32.
      sum_over_batch(da, accumulate_a, batch, [&](int64_t i, void* out, DType out_dt, float bi) {
        if (!ta)
          matmul(dev, s, dt, out_dt, od.at(i, dt), false, ob.at(i, dt), !tb, out, c, 0, 1, 1.0f, bi, nullptr);
        else
          matmul(dev, s, dt, out_dt, ob.at(i, dt), tb, od.at(i, dt), true, out, c, 0, 1, 1.0f, bi, nullptr);
      }, s);
    }
  }

  if (db.defined()) {
    // !tb: db (K, N) = op(a)ᵀ · dout = matmul(a [!ta], dout)
    //  tb: db (N, K) = doutᵀ · op(a) = matmul(dout [T], a [ta])
    const float beta = accumulate_b ? 1.0f : 0.0f;
    const int64_t r = db.dim(-2), c = db.dim(-1);
    if (b.ndim() == 3 || batch == 1) {
      const int64_t bs = b.ndim() == 3 ? r * c : 0;
      if (!tb)
        matmul(dev, s, dt, db.dtype(), oa, !ta, od, false, db.data_ptr(), c, bs, batch, 1.0f, beta, nullptr);
      else
        matmul(dev, s, dt, db.dtype(), od, true, oa, ta, db.data_ptr(), c, bs, batch, 1.0f, beta, nullptr);
    } else if (!ta) {
      // b shared, a (B, M, K) not transposed: fold the batch into the reduction dim,
      // a → (B·M, K), dout → (B·M, N).
      const Operand fa{oa.ptr, batch * oa.rows, oa.cols, oa.ld, 0};
      const Operand fd{od.ptr, batch * od.rows, od.cols, od.ld, 0};
      if (!tb)
        matmul(dev, s, dt, db.dtype(), fa, true, fd, false, db.data_ptr(), c, 0, 1, 1.0f, beta, nullptr);
      else
        matmul(dev, s, dt, db.dtype(), fd, true, fa, false, db.data_ptr(), c, 0, 1, 1.0f, beta, nullptr);
    } else {  // b shared, a transposed: one GEMM per batch entry, summed in f32
      sum_over_batch(db, accumulate_b, batch, [&](int64_t i, void* out, DType out_dt, float bi) {
        if (!tb)
          matmul(dev, s, dt, out_dt, oa.at(i, dt), false, od.at(i, dt), false, out, c, 0, 1, 1.0f, bi, nullptr);
        else
          matmul(dev, s, dt, out_dt, od.at(i, dt), true, oa.at(i, dt), true, out, c, 0, 1, 1.0f, bi, nullptr);
      }, s);
    }
  }

  if (dbias.defined()) {
    // dbias (N) = Σ over the batch·M rows of dout (deterministic column sums).
    const int64_t rows = batch * m;
    MPT_DISPATCH_DEV_FLOAT(dt, "gemm_backward dbias", [&](auto tag) {
      using T = decltype(tag);
      const RowValues<T> f{static_cast<const T*>(dout.data_ptr()), n};
      MPT_DISPATCH_DEV_FLOAT(dbias.dtype(), "gemm_backward dbias", [&](auto otag) {
        using O = decltype(otag);
        column_sums(f, rows, static_cast<int>(n), static_cast<O*>(dbias.data_ptr()), static_cast<O*>(nullptr),
                    accumulate_b, dev, s);
      });
    });
  }
}

}  // namespace mpitron::cuda
