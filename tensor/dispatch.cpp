// tensor/dispatch.cpp — the public op entry points: validate, then call the backend.
#include <algorithm>
#include <cmath>

#include "tensor/cpu/ops.h"
#include "tensor/cuda/ops.h"

namespace mpitron {

namespace {

bool on_cuda(const Tensor& t) { return t.device().is_cuda(); }

#ifdef MPITRON_WITH_CUDA
#define MPT_BACKEND(first, fn, ...)                      \
  do {                                                   \
    if (on_cuda(first)) cuda::fn(__VA_ARGS__);           \
    else cpu::fn(__VA_ARGS__);                           \
  } while (0)
#else
#define MPT_BACKEND(first, fn, ...)                                                     \
  do {                                                                                  \
    MPT_CHECK(!on_cuda(first), str(#fn, ": CUDA tensor"), cuda_unavailable_reason());   \
    cpu::fn(__VA_ARGS__);                                                               \
  } while (0)
#endif

void need(bool cond, const std::string& what) {
  if (!cond) MPT_THROW(what, "");
}
void need_float(const char* op, const Tensor& t, const char* name) {
  need(t.defined(), str(op, ": ", name, " is undefined"));
  need(is_floating(t.dtype()), str(op, ": ", name, " must be f32/bf16/f16, got ", t.describe()));
}
void need_index(const char* op, const Tensor& t, const char* name) {
  need(t.defined(), str(op, ": ", name, " is undefined"));
  need(t.dtype() == DType::I32 || t.dtype() == DType::I64,
       str(op, ": ", name, " must be i32 or i64, got ", t.describe()));
}
void need_shape(const char* op, const Tensor& t, const char* name, const Shape& s) {
  need(t.shape() == s, str(op, ": ", name, " must have shape ", shape_str(s), ", got ", t.describe()));
}
void need_f32(const char* op, const Tensor& t, const char* name) {
  need(t.dtype() == DType::F32, str(op, ": ", name, " must be f32, got ", t.describe()));
}
// Parameter gradients may be f32 or the compute dtype.
void need_grad_dtype(const char* op, const Tensor& g, const char* name, DType compute) {
  if (!g.defined()) return;
  need(g.dtype() == DType::F32 || g.dtype() == compute,
       str(op, ": ", name, " must be f32 or ", dtype_name(compute), ", got ", g.describe()));
}

}  // namespace

// ---- gemm ---------------------------------------------------------------------
namespace {
struct GemmDims {
  int64_t batch, m, n, k;
};
GemmDims gemm_dims(const char* op, const Tensor& a, const Tensor& b, const GemmArgs& g) {
  need(a.ndim() == 2 || a.ndim() == 3, str(op, ": a must be 2-D or 3-D, got ", a.describe()));
  need(b.ndim() == 2 || b.ndim() == 3, str(op, ": b must be 2-D or 3-D, got ", b.describe()));
  const int64_t ba = a.ndim() == 3 ? a.dim(0) : 1, bb = b.ndim() == 3 ? b.dim(0) : 1;
  need(a.ndim() == 2 || b.ndim() == 2 || ba == bb,
       str(op, ": batch sizes differ: a ", a.describe(), ", b ", b.describe()));
  const int64_t m = g.trans_a ? a.dim(-1) : a.dim(-2), ka = g.trans_a ? a.dim(-2) : a.dim(-1);
  const int64_t kb = g.trans_b ? b.dim(-1) : b.dim(-2), n = g.trans_b ? b.dim(-2) : b.dim(-1);
  need(ka == kb, str(op, ": inner dimensions differ (", ka, " vs ", kb, "): a ", a.describe(),
                     g.trans_a ? "ᵀ" : "", ", b ", b.describe(), g.trans_b ? "ᵀ" : ""));
  return {std::max(ba, bb), m, n, ka};
}
Shape gemm_out_shape(const Tensor& a, const Tensor& b, const GemmDims& d) {
  if (a.ndim() == 3 || b.ndim() == 3) return {d.batch, d.m, d.n};
  return {d.m, d.n};
}
}  // namespace

void gemm(const Tensor& a, const Tensor& b, const Tensor& out, const GemmArgs& args, const Tensor& bias, Stream s) {
  const char* op = "gemm";
  need_float(op, a, "a");
  need_float(op, b, "b");
  need(a.dtype() == b.dtype(), str(op, ": a and b dtypes differ: ", a.describe(), ", ", b.describe()));
  need(out.defined(), str(op, ": out is undefined"));
  need(out.dtype() == a.dtype() || out.dtype() == DType::F32,
       str(op, ": out must be ", dtype_name(a.dtype()), " or f32, got ", out.describe()));
  const GemmDims d = gemm_dims(op, a, b, args);
  need_shape(op, out, "out", gemm_out_shape(a, b, d));
  if (bias.defined()) {
    need_shape(op, bias, "bias", {d.n});
    need(bias.dtype() == out.dtype(), str(op, ": bias must have out's dtype, got ", bias.describe()));
  }
  check_same_device(op, {&a, &b, &out, &bias});
  check_contiguous(op, {{&a, "a"}, {&b, "b"}, {&out, "out"}, {&bias, "bias"}});
  MPT_BACKEND(a, gemm, a, b, out, args, bias, s);
}

void gemm_backward(const Tensor& dout, const Tensor& a, const Tensor& b, const Tensor& da, const Tensor& db,
                   const Tensor& dbias, const GemmArgs& args, bool accumulate_a, bool accumulate_b, Stream s) {
  const char* op = "gemm_backward";
  need_float(op, a, "a");
  need_float(op, b, "b");
  need_float(op, dout, "dout");
  need(a.dtype() == b.dtype() && dout.dtype() == a.dtype(),
       str(op, ": a, b and dout must share a dtype: ", a.describe(), ", ", b.describe(), ", ", dout.describe()));
  const GemmDims d = gemm_dims(op, a, b, args);
  need_shape(op, dout, "dout", gemm_out_shape(a, b, d));
  if (da.defined()) need_shape(op, da, "da", a.shape());
  if (db.defined()) need_shape(op, db, "db", b.shape());
  if (dbias.defined()) need_shape(op, dbias, "dbias", {d.n});
  need(!da.defined() || da.dtype() == a.dtype() || da.dtype() == DType::F32,
       str(op, ": da must be ", dtype_name(a.dtype()), " or f32, got ", da.describe()));
  need_grad_dtype(op, db, "db", a.dtype());
  need_grad_dtype(op, dbias, "dbias", a.dtype());
  check_same_device(op, {&dout, &a, &b, &da, &db, &dbias});
  check_contiguous(op, {{&dout, "dout"}, {&a, "a"}, {&b, "b"}, {&da, "da"}, {&db, "db"}, {&dbias, "dbias"}});
  MPT_BACKEND(a, gemm_backward, dout, a, b, da, db, dbias, args, accumulate_a, accumulate_b, s);
}

// ---- layernorm -------------------------------------------------------------------
void layernorm_forward(const Tensor& x, const Tensor& weight, const Tensor& bias, const Tensor& out,
                       const Tensor& mean, const Tensor& rstd, float eps, Stream s) {
  const char* op = "layernorm_forward";
  need_float(op, x, "x");
  const int64_t c = x.dim(-1), n = x.numel() / std::max<int64_t>(c, 1);
  need_shape(op, weight, "weight", {c});
  need_shape(op, bias, "bias", {c});
  need(weight.dtype() == x.dtype() && bias.dtype() == x.dtype(), str(op, ": weight and bias must have x's dtype"));
  check_same_shape(op, x, "x", out, "out");
  need(out.dtype() == x.dtype(), str(op, ": out must have x's dtype, got ", out.describe()));
  need_shape(op, mean, "mean", {n});
  need_shape(op, rstd, "rstd", {n});
  need_f32(op, mean, "mean");
  need_f32(op, rstd, "rstd");
  check_same_device(op, {&x, &weight, &bias, &out, &mean, &rstd});
  check_contiguous(op, {{&x, "x"}, {&out, "out"}, {&weight, "weight"}, {&bias, "bias"}, {&mean, "mean"}, {&rstd, "rstd"}});
  MPT_BACKEND(x, layernorm_forward, x, weight, bias, out, mean, rstd, eps, s);
}

void layernorm_backward(const Tensor& dout, const Tensor& x, const Tensor& weight, const Tensor& mean,
                        const Tensor& rstd, const Tensor& dx, const Tensor& dweight, const Tensor& dbias,
                        bool accumulate_dx, Stream s) {
  const char* op = "layernorm_backward";
  need_float(op, x, "x");
  const int64_t c = x.dim(-1), n = x.numel() / std::max<int64_t>(c, 1);
  check_same_shape(op, x, "x", dout, "dout");
  need(dout.dtype() == x.dtype(), str(op, ": dout must have x's dtype"));
  need_shape(op, weight, "weight", {c});
  need_shape(op, mean, "mean", {n});
  need_shape(op, rstd, "rstd", {n});
  if (dx.defined()) {
    check_same_shape(op, x, "x", dx, "dx");
    need(dx.dtype() == x.dtype(), str(op, ": dx must have x's dtype"));
  }
  if (dweight.defined()) need_shape(op, dweight, "dweight", {c});
  if (dbias.defined()) need_shape(op, dbias, "dbias", {c});
  need_grad_dtype(op, dweight, "dweight", x.dtype());
  need_grad_dtype(op, dbias, "dbias", x.dtype());
  check_same_device(op, {&dout, &x, &weight, &mean, &rstd, &dx, &dweight, &dbias});
  check_contiguous(op, {{&dout, "dout"}, {&x, "x"}, {&dx, "dx"}, {&dweight, "dweight"}, {&dbias, "dbias"}});
  MPT_BACKEND(x, layernorm_backward, dout, x, weight, mean, rstd, dx, dweight, dbias, accumulate_dx, s);
}

// ---- rmsnorm ---------------------------------------------------------------------------
void rmsnorm_forward(const Tensor& x, const Tensor& weight, const Tensor& out, const Tensor& rstd, float eps,
                     Stream s) {
  const char* op = "rmsnorm_forward";
  need_float(op, x, "x");
  const int64_t c = x.dim(-1), n = x.numel() / std::max<int64_t>(c, 1);
  need_shape(op, weight, "weight", {c});
  need(weight.dtype() == x.dtype(), str(op, ": weight must have x's dtype, got ", weight.describe()));
  need(out.defined(), str(op, ": out is undefined"));
  check_same_shape(op, x, "x", out, "out");
  need(out.dtype() == x.dtype(), str(op, ": out must have x's dtype, got ", out.describe()));
  need_shape(op, rstd, "rstd", {n});
  need_f32(op, rstd, "rstd");
  need(eps >= 0.0f, str(op, ": eps must be >= 0 (--norm-epsilon), got ", eps));
  check_same_device(op, {&x, &weight, &out, &rstd});
  check_contiguous(op, {{&x, "x"}, {&weight, "weight"}, {&out, "out"}, {&rstd, "rstd"}});
  MPT_BACKEND(x, rmsnorm_forward, x, weight, out, rstd, eps, s);
}

void rmsnorm_backward(const Tensor& dout, const Tensor& x, const Tensor& weight, const Tensor& rstd,
                      const Tensor& dx, const Tensor& dweight, bool accumulate_dx, Stream s) {
  const char* op = "rmsnorm_backward";
  need_float(op, x, "x");
  const int64_t c = x.dim(-1), n = x.numel() / std::max<int64_t>(c, 1);
  need(dout.defined(), str(op, ": dout is undefined"));
  check_same_shape(op, x, "x", dout, "dout");
  need(dout.dtype() == x.dtype(), str(op, ": dout must have x's dtype, got ", dout.describe()));
  need_shape(op, weight, "weight", {c});
  need(weight.dtype() == x.dtype(), str(op, ": weight must have x's dtype, got ", weight.describe()));
  need_shape(op, rstd, "rstd", {n});
  need_f32(op, rstd, "rstd");
  if (dx.defined()) {
    check_same_shape(op, x, "x", dx, "dx");
    need(dx.dtype() == x.dtype(), str(op, ": dx must have x's dtype, got ", dx.describe()));
  }
  if (dweight.defined()) need_shape(op, dweight, "dweight", {c});
  need_grad_dtype(op, dweight, "dweight", x.dtype());
  check_same_device(op, {&dout, &x, &weight, &rstd, &dx, &dweight});
  check_contiguous(op, {{&dout, "dout"}, {&x, "x"}, {&weight, "weight"}, {&rstd, "rstd"}, {&dx, "dx"},
                        {&dweight, "dweight"}});
  MPT_BACKEND(x, rmsnorm_backward, dout, x, weight, rstd, dx, dweight, accumulate_dx, s);
}

// ---- head_norm (QK-norm over head views) -------------------------------------------------
namespace {
// A (N, H, D) head view: float, 3-D, the heads of a row packed (stride(2) == 1, stride(1) == D),
// the row stride free (>= 0). ref: the view whose shape and dtype it must share (null: itself).
void check_head_view(const char* op, const Tensor& t, const char* name, const Tensor* ref, const char* rn) {
  need_float(op, t, name);
  need(t.ndim() == 3, str(op, ": ", name, " must be an (N, H, D) view of the heads, got ", t.describe()));
  need(t.dim(1) >= 1 && t.dim(2) >= 1, str(op, ": ", name, " ", t.describe(), " has no heads or an empty head dim"));
  if (ref) {
    need(t.shape() == ref->shape(), str(op, ": ", name, " ", t.describe(), " must have ", rn, "'s shape ",
                                        shape_str(ref->shape())));
    need(t.dtype() == ref->dtype(), str(op, ": ", name, " must have ", rn, "'s dtype, got ", t.describe()));
  }
  const Shape& st = t.strides();
  need((t.dim(2) <= 1 || st[2] == 1) && (t.dim(1) <= 1 || st[1] == t.dim(2)) && st[0] >= 0,
       str(op, ": ", name, " ", t.describe(), " must have each row's heads packed (strides (·, D, 1)), has strides ",
           shape_str(st), " (slice whole heads of a packed row; do not transpose)"));
}
// A statistic (N, G) f32 contiguous, G = H (per head) or 1 (whole row); returns G.
int64_t check_head_stat(const char* op, const Tensor& t, const char* name, const Tensor& x) {
  const int64_t N = x.dim(0), H = x.dim(1);
  need(t.defined(), str(op, ": ", name, " is undefined"));
  need(t.ndim() == 2 && t.dim(0) == N && (t.dim(1) == H || t.dim(1) == 1),
       str(op, ": ", name, " must be (N, H) = (", N, ", ", H, ") (a group per head) or (N, 1) (the whole row), got ",
           t.describe()));
  need_f32(op, t, name);
  need(t.device() == x.device(), str(op, ": ", name, " is on ", t.device().name(), " but x on ", x.device().name()));
  need(t.is_contiguous(), str(op, ": ", name, " must be contiguous, got strides ", shape_str(t.strides())));
  return t.dim(1);
}
// weight: (L) of x's dtype, L = D per head (G = H > 1), H·D for the whole row.
void check_head_weight(const char* op, const Tensor& w, const Tensor& x, int64_t G) {
  const int64_t L = G == 1 ? x.dim(1) * x.dim(2) : x.dim(2);
  need(w.defined(), str(op, ": weight is undefined"));
  need(w.shape() == Shape{L}, str(op, ": weight must be (", L, ") — ", G == 1 ? "(H·D) for whole-row groups"
                                                                               : "(D) shared by the heads",
                                  " — got ", w.describe()));
  need(w.dtype() == x.dtype(), str(op, ": weight must have x's dtype, got ", w.describe()));
  need(w.device() == x.device(), str(op, ": weight is on ", w.device().name(), " but x on ", x.device().name()));
  need(w.is_contiguous(), str(op, ": weight must be contiguous"));
}
void check_head_count(const char* op, int64_t count, const Tensor& x, int64_t G) {
  const int64_t L = G == 1 ? x.dim(1) * x.dim(2) : x.dim(2);
  need(count >= L && count > 0,
       str(op, ": count ", count, " must be the group's global element count, >= this call's ", L,
           " (D per head; NH·HD of the whole row over the tensor-parallel ranks)"));
}
}  // namespace

void head_norm_sumsq(const Tensor& x, const Tensor& ss, Stream s) {
  const char* op = "head_norm_sumsq";
  check_head_view(op, x, "x", nullptr, nullptr);
  check_head_stat(op, ss, "ss", x);
  MPT_BACKEND(x, head_norm_sumsq, x, ss, s);
}

void head_norm_forward(const Tensor& x, const Tensor& ss, int64_t count, float eps, const Tensor& weight,
                       const Tensor& out, const Tensor& rstd, Stream s) {
  const char* op = "head_norm_forward";
  check_head_view(op, x, "x", nullptr, nullptr);
  check_head_view(op, out, "out", &x, "x");
  const int64_t G = check_head_stat(op, ss, "ss", x);
  need(check_head_stat(op, rstd, "rstd", x) == G, str(op, ": rstd ", rstd.describe(), " must have ss's shape ",
                                                      shape_str(ss.shape())));
  check_head_weight(op, weight, x, G);
  check_head_count(op, count, x, G);
  need(std::isfinite(eps) && eps >= 0.0f, str(op, ": eps must be finite and >= 0, got ", eps));
  check_same_device(op, {&x, &out});
  MPT_BACKEND(x, head_norm_forward, x, ss, count, eps, weight, out, rstd, s);
}

void head_norm_backward_dot(const Tensor& dout, const Tensor& x, const Tensor& weight, const Tensor& rstd,
                            const Tensor& dot, Stream s) {
  const char* op = "head_norm_backward_dot";
  check_head_view(op, x, "x", nullptr, nullptr);
  check_head_view(op, dout, "dout", &x, "x");
  const int64_t G = check_head_stat(op, rstd, "rstd", x);
  need(check_head_stat(op, dot, "dot", x) == G, str(op, ": dot ", dot.describe(), " must have rstd's shape ",
                                                    shape_str(rstd.shape())));
  check_head_weight(op, weight, x, G);
  check_same_device(op, {&x, &dout});
  MPT_BACKEND(x, head_norm_backward_dot, dout, x, weight, rstd, dot, s);
}

void head_norm_backward(const Tensor& dout, const Tensor& x, const Tensor& weight, const Tensor& rstd,
                        const Tensor& dot, int64_t count, const Tensor& dx, const Tensor& dweight, Stream s) {
  const char* op = "head_norm_backward";
  check_head_view(op, x, "x", nullptr, nullptr);
  check_head_view(op, dout, "dout", &x, "x");
  if (dx.defined()) check_head_view(op, dx, "dx", &x, "x");
  const int64_t G = check_head_stat(op, rstd, "rstd", x);
  need(check_head_stat(op, dot, "dot", x) == G, str(op, ": dot ", dot.describe(), " must have rstd's shape ",
                                                    shape_str(rstd.shape())));
  check_head_weight(op, weight, x, G);
  check_head_count(op, count, x, G);
  if (dweight.defined()) need_shape(op, dweight, "dweight", weight.shape());
  need_grad_dtype(op, dweight, "dweight", x.dtype());
  check_same_device(op, {&x, &dout, &dx, &dweight});
  check_contiguous(op, {{&dweight, "dweight"}});
  MPT_BACKEND(x, head_norm_backward, dout, x, weight, rstd, dot, count, dx, dweight, s);
}

// ---- pointwise families ------------------------------------------------------------
namespace {
void need_like(const char* op, const Tensor& ref, const char* rn, const Tensor& t, const char* tn) {
  need(t.defined(), str(op, ": ", tn, " is undefined"));
  check_same_shape(op, ref, rn, t, tn);
  need(t.dtype() == ref.dtype(), str(op, ": ", tn, " must have ", rn, "'s dtype, got ", t.describe()));
}
}  // namespace

void gelu_forward(const Tensor& x, const Tensor& out, Stream s) {
  need_float("gelu_forward", x, "x");
  need_like("gelu_forward", x, "x", out, "out");
  check_same_device("gelu_forward", {&x, &out});
  check_contiguous("gelu_forward", {{&x, "x"}, {&out, "out"}});
  MPT_BACKEND(x, gelu_forward, x, out, s);
}

void gelu_backward(const Tensor& dout, const Tensor& x, const Tensor& dx, Stream s) {
  need_float("gelu_backward", x, "x");
  need_like("gelu_backward", x, "x", dout, "dout");
  need_like("gelu_backward", x, "x", dx, "dx");
  check_same_device("gelu_backward", {&dout, &x, &dx});
  check_contiguous("gelu_backward", {{&x, "x"}, {&dout, "dout"}, {&dx, "dx"}});
  MPT_BACKEND(x, gelu_backward, dout, x, dx, s);
}

void gelu_erf_forward(const Tensor& x, const Tensor& out, Stream s) {
  need_float("gelu_erf_forward", x, "x");
  need_like("gelu_erf_forward", x, "x", out, "out");
  check_same_device("gelu_erf_forward", {&x, &out});
  check_contiguous("gelu_erf_forward", {{&x, "x"}, {&out, "out"}});
  MPT_BACKEND(x, gelu_erf_forward, x, out, s);
}

void gelu_erf_backward(const Tensor& dout, const Tensor& x, const Tensor& dx, Stream s) {
  need_float("gelu_erf_backward", x, "x");
  need_like("gelu_erf_backward", x, "x", dout, "dout");
  need_like("gelu_erf_backward", x, "x", dx, "dx");
  check_same_device("gelu_erf_backward", {&dout, &x, &dx});
  check_contiguous("gelu_erf_backward", {{&x, "x"}, {&dout, "dout"}, {&dx, "dx"}});
  MPT_BACKEND(x, gelu_erf_backward, dout, x, dx, s);
}

void relu_forward(const Tensor& x, const Tensor& out, Stream s) {
  need_float("relu_forward", x, "x");
  need_like("relu_forward", x, "x", out, "out");
  check_same_device("relu_forward", {&x, &out});
  check_contiguous("relu_forward", {{&x, "x"}, {&out, "out"}});
  MPT_BACKEND(x, relu_forward, x, out, s);
}

void relu_backward(const Tensor& dout, const Tensor& x, const Tensor& dx, Stream s) {
  need_float("relu_backward", x, "x");
  need_like("relu_backward", x, "x", dout, "dout");
  need_like("relu_backward", x, "x", dx, "dx");
  check_same_device("relu_backward", {&dout, &x, &dx});
  check_contiguous("relu_backward", {{&x, "x"}, {&dout, "dout"}, {&dx, "dx"}});
  MPT_BACKEND(x, relu_backward, dout, x, dx, s);
}

void softcap_forward(const Tensor& x, const Tensor& out, float cap, Stream s) {
  const char* op = "softcap_forward";
  need_float(op, x, "x");
  need_like(op, x, "x", out, "out");
  need(std::isfinite(cap) && cap > 0.0f, str(op, ": cap must be finite and > 0 (final_logit_softcapping), got ", cap));
  check_same_device(op, {&x, &out});
  check_contiguous(op, {{&x, "x"}, {&out, "out"}});
  MPT_BACKEND(x, softcap_forward, x, out, cap, s);
}

void softcap_backward(const Tensor& dout, const Tensor& out, const Tensor& dx, float cap, Stream s) {
  const char* op = "softcap_backward";
  need_float(op, out, "out");
  need_like(op, out, "out", dout, "dout");
  need_like(op, out, "out", dx, "dx");
  need(std::isfinite(cap) && cap > 0.0f, str(op, ": cap must be finite and > 0 (final_logit_softcapping), got ", cap));
  check_same_device(op, {&dout, &out, &dx});
  check_contiguous(op, {{&out, "out"}, {&dout, "dout"}, {&dx, "dx"}});
  MPT_BACKEND(out, softcap_backward, dout, out, dx, cap, s);
}

namespace {
// A one-element f32 tensor on x's device (fp8's amax and scale).
void need_f32_scalar(const char* op, const Tensor& t, const char* name, const Tensor& x) {
  need(t.defined() && t.dtype() == DType::F32 && t.numel() == 1,
       str(op, ": ", name, " must be an f32 tensor of one element", t.defined() ? str(", got ", dtype_name(t.dtype()), " of ", t.numel()) : std::string()));
  need(t.device() == x.device(), str(op, ": ", name, " is on another device than x"));
}
}  // namespace

void fp8_amax(const Tensor& x, const Tensor& amax, Stream s) {
  const char* op = "fp8_amax";
  need_float(op, x, "x");
  need_f32_scalar(op, amax, "amax", x);
  check_contiguous(op, {{&x, "x"}});
  MPT_BACKEND(x, fp8_amax, x, amax, s);
}

void fp8_quantize_dequantize(const Tensor& x, const Tensor& scale, Fp8Format f, const Tensor& out, Stream s) {
  const char* op = "fp8_quantize_dequantize";
  need_float(op, x, "x");
  need_like(op, x, "x", out, "out");
  need_f32_scalar(op, scale, "scale", x);
  check_same_device(op, {&x, &out});
  check_contiguous(op, {{&x, "x"}, {&out, "out"}});
  MPT_BACKEND(x, fp8_quantize_dequantize, x, scale, f, out, s);
}

namespace {
// x (..., 2F) and a (..., F) tensor `o` with the same leading dims.
void check_swiglu_pair(const char* op, const Tensor& x, const Tensor& o, const char* on) {
  need(o.defined(), str(op, ": ", on, " is undefined"));
  need(x.ndim() >= 1 && x.dim(-1) % 2 == 0,
       str(op, ": x must be (..., 2F) (fc1's [a | b] halves), got ", x.describe(), "; its last dim is not even"));
  Shape want = x.shape();
  want.back() /= 2;
  need_shape(op, o, on, want);
  need(o.dtype() == x.dtype(), str(op, ": ", on, " must have x's dtype, got ", o.describe()));
}

void check_glu_forward(const char* op, const Tensor& x, const Tensor& out) {
  need_float(op, x, "x");
  check_swiglu_pair(op, x, out, "out");
  check_same_device(op, {&x, &out});
  check_contiguous(op, {{&x, "x"}, {&out, "out"}});
}

void check_glu_backward(const char* op, const Tensor& dout, const Tensor& x, const Tensor& dx) {
  need_float(op, x, "x");
  check_swiglu_pair(op, x, dout, "dout");
  need_like(op, x, "x", dx, "dx");
  check_same_device(op, {&dout, &x, &dx});
  check_contiguous(op, {{&dout, "dout"}, {&x, "x"}, {&dx, "dx"}});
}
}  // namespace

void swiglu_forward(const Tensor& x, const Tensor& out, Stream s) {
  check_glu_forward("swiglu_forward", x, out);
  MPT_BACKEND(x, swiglu_forward, x, out, s);
}

void swiglu_backward(const Tensor& dout, const Tensor& x, const Tensor& dx, Stream s) {
  check_glu_backward("swiglu_backward", dout, x, dx);
  MPT_BACKEND(x, swiglu_backward, dout, x, dx, s);
}

void geglu_forward(const Tensor& x, const Tensor& out, Stream s) {
  check_glu_forward("geglu_forward", x, out);
  MPT_BACKEND(x, geglu_forward, x, out, s);
}

void geglu_backward(const Tensor& dout, const Tensor& x, const Tensor& dx, Stream s) {
  check_glu_backward("geglu_backward", dout, x, dx);
  MPT_BACKEND(x, geglu_backward, dout, x, dx, s);
}

void softmax_forward(const Tensor& x, const Tensor& out, Stream s) {
  need_float("softmax_forward", x, "x");
  need_like("softmax_forward", x, "x", out, "out");
  check_same_device("softmax_forward", {&x, &out});
  check_contiguous("softmax_forward", {{&x, "x"}, {&out, "out"}});
  MPT_BACKEND(x, softmax_forward, x, out, s);
}

void softmax_backward(const Tensor& dout, const Tensor& out, const Tensor& dx, Stream s) {
  need_float("softmax_backward", out, "out");
  need_like("softmax_backward", out, "out", dout, "dout");
  need_like("softmax_backward", out, "out", dx, "dx");
  check_same_device("softmax_backward", {&dout, &out, &dx});
  check_contiguous("softmax_backward", {{&out, "out"}, {&dout, "dout"}, {&dx, "dx"}});
  MPT_BACKEND(out, softmax_backward, dout, out, dx, s);
}

// ---- attention ----------------------------------------------------------------------
namespace {
void check_attention(const char* op, const Tensor& qkv, const Tensor& out, const Tensor& lse) {
  need_float(op, qkv, "qkv");
  need(out.defined() && out.ndim() == 4, str(op, ": out must be (B, T, NH, HD), got ", out.describe()));
  const int64_t b = out.dim(0), t = out.dim(1), nh = out.dim(2), hd = out.dim(3);
  if (qkv.ndim() == 5) {  // MHA: (B, T, 3, NH, HD)
    need(qkv.dim(2) == 3, str(op, ": a 5-D qkv must be (B, T, 3, NH, HD), got ", qkv.describe()));
    need_shape(op, qkv, "qkv", {b, t, 3, nh, hd});
  } else {  // GQA: (B, T, NH + 2G, HD)
    need(qkv.ndim() == 4, str(op, ": qkv must be (B, T, 3, NH, HD) or (B, T, NH + 2·G, HD), got ", qkv.describe()));
    need(qkv.dim(0) == b && qkv.dim(1) == t && qkv.dim(3) == hd,
         str(op, ": qkv ", qkv.describe(), " does not match out ", out.describe(), " (B, T, ·, HD)"));
    const int64_t kv2 = qkv.dim(2) - nh, g = kv2 / 2;
    need(nh > 0 && kv2 > 0 && kv2 % 2 == 0 && nh % g == 0,
         str(op, ": qkv ", qkv.describe(), " must hold NH = ", nh, " query heads (out's) then G key and G value heads ",
             "with NH divisible by G (--num-query-groups); its ", qkv.dim(2), " heads do not split that way"));
  }
  need(out.dtype() == qkv.dtype(), str(op, ": out must have qkv's dtype"));
  need_shape(op, lse, "lse", {b, nh, t});
  need_f32(op, lse, "lse");
}
void check_attention_dropout(const char* op, const AttentionDropout& d) {
  need(d.p >= 0.0f && d.p < 1.0f, str(op, ": dropout probability must be in [0, 1), got ", d.p));
  need(d.first_head >= 0 && d.first_head < (int64_t{1} << 24), str(op, ": first_head ", d.first_head, " out of range"));
}
// kv_lengths: (B) i32 on qkv's device; its values 1..T are checked when they are on the host.
// Logit soft-capping c·tanh(S/c): c finite and > 0, or 0 (off).
void check_softcap(const char* op, float c, const char* what) {
  need(std::isfinite(c) && c >= 0.0f,
       str(op, ": ", what, " softcap must be finite and >= 0 (0: off; Gemma 2's attn_logit_softcapping), got ", c));
}
void check_attention_mask(const char* op, const AttentionMask& m, const Tensor& qkv, const Tensor& out) {
  need(m.window >= 0, str(op, ": mask window must be >= 0 (0: no sliding window), got ", m.window));
  check_softcap(op, m.softcap, "mask");
  need(m.window == 0 || m.causal, str(op, ": a sliding window (mask window ", m.window, ") needs causal attention"));
  const Tensor& l = m.kv_lengths;
  if (!l.defined()) return;
  const int64_t b = out.dim(0), t = out.dim(1);
  need(l.dtype() == DType::I32, str(op, ": mask kv_lengths must be i32, got ", l.describe()));
  need_shape(op, l, "mask kv_lengths", {b});
  need(l.device() == qkv.device(),
       str(op, ": mask kv_lengths is on ", l.device().name(), " but qkv on ", qkv.device().name(), "; move it there"));
  need(l.is_contiguous(), str(op, ": mask kv_lengths must be contiguous"));
  if (!l.device().is_cpu()) return;
  const int32_t* v = l.data<int32_t>();
  for (int64_t i = 0; i < b; ++i)
    need(v[i] >= 1 && v[i] <= t, str(op, ": mask kv_lengths[", i, "] = ", v[i], " is outside [1, T = ", t,
                                     "]: every sample needs at least one real token and at most T"));
}
}  // namespace

void attention_forward(const Tensor& qkv, const Tensor& out, const Tensor& lse, float scale,
                       const AttentionDropout& drop, const AttentionMask& mask, Stream s) {
  const char* op = "attention_forward";
  check_attention(op, qkv, out, lse);
  check_attention_dropout(op, drop);
  check_attention_mask(op, mask, qkv, out);
  check_same_device(op, {&qkv, &out, &lse});
  check_contiguous(op, {{&qkv, "qkv"}, {&out, "out"}, {&lse, "lse"}});
  MPT_BACKEND(qkv, attention_forward, qkv, out, lse, scale, drop, mask, s);
}

void attention_backward(const Tensor& dout, const Tensor& qkv, const Tensor& out, const Tensor& lse,
                        const Tensor& dqkv, float scale, const AttentionDropout& drop, const AttentionMask& mask,
                        Stream s) {
  const char* op = "attention_backward";
  check_attention(op, qkv, out, lse);
  check_attention_dropout(op, drop);
  check_attention_mask(op, mask, qkv, out);
  need_like(op, out, "out", dout, "dout");
  need_like(op, qkv, "qkv", dqkv, "dqkv");
  check_same_device(op, {&dout, &qkv, &out, &lse, &dqkv});
  check_contiguous(op, {{&dout, "dout"}, {&qkv, "qkv"}, {&out, "out"}, {&lse, "lse"}, {&dqkv, "dqkv"}});
  MPT_BACKEND(qkv, attention_backward, dout, qkv, out, lse, dqkv, scale, drop, mask, s);
}

// ---- attention blocks (attention_block.h) -----------------------------------------------
namespace {
// A (B, T, H, HD) operand view: float, 4-D, the given sizes (-1: any), the heads of a row packed.
void check_rows(const char* op, const Tensor& t, const char* name, int64_t b, int64_t tl, int64_t h, int64_t hd) {
  need_float(op, t, name);
  need(t.ndim() == 4, str(op, ": ", name, " must be (B, T, heads, HD), got ", t.describe()));
  const Shape want{b, tl < 0 ? t.dim(1) : tl, h < 0 ? t.dim(2) : h, hd};
  need(t.shape() == want, str(op, ": ", name, " is ", t.describe(), ", expected ", shape_str(want)));
  const Shape& st = t.strides();
  need((t.dim(3) <= 1 || st[3] == 1) && (t.dim(2) <= 1 || st[2] == t.dim(3)) && st[0] >= 0 && st[1] >= 0,
       str(op, ": ", name, " ", t.describe(), " must have each row's heads packed (strides (·, ·, HD, 1)), has strides ",
           shape_str(st)));
}
// lse (B, NH, T) f32 with unit stride along T.
void check_stats(const char* op, const Tensor& t, const char* name, int64_t b, int64_t nh, int64_t tl) {
  need_shape(op, t, name, {b, nh, tl});
  need_f32(op, t, name);
  need(tl <= 1 || t.strides()[2] == 1, str(op, ": ", name, " must have unit stride along T, has strides ",
                                            shape_str(t.strides())));
}
// q (B, Tq, NH, Dqk), k (B, Tk, G, Dqk), v (B, Tk, G, Dv), out (B, Tq, NH, Dv): v's head width
// Dv may differ from q's and k's (MLA); out takes v's.
void check_block(const char* op, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                 const Tensor& lse, const AttentionBlock& blk) {
  check_rows(op, q, "q", q.ndim() == 4 ? q.dim(0) : -1, -1, -1, q.ndim() == 4 ? q.dim(3) : -1);
  const int64_t B = q.dim(0), Tq = q.dim(1), NH = q.dim(2), Dqk = q.dim(3);
  need(Dqk >= 1, str(op, ": q's head width is 0 (", q.describe(), ")"));
  check_rows(op, k, "k", B, -1, -1, Dqk);
  const int64_t Tk = k.dim(1), G = k.dim(2);
  need(v.defined() && v.ndim() == 4,
       str(op, ": v must be (B, Tk, G, Dv), got ", v.defined() ? v.describe() : std::string("undefined")));
  const int64_t Dv = v.dim(3);
  need(Dv >= 1, str(op, ": v's head width Dv is 0 (", v.describe(), ")"));
  check_rows(op, v, "v", B, Tk, G, Dv);
  need(out.defined() && out.ndim() == 4 && out.dim(3) == Dv,
       str(op, ": out must be (B, Tq, NH, Dv) with v's head width Dv = ", Dv, " (q and k have Dqk = ", Dqk,
           "), got ", out.defined() ? out.describe() : std::string("undefined")));
  check_rows(op, out, "out", B, Tq, NH, Dv);
  need(NH > 0 && G > 0 && NH % G == 0,
       str(op, ": ", NH, " query heads must be a multiple of the ", G, " key/value heads (--num-query-groups)"));
  need(Tk >= 1, str(op, ": the key block is empty"));
  need(q.dtype() == k.dtype() && q.dtype() == v.dtype() && q.dtype() == out.dtype(),
       str(op, ": q, k, v and out must share a dtype"));
  check_stats(op, lse, "lse", B, NH, Tq);
  need(blk.q_start >= 0 && blk.k_start >= 0 && blk.seq >= 0,
       str(op, ": block positions must be >= 0 (q_start ", blk.q_start, ", k_start ", blk.k_start, ", seq ", blk.seq, ")"));
  const int64_t seq = blk.seq > 0 ? blk.seq : Tq;
  need(blk.q_start + Tq <= seq && blk.k_start + Tk <= seq,
       str(op, ": the block (queries ", blk.q_start, "..", blk.q_start + Tq, ", keys ", blk.k_start, "..",
           blk.k_start + Tk, ") runs past the sequence of ", seq, " tokens"));
}
// The block's optional padding mask and score bias (and, backward, the bias gradient).
void check_block_extras(const char* op, const Tensor& q, const Tensor& k, const AttentionBlock& blk, bool backward) {
  const int64_t B = q.dim(0), Tq = q.dim(1), NH = q.dim(2), Tk = k.dim(1);
  check_softcap(op, blk.softcap, "block");
  const Tensor& l = blk.kv_lengths;
  if (l.defined()) {
    need(l.dtype() == DType::I32, str(op, ": block kv_lengths must be i32, got ", l.describe()));
    need_shape(op, l, "block kv_lengths", {B});
    need(l.device() == q.device(),
         str(op, ": block kv_lengths is on ", l.device().name(), " but q on ", q.device().name(), "; move it there"));
    need(l.is_contiguous(), str(op, ": block kv_lengths must be contiguous"));
    if (l.device().is_cpu()) {
      const int32_t* v = l.data<int32_t>();
      for (int64_t b = 0; b < B; ++b)
        need(v[b] >= 0 && v[b] <= Tk, str(op, ": block kv_lengths[", b, "] = ", v[b], " is outside [0, Tk = ", Tk,
                                          "] (the keys of sample ", b, " that are not padding)"));
    }
  }
  const std::pair<const Tensor*, const char*> bias[] = {{&blk.bias, "block bias"},
                                                        {&blk.bias_grad, "block bias_grad"}};
  for (const auto& [t, name] : bias) {
    if (!t->defined() || (t == &blk.bias_grad && !backward)) continue;
    need_shape(op, *t, name, {Tq, Tk, NH});
    need_f32(op, *t, name);
    need(t->device() == q.device(),
         str(op, ": ", name, " is on ", t->device().name(), " but q on ", q.device().name(), "; move it there"));
    need(t->is_contiguous(), str(op, ": ", name, " must be contiguous (Tq, Tk, NH), has strides ",
                                 shape_str(t->strides())));
  }
}
}  // namespace

void attention_block_forward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                             const Tensor& lse, float scale, const AttentionBlock& blk, const AttentionDropout& drop,
                             Stream s) {
  const char* op = "attention_block_forward";
  check_block(op, q, k, v, out, lse, blk);
  check_block_extras(op, q, k, blk, false);
  check_attention_dropout(op, drop);
  check_same_device(op, {&q, &k, &v, &out, &lse});
  MPT_BACKEND(q, attention_block_forward, q, k, v, out, lse, scale, blk, drop, s);
}

void attention_block_backward(const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v,
                              const Tensor& out, const Tensor& lse, const Tensor& dq, const Tensor& dk,
                              const Tensor& dv, float scale, const AttentionBlock& blk, const AttentionDropout& drop,
                              Stream s) {
  const char* op = "attention_block_backward";
  check_block(op, q, k, v, out, lse, blk);
  check_block_extras(op, q, k, blk, true);
  check_attention_dropout(op, drop);
  const int64_t B = q.dim(0), Dqk = q.dim(3), Dv = v.dim(3);  // dq, dk: Dqk wide; dout, dv: Dv wide
  check_rows(op, dout, "dout", B, q.dim(1), q.dim(2), Dv);
  check_rows(op, dq, "dq", B, q.dim(1), q.dim(2), Dqk);
  check_rows(op, dk, "dk", B, k.dim(1), k.dim(2), Dqk);
  check_rows(op, dv, "dv", B, k.dim(1), k.dim(2), Dv);
  for (const Tensor* t : {&dout, &dq, &dk, &dv})
    need(t->dtype() == q.dtype(), str(op, ": dout, dq, dk and dv must have q's dtype, got ", t->describe()));
  check_same_device(op, {&dout, &q, &k, &v, &out, &lse, &dq, &dk, &dv});
  MPT_BACKEND(q, attention_block_backward, dout, q, k, v, out, lse, dq, dk, dv, scale, blk, drop, s);
}

void attention_merge(const Tensor& acc, const Tensor& acc_lse, const Tensor& part, const Tensor& part_lse, Stream s) {
  const char* op = "attention_merge";
  need_f32(op, acc, "acc");
  need(acc.ndim() == 4, str(op, ": acc must be (B, T, NH, HD), got ", acc.describe()));
  const int64_t B = acc.dim(0), T = acc.dim(1), NH = acc.dim(2), HD = acc.dim(3);
  check_rows(op, part, "part", B, T, NH, HD);
  need_shape(op, acc_lse, "acc_lse", {B, NH, T});
  need_f32(op, acc_lse, "acc_lse");
  check_stats(op, part_lse, "part_lse", B, NH, T);
  check_contiguous(op, {{&acc, "acc"}, {&acc_lse, "acc_lse"}});
  check_same_device(op, {&acc, &acc_lse, &part, &part_lse});
  MPT_BACKEND(acc, attention_merge, acc, acc_lse, part, part_lse, s);
}

std::string cuda_attention_backend() {
#ifdef MPITRON_WITH_CUDA
  return cuda::attention_backend_name();
#else
  return "none (built without CUDA)";
#endif
}

void cuda_attention_force_fallback(bool on) {
#ifdef MPITRON_WITH_CUDA
  cuda::attention_force_fallback(on);
#else
  (void)on;
#endif
}

// ---- rope ---------------------------------------------------------------------------------
namespace {
int64_t rotary_dim_checked(const char* op, int64_t head_dim, double percent) {
  need(percent > 0.0 && percent <= 1.0, str(op, ": --rotary-percent must be in (0, 1], got ", percent));
  const int64_t r = static_cast<int64_t>(static_cast<double>(head_dim) * percent);
  need(r > 0 && r % 2 == 0, str(op, ": head dim ", head_dim, " × --rotary-percent ", percent, " gives ", r,
                                " rotary dims; it must be even and > 0 (pick a --rotary-percent that gives an even count)"));
  return r;
}
}  // namespace

int64_t rope_rotary_dim(int64_t head_dim, double percent) {
  return rotary_dim_checked("rope_rotary_dim", head_dim, percent);
}

namespace {
// The rope_scaling fields its type reads (rope.h), as transformers' rope_config_validation
// asks of them, plus what keeps the formulas finite.
void check_rope_scaling(const char* op, const RopeArgs& args) {
  const RopeScaling& s = args.scaling;
  const auto t = static_cast<int32_t>(s.type);
  need(t >= static_cast<int32_t>(RopeScalingType::None) && t <= static_cast<int32_t>(RopeScalingType::Yarn),
       str(op, ": rope scaling type ", t, " is not none, linear, dynamic, llama3 or yarn"));
  if (s.type == RopeScalingType::None) return;
  const char* name[] = {"none", "linear", "dynamic", "llama3", "yarn"};
  const std::string what = str(op, ": rope scaling ", name[t], ": ");
  need(std::isfinite(s.factor) && s.factor >= 1.0, str(what, "factor must be >= 1, got ", s.factor));
  if (s.type == RopeScalingType::Linear) return;
  need(s.original_max_position_embeddings > 0,
       str(what, "original_max_position_embeddings must be > 0, got ", s.original_max_position_embeddings,
           s.type == RopeScalingType::Dynamic ? " (the config's max_position_embeddings)" : ""));
  if (s.type == RopeScalingType::Dynamic) {
    need(s.dynamic_seq_len >= 0, str(what, "dynamic_seq_len must be >= 0, got ", s.dynamic_seq_len));
  } else if (s.type == RopeScalingType::Llama3) {
    need(std::isfinite(s.low_freq_factor) && s.low_freq_factor > 0.0 && std::isfinite(s.high_freq_factor) &&
             s.high_freq_factor > s.low_freq_factor,
         str(what, "needs 0 < low_freq_factor < high_freq_factor, got ", s.low_freq_factor, " and ",
             s.high_freq_factor));
  } else {  // yarn
    need(args.base != 1.0, str(what, "--rotary-base 1 leaves the correction range undefined (ln base = 0)"));
    need(std::isfinite(s.beta_fast) && s.beta_fast > 0.0 && std::isfinite(s.beta_slow) && s.beta_slow > 0.0,
         str(what, "beta_fast and beta_slow must be > 0, got ", s.beta_fast, " and ", s.beta_slow));
    need(std::isfinite(s.attention_factor) && s.attention_factor >= 0.0,
         str(what, "attention_factor must be >= 0 (0: derived from factor, mscale, mscale_all_dim), got ",
             s.attention_factor));
    need(std::isfinite(s.mscale) && std::isfinite(s.mscale_all_dim),
         str(what, "mscale and mscale_all_dim must be finite, got ", s.mscale, " and ", s.mscale_all_dim));
    const double a = rope_cos_sin_scale(args);
    need(std::isfinite(a) && a > 0.0, str(what, "the attention factor ", a, " (derived from factor ", s.factor,
                                          ", mscale ", s.mscale, ", mscale_all_dim ", s.mscale_all_dim,
                                          ") must be finite and > 0"));
  }
}

void check_rope(const char* op, const Tensor& x, const char* xn, const Tensor& o, const char* on,
                int64_t rotate_heads, const RopeArgs& args) {
  need_float(op, x, xn);
  need(x.ndim() == 4, str(op, ": ", xn, " must be (B, T, H, D), got ", x.describe()));
  need_like(op, x, xn, o, on);
  need(rotate_heads >= 0 && rotate_heads <= x.dim(2),
       str(op, ": rotate_heads ", rotate_heads, " outside [0, ", x.dim(2), "] (the heads of ", x.describe(), ")"));
  need(args.base > 0.0, str(op, ": --rotary-base must be > 0, got ", args.base));
  need(args.position_offset >= 0, str(op, ": position_offset must be >= 0, got ", args.position_offset));
  rotary_dim_checked(op, x.dim(3), args.percent);
  check_rope_scaling(op, args);
  check_same_device(op, {&x, &o});
  check_contiguous(op, {{&x, xn}, {&o, on}});
}
}  // namespace

void rope_forward(const Tensor& x, const Tensor& out, int64_t rotate_heads, const RopeArgs& args, Stream s) {
  check_rope("rope_forward", x, "x", out, "out", rotate_heads, args);
  MPT_BACKEND(x, rope_forward, x, out, rotate_heads, args, s);
}

void rope_backward(const Tensor& dout, const Tensor& dx, int64_t rotate_heads, const RopeArgs& args, Stream s) {
  check_rope("rope_backward", dout, "dout", dx, "dx", rotate_heads, args);
  MPT_BACKEND(dout, rope_backward, dout, dx, rotate_heads, args, s);
}

// ---- embedding ------------------------------------------------------------------------
void embedding_forward(const Tensor& ids, const Tensor& table, const Tensor& out, bool accumulate,
                       int64_t vocab_start, Stream s) {
  const char* op = "embedding_forward";
  need_index(op, ids, "ids");
  need_float(op, table, "table");
  need(table.ndim() == 2, str(op, ": table must be (V, C), got ", table.describe()));
  need(ids.ndim() == 1, str(op, ": ids must be 1-D (flatten the batch), got ", ids.describe()));
  need_shape(op, out, "out", {ids.dim(0), table.dim(1)});
  need(out.dtype() == table.dtype(), str(op, ": out must have table's dtype"));
  check_same_device(op, {&ids, &table, &out});
  check_contiguous(op, {{&ids, "ids"}, {&table, "table"}, {&out, "out"}});
  MPT_BACKEND(table, embedding_forward, ids, table, out, accumulate, vocab_start, s);
}

void embedding_backward(const Tensor& dout, const Tensor& ids, const Tensor& dtable, int64_t vocab_start, Stream s) {
  const char* op = "embedding_backward";
  need_index(op, ids, "ids");
  need_float(op, dout, "dout");
  need(dtable.defined() && dtable.ndim() == 2, str(op, ": dtable must be (V, C), got ", dtable.describe()));
  need(ids.ndim() == 1, str(op, ": ids must be 1-D, got ", ids.describe()));
  need_shape(op, dout, "dout", {ids.dim(0), dtable.dim(1)});
  need_grad_dtype(op, dtable, "dtable", dout.dtype());
  check_same_device(op, {&dout, &ids, &dtable});
  check_contiguous(op, {{&dout, "dout"}, {&ids, "ids"}, {&dtable, "dtable"}});
  MPT_BACKEND(dout, embedding_backward, dout, ids, dtable, vocab_start, s);
}

// ---- cross-entropy ------------------------------------------------------------------------
void softmax_cross_entropy(const Tensor& logits, const Tensor& targets, const Tensor& losses,
                           const Tensor& dlogits, float dloss_scale, Stream s) {
  const char* op = "softmax_cross_entropy";
  need_float(op, logits, "logits");
  need(logits.ndim() == 2, str(op, ": logits must be (N, V), got ", logits.describe()));
  need_index(op, targets, "targets");
  need_shape(op, targets, "targets", {logits.dim(0)});
  need_shape(op, losses, "losses", {logits.dim(0)});
  need_f32(op, losses, "losses");
  if (dlogits.defined()) need_like(op, logits, "logits", dlogits, "dlogits");
  check_same_device(op, {&logits, &targets, &losses, &dlogits});
  check_contiguous(op, {{&logits, "logits"}, {&targets, "targets"}, {&losses, "losses"}, {&dlogits, "dlogits"}});
  MPT_BACKEND(logits, softmax_cross_entropy, logits, targets, losses, dlogits, dloss_scale, s);
}

void cross_entropy_local_stats(const Tensor& logits, const Tensor& targets, int64_t vocab_start,
                               const Tensor& lse, const Tensor& target_logit, Stream s) {
  const char* op = "cross_entropy_local_stats";
  need_float(op, logits, "logits");
  need(logits.ndim() == 2, str(op, ": logits must be (N, Vl), got ", logits.describe()));
  need(vocab_start >= 0, str(op, ": vocab_start must be >= 0, got ", vocab_start));
  need_index(op, targets, "targets");
  need_shape(op, targets, "targets", {logits.dim(0)});
  need(lse.defined(), str(op, ": lse is undefined"));
  need_shape(op, lse, "lse", {logits.dim(0)});
  need_f32(op, lse, "lse");
  need(target_logit.defined(), str(op, ": target_logit is undefined"));
  need_shape(op, target_logit, "target_logit", {logits.dim(0)});
  need_f32(op, target_logit, "target_logit");
  check_same_device(op, {&logits, &targets, &lse, &target_logit});
  check_contiguous(op, {{&logits, "logits"}, {&targets, "targets"}, {&lse, "lse"}, {&target_logit, "target_logit"}});
  MPT_BACKEND(logits, cross_entropy_local_stats, logits, targets, vocab_start, lse, target_logit, s);
}

void cross_entropy_grad_from_lse(const Tensor& logits, const Tensor& targets, int64_t vocab_start,
                                 const Tensor& lse, const Tensor& dlogits, float scale, Stream s) {
  const char* op = "cross_entropy_grad_from_lse";
  need_float(op, logits, "logits");
  need(logits.ndim() == 2, str(op, ": logits must be (N, Vl), got ", logits.describe()));
  need(vocab_start >= 0, str(op, ": vocab_start must be >= 0, got ", vocab_start));
  need_index(op, targets, "targets");
  need_shape(op, targets, "targets", {logits.dim(0)});
  need(lse.defined(), str(op, ": lse is undefined"));
  need_shape(op, lse, "lse", {logits.dim(0)});
  need_f32(op, lse, "lse");
  need_like(op, logits, "logits", dlogits, "dlogits");
  check_same_device(op, {&logits, &targets, &lse, &dlogits});
  check_contiguous(op, {{&logits, "logits"}, {&targets, "targets"}, {&lse, "lse"}, {&dlogits, "dlogits"}});
  MPT_BACKEND(logits, cross_entropy_grad_from_lse, logits, targets, vocab_start, lse, dlogits, scale, s);
}

// ---- dropout ----------------------------------------------------------------------------
void dropout_forward(const Tensor& x, const Tensor& out, float p, uint64_t seed, uint64_t offset, Stream s) {
  const char* op = "dropout_forward";
  need_float(op, x, "x");
  need_like(op, x, "x", out, "out");
  need(p >= 0.0f && p < 1.0f, str(op, ": probability ", p, " outside [0, 1)"));
  check_same_device(op, {&x, &out});
  check_contiguous(op, {{&x, "x"}, {&out, "out"}});
  MPT_BACKEND(x, dropout_forward, x, out, p, seed, offset, s);
}

void dropout_backward(const Tensor& dout, const Tensor& dx, float p, uint64_t seed, uint64_t offset, Stream s) {
  const char* op = "dropout_backward";
  need_float(op, dout, "dout");
  need_like(op, dout, "dout", dx, "dx");
  need(p >= 0.0f && p < 1.0f, str(op, ": probability ", p, " outside [0, 1)"));
  check_same_device(op, {&dout, &dx});
  check_contiguous(op, {{&dout, "dout"}, {&dx, "dx"}});
  MPT_BACKEND(dout, dropout_backward, dout, dx, p, seed, offset, s);
}

// ---- elementwise --------------------------------------------------------------------------
void add_forward(const Tensor& a, const Tensor& b, const Tensor& out, Stream s) {
  need_float("add_forward", a, "a");
  need_like("add_forward", a, "a", b, "b");
  need_like("add_forward", a, "a", out, "out");
  check_same_device("add_forward", {&a, &b, &out});
  check_contiguous("add_forward", {{&a, "a"}, {&b, "b"}, {&out, "out"}});
  MPT_BACKEND(a, add_forward, a, b, out, s);
}

void add_backward(const Tensor& dout, const Tensor& da, const Tensor& db, bool accumulate, Stream s) {
  need_float("add_backward", dout, "dout");
  if (da.defined()) need_like("add_backward", dout, "dout", da, "da");
  if (db.defined()) need_like("add_backward", dout, "dout", db, "db");
  check_same_device("add_backward", {&dout, &da, &db});
  check_contiguous("add_backward", {{&dout, "dout"}, {&da, "da"}, {&db, "db"}});
  MPT_BACKEND(dout, add_backward, dout, da, db, accumulate, s);
}

void cast(const Tensor& src, const Tensor& dst, Stream s) {
  need_float("cast", src, "src");
  need_float("cast", dst, "dst");
  check_same_shape("cast", src, "src", dst, "dst");
  check_same_device("cast", {&src, &dst});
  check_contiguous("cast", {{&src, "src"}, {&dst, "dst"}});
  MPT_BACKEND(src, cast, src, dst, s);
}

void axpby(float alpha, const Tensor& x, float beta, const Tensor& y, Stream s) {
  need_float("axpby", x, "x");
  need_float("axpby", y, "y");
  check_same_shape("axpby", x, "x", y, "y");
  check_same_device("axpby", {&x, &y});
  check_contiguous("axpby", {{&x, "x"}, {&y, "y"}});
  MPT_BACKEND(x, axpby, alpha, x, beta, y, s);
}

void scale(const Tensor& x, float alpha, Stream s) {
  need_float("scale", x, "x");
  check_contiguous("scale", {{&x, "x"}});
  MPT_BACKEND(x, scale, x, alpha, s);
}

// ---- optimizer and norms -------------------------------------------------------------------
void adamw_step(const Tensor& param, const Tensor& grad, const Tensor& m, const Tensor& v,
                const Tensor& param_copy, const AdamWArgs& args, Stream s) {
  const char* op = "adamw_step";
  need(param.defined() && param.dtype() == DType::F32, str(op, ": param (master weights) must be f32, got ", param.describe()));
  need_float(op, grad, "grad");
  need(grad.numel() == param.numel(), str(op, ": grad ", grad.describe(), " does not match param ", param.describe()));
  need(m.defined() && m.dtype() == DType::F32 && m.numel() == param.numel(), str(op, ": m must be f32 like param, got ", m.describe()));
  need(v.defined() && v.dtype() == DType::F32 && v.numel() == param.numel(), str(op, ": v must be f32 like param, got ", v.describe()));
  if (param_copy.defined()) {
    need_float(op, param_copy, "param_copy");
    need(param_copy.numel() == param.numel(), str(op, ": param_copy ", param_copy.describe(), " does not match param"));
  }
  need(args.step >= 1, str(op, ": step must start at 1, got ", args.step));
  check_same_device(op, {&param, &grad, &m, &v, &param_copy});
  check_contiguous(op, {{&param, "param"}, {&grad, "grad"}, {&m, "m"}, {&v, "v"}, {&param_copy, "param_copy"}});
  MPT_BACKEND(param, adamw_step, param, grad, m, v, param_copy, args, s);
}

void sum_squares(const Tensor& x, const Tensor& out, Stream s) {
  need_float("sum_squares", x, "x");
  need(out.defined() && out.numel() == 1 && out.dtype() == DType::F32, str("sum_squares: out must be one f32, got ", out.describe()));
  check_same_device("sum_squares", {&x, &out});
  check_contiguous("sum_squares", {{&x, "x"}});
  MPT_BACKEND(x, sum_squares, x, out, s);
}

double global_l2_norm(const std::vector<Tensor>& ts, Stream s) {
  if (ts.empty()) return 0.0;
  Tensor acc = Tensor::zeros({1}, DType::F32, ts.front().device(), s);
  for (const Tensor& t : ts) sum_squares(t, acc, s);
  return std::sqrt(static_cast<double>(acc.item()));
}

// ---- moe_permute -------------------------------------------------------------------------
namespace {
// x (N, C) and rows (R, C) of one float dtype, dest (N·k) i32, all on one device; returns k.
int64_t check_moe(const char* op, const Tensor& x, const char* xn, const Tensor& rows, const char* rn,
                  const Tensor& dest) {
  need_float(op, x, xn);
  need_float(op, rows, rn);
  need(x.ndim() == 2 && rows.ndim() == 2 && rows.dim(1) == x.dim(1) && rows.dtype() == x.dtype(),
       str(op, ": ", xn, " ", x.describe(), " and ", rn, " ", rows.describe(), " must be (N, C) and (R, C) of one dtype"));
  need(dest.defined() && dest.dtype() == DType::I32 && dest.ndim() == 1,
       str(op, ": dest must be (N·k) i32 (moe_routing), got ", dest.describe()));
  const int64_t N = x.dim(0);
  need(N == 0 ? dest.numel() == 0 : dest.numel() % N == 0,
       str(op, ": dest has ", dest.numel(), " entries, not a multiple of the ", N, " tokens"));
  const int64_t k = N == 0 ? 1 : dest.numel() / N;
  need(rows.dim(0) <= N * k, str(op, ": ", rn, " has ", rows.dim(0), " rows, more than the ", N * k, " choices"));
  check_same_device(op, {&x, &rows, &dest});
  check_contiguous(op, {{&x, xn}, {&rows, rn}, {&dest, "dest"}});
  return k;
}
void check_probs(const char* op, const Tensor& probs, const char* name, int64_t N, int64_t k, const Tensor& x) {
  need(probs.defined() && probs.dtype() == DType::F32 && probs.numel() == N * k,
       str(op, ": ", name, " must be (N, k) = (", N, ", ", k, ") f32, got ", probs.describe()));
  check_same_device(op, {&x, &probs});
  check_contiguous(op, {{&probs, name}});
}
}  // namespace

MoeRouting moe_routing(const Tensor& indices, int64_t num_experts, int64_t capacity, const Tensor& probs) {
  const char* op = "moe_routing";
  need(indices.defined() && (indices.dtype() == DType::I32 || indices.dtype() == DType::I64) && indices.ndim() == 2,
       str(op, ": indices must be (N, k) i32 or i64, got ", indices.describe()));
  need(num_experts >= 1, str(op, ": num_experts must be >= 1, got ", num_experts));
  need(capacity >= 0, str(op, ": capacity must be >= 0, got ", capacity));
  need(!probs.defined() || (probs.dtype() == DType::F32 && probs.numel() == indices.numel()),
       str(op, ": probs must be (N, k) f32 like indices ", indices.describe(), ", got ", probs.describe()));
  const Tensor h = indices.to(Device::cpu()).contiguous();
  const int64_t n = h.numel();
  std::vector<int64_t> idx(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i)
    idx[static_cast<size_t>(i)] = h.dtype() == DType::I32 ? h.data<int32_t>()[i] : h.data<int64_t>()[i];
  MoeRouting r;
  r.chosen.assign(static_cast<size_t>(num_experts), 0);
  for (int64_t i = 0; i < n; ++i) {
    const int64_t e = idx[static_cast<size_t>(i)];
    need(e >= 0 && e < num_experts, str(op, ": token ", i / h.dim(1), " choice ", i % h.dim(1), " names expert ", e,
                                        ", outside [0, ", num_experts, ")"));
    ++r.chosen[static_cast<size_t>(e)];
  }
  // Which choices stay: all (dropless); the first `capacity` of each expert in flat order (position
  // policy); or each expert's `capacity` most probable, ties to the earlier (probs policy).
  std::vector<char> keep(static_cast<size_t>(n), 1);
  if (capacity > 0) {
    std::vector<std::vector<int64_t>> of(static_cast<size_t>(num_experts));
    for (int64_t i = 0; i < n; ++i) of[static_cast<size_t>(idx[static_cast<size_t>(i)])].push_back(i);
    const Tensor hp = probs.defined() ? probs.to(Device::cpu()).contiguous() : Tensor();
    for (std::vector<int64_t>& list : of) {
      if (static_cast<int64_t>(list.size()) <= capacity) continue;
      if (hp.defined())
        std::stable_sort(list.begin(), list.end(),
                         [&](int64_t a, int64_t b) { return hp.data<float>()[a] > hp.data<float>()[b]; });
      for (size_t j = static_cast<size_t>(capacity); j < list.size(); ++j) keep[static_cast<size_t>(list[j])] = 0;
    }
  }
  r.counts.assign(static_cast<size_t>(num_experts), 0);
  for (int64_t i = 0; i < n; ++i)
    if (keep[static_cast<size_t>(i)]) ++r.counts[static_cast<size_t>(idx[static_cast<size_t>(i)])];
  std::vector<int64_t> next(static_cast<size_t>(num_experts), 0);
  for (int64_t e = 1; e < num_experts; ++e)
    next[static_cast<size_t>(e)] = next[static_cast<size_t>(e - 1)] + r.counts[static_cast<size_t>(e - 1)];
  r.dest.assign(static_cast<size_t>(n), -1);
  for (int64_t i = 0; i < n; ++i)  // flat order n·k + j within an expert: a stable sort by expert
    if (keep[static_cast<size_t>(i)])
      r.dest[static_cast<size_t>(i)] = static_cast<int32_t>(next[static_cast<size_t>(idx[static_cast<size_t>(i)])]++);
  return r;
}

int64_t MoeRouting::rows() const {
  int64_t t = 0;
  for (int64_t c : counts) t += c;
  return t;
}

void moe_permute(const Tensor& x, const Tensor& dest, const Tensor& out, Stream s) {
  check_moe("moe_permute", x, "x", out, "out", dest);
  MPT_BACKEND(x, moe_permute, x, dest, out, s);
}

void moe_permute_backward(const Tensor& dout, const Tensor& dest, const Tensor& dx, Stream s) {
  check_moe("moe_permute_backward", dx, "dx", dout, "dout", dest);
  MPT_BACKEND(dx, moe_permute_backward, dout, dest, dx, s);
}

void moe_unpermute(const Tensor& in, const Tensor& dest, const Tensor& probs, const Tensor& y, Stream s) {
  const char* op = "moe_unpermute";
  const int64_t k = check_moe(op, y, "y", in, "in", dest);
  check_probs(op, probs, "probs", y.dim(0), k, y);
  MPT_BACKEND(y, moe_unpermute, in, dest, probs, y, s);
}

void moe_unpermute_backward(const Tensor& dy, const Tensor& in, const Tensor& dest, const Tensor& probs,
                            const Tensor& din, const Tensor& dprobs, Stream s) {
  const char* op = "moe_unpermute_backward";
  const int64_t k = check_moe(op, dy, "dy", in, "in", dest);
  need_like(op, in, "in", din, "din");
  check_probs(op, probs, "probs", dy.dim(0), k, dy);
  check_probs(op, dprobs, "dprobs", dy.dim(0), k, dy);
  check_same_device(op, {&dy, &din});
  check_contiguous(op, {{&din, "din"}});
  MPT_BACKEND(dy, moe_unpermute_backward, dy, in, dest, probs, din, dprobs, s);
}

// ---- moe_topk ------------------------------------------------------------------------------
namespace {
void check_topk(const char* op, const Tensor& scores, int64_t k, const Tensor& values, const Tensor& indices) {
  need(scores.defined() && scores.dtype() == DType::F32 && scores.ndim() == 2,
       str(op, ": scores must be (N, E) f32, got ", scores.describe()));
  const int64_t N = scores.dim(0), E = scores.dim(1);
  need(k >= 1 && k <= E, str(op, ": k = ", k, " must be in [1, E = ", E, "] (top-k of the experts)"));
  need(values.defined() && values.dtype() == DType::F32 && values.numel() == N * k,
       str(op, ": values must be (N, k) = (", N, ", ", k, ") f32, got ", values.describe()));
  need(indices.defined() && indices.dtype() == DType::I32 && indices.numel() == N * k,
       str(op, ": indices must be (N, k) = (", N, ", ", k, ") i32, got ", indices.describe()));
  check_same_device(op, {&scores, &values, &indices});
  check_contiguous(op, {{&scores, "scores"}, {&values, "values"}, {&indices, "indices"}});
}
}  // namespace

void moe_topk(const Tensor& scores, int64_t k, const Tensor& values, const Tensor& indices, Stream s) {
  check_topk("moe_topk", scores, k, values, indices);
  MPT_BACKEND(scores, moe_topk, scores, k, values, indices, s);
}

void moe_topk_backward(const Tensor& dvalues, const Tensor& indices, const Tensor& dscores, Stream s) {
  const char* op = "moe_topk_backward";
  need(dvalues.defined() && dvalues.ndim() == 2, str(op, ": dvalues must be (N, k), got ", dvalues.describe()));
  check_topk(op, dscores, dvalues.dim(1), dvalues, indices);
  MPT_BACKEND(dscores, moe_topk_backward, dvalues, indices, dscores, s);
}

// ---- moe_router ----------------------------------------------------------------------------
namespace {
// logits (N, E) f32 and the args; an optional t must be `shape` of `dt`. Returns (N, E).
std::pair<int64_t, int64_t> check_router(const char* op, const Tensor& logits, const MoeRouterArgs& a) {
  need(logits.defined() && logits.dtype() == DType::F32 && logits.ndim() == 2,
       str(op, ": logits must be (N, E) f32, got ", logits.describe()));
  const int64_t N = logits.dim(0), E = logits.dim(1);
  need(a.topk >= 1 && a.topk <= E, str(op, ": topk = ", a.topk, " must be in [1, E = ", E, "] (experts per token)"));
  need(std::isfinite(a.scaling) && a.scaling > 0.0f, str(op, ": scaling must be finite and > 0, got ", a.scaling));
  need(!a.pre_softmax || a.score == MoeScore::Softmax, str(op, ": pre_softmax applies to the Softmax score only"));
  if (a.expert_bias.defined())
    need(a.expert_bias.dtype() == DType::F32 && a.expert_bias.ndim() == 1 && a.expert_bias.dim(0) == E,
         str(op, ": expert_bias must be (E) = (", E, ") f32, got ", a.expert_bias.describe()));
  check_same_device(op, {&logits, &a.expert_bias});
  check_contiguous(op, {{&logits, "logits"}, {&a.expert_bias, "expert_bias"}});
  const int64_t ng = a.num_groups;
  need(ng >= 0 && a.group_topk >= 0 && a.group_score_topk >= 0,
       str(op, ": num_groups (", ng, "), group_topk (", a.group_topk, ") and group_score_topk (", a.group_score_topk,
           ") must be >= 0 (0: no group limit)"));
  if (ng == 0) {
    need(a.group_topk == 0 && a.group_score_topk == 0,
         str(op, ": group_topk = ", a.group_topk, " and group_score_topk = ", a.group_score_topk,
             " need num_groups > 0 (--moe-router-num-groups); set it, or leave them 0"));
  } else {
    need(ng <= kMoeMaxGroups && E % ng == 0,
         str(op, ": num_groups = ", ng, " (--moe-router-num-groups) must divide the E = ", E,
             " experts into equal groups and be at most ", kMoeMaxGroups));
    const int64_t per = E / ng;
    need(a.group_topk >= 1 && a.group_topk <= ng,
         str(op, ": group_topk = ", a.group_topk, " (--moe-router-group-topk) must be in [1, num_groups = ", ng,
             "] when --moe-router-num-groups is set"));
    need(a.topk <= a.group_topk * per,
         str(op, ": topk = ", a.topk, " experts cannot come from group_topk = ", a.group_topk, " groups of ", per,
             " (--moe-router-group-topk × E / --moe-router-num-groups = ", a.group_topk * per, ")"));
    need(a.group_score_topk <= per, str(op, ": group_score_topk = ", a.group_score_topk,
                                         " exceeds the ", per, " experts of a group (E / --moe-router-num-groups)"));
    need(moe_group_score_topk(a) >= 1,
         str(op, ": the group score would sum topk / group_topk = ", a.topk, " / ", a.group_topk,
             " = 0 experts (Megatron's rule); pass group_score_topk >= 1 (transformers' DeepseekV3 uses 2)"));
  }
  return {N, E};
}
void check_router_io(const char* op, const Tensor& logits, const Tensor& t, const char* name, const Shape& shape,
                     DType dt) {
  if (!t.defined()) return;
  need(t.dtype() == dt && t.shape() == shape,
       str(op, ": ", name, " must be ", shape_str(shape), " ", dtype_name(dt), ", got ", t.describe()));
  check_same_device(op, {&logits, &t});
  check_contiguous(op, {{&t, name}});
}
}  // namespace

void moe_router_forward(const Tensor& logits, const MoeRouterArgs& args, const Tensor& probs, const Tensor& indices,
                        const Tensor& aux_sums, const Tensor& lse, Stream s) {
  const char* op = "moe_router_forward";
  const auto [N, E] = check_router(op, logits, args);
  check_router_io(op, logits, probs, "probs", {N, args.topk}, DType::F32);
  check_router_io(op, logits, indices, "indices", {N, args.topk}, DType::I32);
  check_router_io(op, logits, aux_sums, "aux_sums", {E}, DType::F32);
  check_router_io(op, logits, lse, "lse", {N}, DType::F32);
  MPT_BACKEND(logits, moe_router_forward, logits, args, probs, indices, aux_sums, lse, s);
}

void moe_router_backward(const Tensor& dprobs, const Tensor& logits, const Tensor& indices, const MoeRouterArgs& args,
                         const Tensor& aux_weight, float z_weight, const Tensor& dlogits, Stream s) {
  const char* op = "moe_router_backward";
  const auto [N, E] = check_router(op, logits, args);
  need(dprobs.defined() && indices.defined() && dlogits.defined(),
       str(op, ": dprobs, indices and dlogits must be defined"));
  check_router_io(op, logits, dprobs, "dprobs", {N, args.topk}, DType::F32);
  check_router_io(op, logits, indices, "indices", {N, args.topk}, DType::I32);
  check_router_io(op, logits, aux_weight, "aux_weight", {E}, DType::F32);
  check_router_io(op, logits, dlogits, "dlogits", {N, E}, DType::F32);
  need(std::isfinite(z_weight), str(op, ": z_weight must be finite, got ", z_weight));
  MPT_BACKEND(logits, moe_router_backward, dprobs, logits, indices, args, aux_weight, z_weight, dlogits, s);
}

// ---- grouped_gemm --------------------------------------------------------------------------
namespace {
// The checks both passes share: x (R, K) float, R = Σ counts (each >= 0), one w[g] (M, K) of
// x's dtype and device per count, contiguous. Returns M (0 when there are no groups).
int64_t check_grouped(const char* op, const Tensor& x, const std::vector<Tensor>& w,
                      const std::vector<int64_t>& counts) {
  need_float(op, x, "x");
  need(x.ndim() == 2, str(op, ": x must be (rows, K), got ", x.describe()));
  need(counts.size() == w.size(),
       str(op, ": ", counts.size(), " counts for ", w.size(), " weights (one count per group)"));
  int64_t rows = 0;
  for (size_t g = 0; g < counts.size(); ++g) {
    need(counts[g] >= 0, str(op, ": counts[", g, "] = ", counts[g], " is negative"));
    rows += counts[g];
  }
  need(rows == x.dim(0), str(op, ": counts sum to ", rows, " rows but x has ", x.dim(0), " (", x.describe(), ")"));
  const int64_t K = x.dim(1), M = w.empty() || !w[0].defined() || w[0].ndim() != 2 ? -1 : w[0].dim(0);
  for (size_t g = 0; g < w.size(); ++g) {
    const std::string name = str("w[", g, "]");
    need(w[g].defined(), str(op, ": ", name, " is undefined"));
    need(w[g].ndim() == 2 && w[g].dim(0) == M && w[g].dim(1) == K,
         str(op, ": ", name, " must be (M, K) = (", M, ", ", K, ") like w[0] and x's columns, got ", w[g].describe()));
    need(w[g].dtype() == x.dtype(), str(op, ": ", name, " must have x's dtype ", dtype_name(x.dtype()), ", got ",
                                        w[g].describe()));
    need(w[g].device() == x.device(), str(op, ": ", name, " is on ", w[g].describe(), ", x on ", x.describe()));
    need(w[g].is_contiguous(), str(op, ": ", name, " must be contiguous, got ", w[g].describe()));
  }
  return std::max<int64_t>(M, 0);
}
// A per-group vector (bias, dw, dbias): empty, or one tensor per group of `shape` on x's
// device, contiguous, with a dtype `ok_dtype` accepts; undefined entries allowed when `holes`.
template <class DtypeOk>
void check_per_group(const char* op, const char* what, const std::vector<Tensor>& v, size_t groups,
                     const Shape& shape, const Tensor& x, bool holes, DtypeOk ok_dtype, const char* dtypes) {
  if (v.empty()) return;
  need(v.size() == groups, str(op, ": ", v.size(), " ", what, " tensors for ", groups, " groups (none or one each)"));
  for (size_t g = 0; g < v.size(); ++g) {
    const std::string name = str(what, "[", g, "]");
    if (!v[g].defined()) {
      need(holes, str(op, ": ", name, " is undefined"));
      continue;
    }
    need_shape(op, v[g], name.c_str(), shape);
    need(ok_dtype(v[g].dtype()), str(op, ": ", name, " must be ", dtypes, ", got ", v[g].describe()));
    need(v[g].device() == x.device(), str(op, ": ", name, " is on ", v[g].describe(), ", x on ", x.describe()));
    need(v[g].is_contiguous(), str(op, ": ", name, " must be contiguous, got ", v[g].describe()));
  }
}
}  // namespace

void grouped_gemm(const Tensor& x, const std::vector<Tensor>& w, const std::vector<int64_t>& counts, const Tensor& y,
                  const std::vector<Tensor>& bias, Stream s) {
  const char* op = "grouped_gemm";
  const int64_t M = check_grouped(op, x, w, counts);
  need(y.defined(), str(op, ": y is undefined"));
  need_shape(op, y, "y", {x.dim(0), M});
  need(y.dtype() == x.dtype(), str(op, ": y must have x's dtype ", dtype_name(x.dtype()), ", got ", y.describe()));
  const DType dt = x.dtype();
  check_per_group(op, "bias", bias, w.size(), {M}, x, false, [&](DType t) { return t == dt; }, dtype_name(dt));
  check_same_device(op, {&x, &y});
  check_contiguous(op, {{&x, "x"}, {&y, "y"}});
  MPT_BACKEND(x, grouped_gemm, x, w, counts, y, bias, s);
}

void grouped_gemm_backward(const Tensor& dy, const Tensor& x, const std::vector<Tensor>& w,
                           const std::vector<int64_t>& counts, const Tensor& dx, const std::vector<Tensor>& dw,
                           const std::vector<Tensor>& dbias, Stream s) {
  const char* op = "grouped_gemm_backward";
  const int64_t M = check_grouped(op, x, w, counts), K = x.dim(1);
  const DType dt = x.dtype();
  need(dy.defined(), str(op, ": dy is undefined"));
  need_shape(op, dy, "dy", {x.dim(0), M});
  need(dy.dtype() == dt, str(op, ": dy must have x's dtype ", dtype_name(dt), ", got ", dy.describe()));
  if (dx.defined()) {
    need_shape(op, dx, "dx", x.shape());
    need(dx.dtype() == dt, str(op, ": dx must have x's dtype ", dtype_name(dt), ", got ", dx.describe()));
  }
  const auto grad_ok = [&](DType t) { return t == dt || t == DType::F32; };
  const std::string grad_dtypes = str("f32 or ", dtype_name(dt));
  check_per_group(op, "dw", dw, w.size(), {M, K}, x, true, grad_ok, grad_dtypes.c_str());
  check_per_group(op, "dbias", dbias, w.size(), {M}, x, true, grad_ok, grad_dtypes.c_str());
  check_same_device(op, {&x, &dy, &dx});
  check_contiguous(op, {{&x, "x"}, {&dy, "dy"}, {&dx, "dx"}});
  MPT_BACKEND(x, grouped_gemm_backward, dy, x, w, counts, dx, dw, dbias, s);
}

}  // namespace mpitron
