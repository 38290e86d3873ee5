// tensor/cpu/gemm.cpp — gemm forward and backward through OpenBLAS sgemm.
//
// Non-f32 operands are widened to f32 scratch, multiplied with f32
// accumulation, and rounded into the output.
#include <cblas.h>

#include "tensor/cpu/common.h"
#include "tensor/cpu/ops.h"

namespace mpitron::cpu {

namespace {

// One operand of a (possibly batched) product, as row-major f32 memory.
struct Operand {
  const float* p;
  int64_t batch_stride;  // 0: shared by every batch entry
  bool trans;
  int64_t rows, cols;  // of the stored matrix
};

// C[i] = alpha·op(A[i])·op(B[i]) + beta·C[i] for i < batch. With c_stride 0 the
// products of every batch entry are summed into one C (beta applies once).
void sgemm_batched(int64_t batch, int64_t m, int64_t n, int64_t k, float alpha, const Operand& a,
                   const Operand& b, float beta, float* c, int64_t c_stride) {
  if (m == 0 || n == 0) return;
  for (int64_t i = 0; i < batch; ++i) {
    const float bi = (c_stride == 0 && i > 0) ? 1.0f : beta;
    float* ci = c + i * c_stride;
    if (k == 0) {  // empty sum: C = beta·C
      for (int64_t j = 0; j < m * n; ++j) ci[j] = bi == 0.0f ? 0.0f : bi * ci[j];
      continue;
    }
    cblas_sgemm(CblasRowMajor, a.trans ? CblasTrans : CblasNoTrans, b.trans ? CblasTrans : CblasNoTrans,
                static_cast<int>(m), static_cast<int>(n), static_cast<int>(k), alpha, a.p + i * a.batch_stride,
                static_cast<int>(a.cols), b.p + i * b.batch_stride, static_cast<int>(b.cols), bi, ci,
                static_cast<int>(n));
  }
}

Operand operand(const Tensor& t, const float* p, bool trans) {
  const int64_t r = t.dim(-2), c = t.dim(-1);
  return Operand{p, t.ndim() == 3 ? r * c : 0, trans, r, c};
}

int64_t batch_of(const Tensor& a, const Tensor& b) {
  return std::max(a.ndim() == 3 ? a.dim(0) : 1, b.ndim() == 3 ? b.dim(0) : 1);
}

// out (rows, n) += bias (n) on every row.
void add_bias_rows(float* out, const float* bias, int64_t rows, int64_t n) {
#pragma omp parallel for schedule(static) if (rows * n > 65536)
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t j = 0; j < n; ++j) out[r * n + j] += bias[j];
}

}  // namespace

void gemm(const Tensor& a, const Tensor& b, const Tensor& out, const GemmArgs& g, const Tensor& bias, Stream) {
  const int64_t batch = batch_of(a, b);
  const int64_t m = g.trans_a ? a.dim(-1) : a.dim(-2), k = g.trans_a ? a.dim(-2) : a.dim(-1);
  const int64_t n = g.trans_b ? b.dim(-2) : b.dim(-1);
  F32In fa(a), fb(b), fbias(bias);
  F32Out fo(out, g.beta != 0.0f);
  Operand oa = operand(a, fa.get(), g.trans_a), ob = operand(b, fb.get(), g.trans_b);
  if (oa.batch_stride != 0 && ob.batch_stride == 0 && !g.trans_a) {
    // A shared B with a batched, untransposed A: fold the batch into M (one big sgemm).
    oa.batch_stride = 0;
    sgemm_batched(1, batch * m, n, k, g.alpha, oa, ob, g.beta, fo.get(), 0);
  } else {
    sgemm_batched(batch, m, n, k, g.alpha, oa, ob, g.beta, fo.get(), m * n);
  }
  if (bias.defined()) add_bias_rows(fo.get(), fbias.get(), batch * m, n);
  fo.commit();
}

void gemm_backward(const Tensor& dout, const Tensor& a, const Tensor& b, const Tensor& da, const Tensor& db,
                   const Tensor& dbias, const GemmArgs& g, bool accumulate_a, bool accumulate_b, Stream) {
  const int64_t batch = batch_of(a, b);
  const int64_t m = g.trans_a ? a.dim(-1) : a.dim(-2), k = g.trans_a ? a.dim(-2) : a.dim(-1);
  const int64_t n = g.trans_b ? b.dim(-2) : b.dim(-1);
  F32In fd(dout), fa(a), fb(b);
  const Operand od{fd.get(), dout.ndim() == 3 ? m * n : 0, false, m, n};
  const float alpha = g.alpha;

  if (da.defined()) {
    F32Out out(da, accumulate_a);
    const float beta = accumulate_a ? 1.0f : 0.0f;
    const int64_t stride = a.ndim() == 3 ? m * k : 0;  // 0: a is shared, sum over batch
    Operand ob = operand(b, fb.get(), false);
    if (!g.trans_a) {
      // da (M,K) = dout (M,N) · op(b)ᵀ
      ob.trans = !g.trans_b;
      sgemm_batched(batch, m, k, n, alpha, od, ob, beta, out.get(), stride);
    } else {
      // da (K,M) = op(b) (K,N) · doutᵀ
      ob.trans = g.trans_b;
      Operand odt = od;
      odt.trans = true;
      sgemm_batched(batch, k, m, n, alpha, ob, odt, beta, out.get(), stride);
    }
    out.commit();
  }
  if (db.defined()) {
    F32Out out(db, accumulate_b);
    const float beta = accumulate_b ? 1.0f : 0.0f;
    const int64_t stride = b.ndim() == 3 ? k * n : 0;
    Operand oa = operand(a, fa.get(), false);
    if (!g.trans_b) {
      // db (K,N) = op(a)ᵀ (K,M) · dout (M,N)
      oa.trans = !g.trans_a;
      if (stride == 0 && oa.batch_stride != 0 && !g.trans_a) {
        // Batched a with shared b: fold the batch into the reduction dimension.
        Operand ofold = oa;
        ofold.batch_stride = 0;
        Operand dfold = od;
        dfold.batch_stride = 0;
        sgemm_batched(1, k, n, batch * m, alpha, ofold, dfold, beta, out.get(), 0);
      } else {
        sgemm_batched(batch, k, n, m, alpha, oa, od, beta, out.get(), stride);
      }
    } else {
      // db (N,K) = doutᵀ (N,M) · op(a) (M,K)
      oa.trans = g.trans_a;
      Operand odt = od;
      odt.trans = true;
      if (stride == 0 && oa.batch_stride != 0 && !g.trans_a) {
        Operand ofold = oa;
        ofold.batch_stride = 0;
        odt.batch_stride = 0;
        sgemm_batched(1, n, k, batch * m, alpha, odt, ofold, beta, out.get(), 0);
      } else {
        sgemm_batched(batch, n, k, m, alpha, odt, oa, beta, out.get(), stride);
      }
    }
    out.commit();
  }
  if (dbias.defined()) {
    F32Out out(dbias, accumulate_b);
    float* p = out.get();
    const int64_t rows = batch * m;
    const int nt = omp_get_max_threads();
    std::vector<double> part(static_cast<size_t>(nt) * n, 0.0);
#pragma omp parallel num_threads(nt)
    {
      double* mine = part.data() + static_cast<size_t>(omp_get_thread_num()) * n;
#pragma omp for schedule(static)
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t j = 0; j < n; ++j) mine[j] += fd.get()[r * n + j];
    }
    for (int64_t j = 0; j < n; ++j) {
      double s = 0;
      for (int t = 0; t < nt; ++t) s += part[static_cast<size_t>(t) * n + j];
      p[j] = static_cast<float>((accumulate_b ? p[j] : 0.0) + s);
    }
    out.commit();
  }
}

}  // namespace mpitron::cpu
