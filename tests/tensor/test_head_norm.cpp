// tests/tensor/test_head_norm.cpp — RMS normalisation of head views in two phases (head_norm.h):
// QK-norm per head (Qwen3, Gemma 3: weight (D) shared by the heads) and over a token's whole
// q or k row (OLMo-2: weight (H·D)), on strided views of a packed qkv row (N, heads, D) sliced
// on the head dim — no copies.
//
// Reference: float64, per group (a head's D values, or the row's H·D values):
//   ss = Σ x², rstd = 1/√(ss/count + eps), out = x·rstd·w;
//   backward dot = Σ (dout·w)·x̂, dx = rstd·(dout·w − x̂·dot/count), dweight += Σ dout·x̂,
// itself checked against float64 central differences of the forward. The op's outputs are
// views into a POISONED packed buffer: every element of the view must be written and every
// other head of the row left alone (and the guards after the buffer intact).
// Also: a row split in two halves (tensor parallelism at 2 ranks: each half's sumsq and dot,
// added, then each half's forward and backward with count = the whole row) equals the unsplit
// op; in-place forward (out = x) on the packed tensor; dx = dout; dweight accumulation in f32
// and in x's dtype; every dtype; vectorised and scalar paths asserted on CUDA.
#include "tests/tensor/op_harness.h"

using namespace mpitron;
using namespace mpitron::test;

namespace {

// x = packed (N, total, D)[:, h0 : h0 + H]; groups per head or over the H·D row.
struct Case {
  const char* what;
  int64_t N, total, h0, H, D;
  bool per_head;
  int64_t G() const { return per_head ? H : 1; }
  int64_t L() const { return per_head ? D : H * D; }
  size_t at(int64_t n, int64_t h, int64_t d) const { return static_cast<size_t>((n * total + h0 + h) * D + d); }
};

const std::vector<Case>& cases() {
  static const std::vector<Case> c{
      {"Qwen3 q heads (GQA 4+2+2), per head", 7, 8, 0, 4, 16, true},
      {"Qwen3 k heads, per head", 7, 8, 4, 2, 16, true},
      {"OLMo-2 q row (MHA 4+4+4), whole row", 5, 12, 0, 4, 8, false},
      {"OLMo-2 k row, whole row", 5, 12, 4, 4, 8, false},
      {"D = 6 (scalar path), per head", 3, 5, 1, 3, 6, true},
      {"D = 64, per head", 4, 6, 0, 4, 64, true},
      {"D = 64 k heads, whole row", 4, 6, 4, 2, 64, false},
      {"H = 1, whole row = per head", 6, 3, 2, 1, 10, false},
      {"one token, 32 heads of 128 (OLMo-2 7B's q row), whole row", 1, 33, 0, 32, 128, false},
  };
  return c;
}

struct Ref {
  std::vector<double> ss, rstd, out, dot, dx, dw;
  std::vector<double> dot_err;  // per group: 2⁻²⁴·√L·Σ|terms|, the spread of f32 sums of dot's L terms in any order
};

// xs: the packed (N, total, D) values; out/dx laid out packed too (other heads: untouched = NaN here).
Ref reference(const Case& c, const std::vector<double>& xs, const std::vector<double>& w, const std::vector<double>& dout,
              int64_t count, double eps) {
  const int64_t G = c.G(), L = c.L();
  Ref r;
  r.ss.assign(static_cast<size_t>(c.N * G), 0.0);
  r.rstd = r.dot = r.dot_err = r.ss;
  r.out.assign(xs.size(), NAN);
  r.dx = r.out;
  r.dw.assign(static_cast<size_t>(L), 0.0);
  // Element e < L of group g of row n is head h = (g·L + e) / D, dim (g·L + e) % D.
  auto idx = [&](int64_t n, int64_t g, int64_t e) { return c.at(n, (g * L + e) / c.D, (g * L + e) % c.D); };
  for (int64_t n = 0; n < c.N; ++n)
    for (int64_t g = 0; g < G; ++g) {
      const size_t s = static_cast<size_t>(n * G + g);
      for (int64_t e = 0; e < L; ++e) r.ss[s] += xs[idx(n, g, e)] * xs[idx(n, g, e)];
      r.rstd[s] = 1.0 / std::sqrt(r.ss[s] / static_cast<double>(count) + eps);
      for (int64_t e = 0; e < L; ++e) {
        const size_t i = idx(n, g, e);
        r.out[i] = xs[i] * r.rstd[s] * w[static_cast<size_t>(e)];
        r.dot[s] += dout[i] * w[static_cast<size_t>(e)] * xs[i] * r.rstd[s];
        r.dot_err[s] += std::fabs(dout[i] * w[static_cast<size_t>(e)] * xs[i] * r.rstd[s]);
      }
      r.dot_err[s] *= std::ldexp(std::sqrt(static_cast<double>(L)), -24);
      for (int64_t e = 0; e < L; ++e) {
        const size_t i = idx(n, g, e);
        const double xh = xs[i] * r.rstd[s];
        r.dx[i] = r.rstd[s] * (dout[i] * w[static_cast<size_t>(e)] - xh * r.dot[s] / static_cast<double>(count));
        r.dw[static_cast<size_t>(e)] += dout[i] * xh;
      }
    }
  return r;
}

bool aligned(const Tensor& t) { return reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 == 0; }
// The vectorised path's condition (head_norm.cu): L and every view's row stride multiples of 8, pointers aligned.
std::string path(const std::string& op, const Case& c, std::initializer_list<const Tensor*> views) {
  bool vec = c.L() % 8 == 0;
  for (const Tensor* t : views) vec = vec && aligned(*t) && t->strides()[0] % 8 == 0;
  return op + (vec ? ".vec8" : ".scalar");
}

Tensor heads(const Tensor& packed, const Case& c) { return packed.view({c.N, c.total, c.D}).slice(1, c.h0, c.h0 + c.H); }

void run(Device dev, DType dt, const Case& c, bool in_place, uint64_t seed) {
  Rng rng(seed);
  const int64_t G = c.G(), L = c.L(), count = L;
  const float eps = 1e-6f;
  const Shape packed{c.N, c.total * c.D};
  const Input xp = rand_input(rng, packed, dt, dev, -2, 2);
  const Input w = rand_input(rng, {L}, dt, dev, 0.5, 1.5);
  const Input dp = rand_input(rng, packed, dt, dev, -1, 1);
  const Input dw0 = rand_input(rng, {L}, DType::F32, dev, -1, 1);
  const Ref r = reference(c, xp.v, w.v, dp.v, count, eps);
  const std::string name = case_name(dev, dt, str("head_norm ", c.what, " N=", c.N, " H=", c.H, " D=", c.D,
                                                  in_place ? " in place" : ""));
  const Tol t = tol(dt, Kind::Reduction), tf = tol(DType::F32, Kind::Reduction);
  const Tensor x = heads(xp.t, c);

  Out ss = make_out({c.N, G}, DType::F32, dev);
  PathProbe p0;
  head_norm_sumsq(x, ss.t);
  check_path(dev, p0, path("head_norm_sumsq", c, {&x}), name + " sumsq");
  check_out(name + " ss", ss, r.ss, tf);

  Out rstd = make_out({c.N, G}, DType::F32, dev);
  Tensor out;
  Out ob;  // the poisoned packed buffer the output view lives in
  if (in_place) {
    const Tensor xc = xp.t.clone();
    out = heads(xc, c);
    head_norm_forward(out, ss.t, count, eps, w.t, out, rstd.t);
    std::vector<double> want = r.out;
    for (size_t i = 0; i < want.size(); ++i)
      if (std::isnan(want[i])) want[i] = xp.v[i];  // the other heads of the packed row: unchanged
    check_close(name + " out (in place, whole packed row)", xc, want, t);
  } else {
    ob = make_out(packed, dt, dev);
    out = heads(ob.t, c);
    PathProbe p1;
    head_norm_forward(x, ss.t, count, eps, w.t, out, rstd.t);
    check_path(dev, p1, path("head_norm_forward", c, {&x, &out, &w.t}), name + " forward");
    check_out(name + " out (other heads untouched)", ob, r.out, t);
  }
  check_out(name + " rstd", rstd, r.rstd, tf);

  const Tensor dout = heads(dp.t, c);
  Out dot = make_out({c.N, G}, DType::F32, dev);
  PathProbe p2;
  head_norm_backward_dot(dout, x, w.t, rstd.t, dot.t);
  check_path(dev, p2, path("head_norm_backward_dot", c, {&dout, &x, &w.t}), name + " dot");
  check_out(name + " dot", dot, r.dot, tol(dt, Kind::Reduction), &r.dot_err);

  const DType wdt = (seed & 1) ? DType::F32 : dt;  // dweight in f32 or x's dtype
  std::vector<double> w0(dw0.v.size());
  for (size_t i = 0; i < w0.size(); ++i) w0[i] = round_to(wdt, dw0.v[i]);
  Out dw = make_out({L}, wdt, dev, &w0);
  std::vector<double> dw_want(w0.size());
  double dw_max = 0;
  for (size_t i = 0; i < w0.size(); ++i) dw_max = std::max(dw_max, std::fabs(r.dw[i]));
  for (size_t i = 0; i < w0.size(); ++i) dw_want[i] = w0[i] + r.dw[i];
  const Tol tw{tol(wdt, Kind::Reduction).rtol, t.atol + t.ntol * dw_max, 0};
  if (in_place) {
    const Tensor dc = dp.t.clone();
    const Tensor d = heads(dc, c);
    head_norm_backward(d, x, w.t, rstd.t, dot.t, count, d, dw.t);  // dx = dout
    std::vector<double> want = r.dx;
    for (size_t i = 0; i < want.size(); ++i)
      if (std::isnan(want[i])) want[i] = dp.v[i];
    check_close(name + " dx (= dout, whole packed row)", dc, want, t);
  } else {
    Out dxb = make_out(packed, dt, dev);
    const Tensor dx = heads(dxb.t, c);
    PathProbe p3;
    head_norm_backward(dout, x, w.t, rstd.t, dot.t, count, dx, dw.t);
    check_path(dev, p3, path("head_norm_backward", c, {&dout, &x, &w.t, &dx}), name + " backward");
    check_out(name + " dx (other heads untouched)", dxb, r.dx, t);
  }
  check_out(name + " dweight (+=)", dw, dw_want, tw);
}

// A whole-row group split over 2 "ranks" (heads [0, H/2) and [H/2, H)): the phases on each half,
// the partial sums added between them as an all-reduce would, must give the unsplit op's results.
void run_split(Device dev, DType dt, const Case& c, uint64_t seed) {
  REQUIRE((!c.per_head && c.H % 2 == 0));
  Rng rng(seed);
  const int64_t L = c.L(), half = c.H / 2, count = L;
  const float eps = 1e-5f;
  const Input xp = rand_input(rng, {c.N, c.total * c.D}, dt, dev, -2, 2);
  const Input w = rand_input(rng, {L}, dt, dev, 0.5, 1.5);
  const Input dp = rand_input(rng, {c.N, c.total * c.D}, dt, dev, -1, 1);
  const Ref r = reference(c, xp.v, w.v, dp.v, count, eps);
  const std::string name = case_name(dev, dt, str("head_norm TP2 split of ", c.what));
  const Tensor x = heads(xp.t, c), dout = heads(dp.t, c);
  // The unsplit op.
  const Tensor ss = Tensor::empty({c.N, 1}, DType::F32, dev), rstd = Tensor::empty({c.N, 1}, DType::F32, dev),
               dot = Tensor::empty({c.N, 1}, DType::F32, dev);
  const Tensor out = Tensor::empty({c.N, c.H, c.D}, dt, dev), dx = Tensor::empty({c.N, c.H, c.D}, dt, dev);
  const Tensor dw = Tensor::zeros({L}, DType::F32, dev);
  head_norm_sumsq(x, ss);
  head_norm_forward(x, ss, count, eps, w.t, out, rstd);
  head_norm_backward_dot(dout, x, w.t, rstd, dot);
  head_norm_backward(dout, x, w.t, rstd, dot, count, dx, dw);
  // Two ranks: each its half of the heads and of the weight.
  const Tensor xs[2] = {x.slice(1, 0, half), x.slice(1, half, c.H)};
  const Tensor ds[2] = {dout.slice(1, 0, half), dout.slice(1, half, c.H)};
  const Tensor ws[2] = {w.t.slice(0, 0, L / 2), w.t.slice(0, L / 2, L)};
  Tensor part_ss[2], part_dot[2], rs[2];
  const Tensor sum_ss = Tensor::empty({c.N, 1}, DType::F32, dev), sum_dot = Tensor::empty({c.N, 1}, DType::F32, dev);
  const Tensor out2 = Tensor::empty({c.N, c.H, c.D}, dt, dev), dx2 = Tensor::empty({c.N, c.H, c.D}, dt, dev);
  const Tensor dw2 = Tensor::zeros({L}, DType::F32, dev);
  for (int k = 0; k < 2; ++k) {
    part_ss[k] = Tensor::empty({c.N, 1}, DType::F32, dev);
    head_norm_sumsq(xs[k], part_ss[k]);
  }
  add_forward(part_ss[0], part_ss[1], sum_ss);  // the all-reduce
  for (int k = 0; k < 2; ++k) {
    rs[k] = Tensor::empty({c.N, 1}, DType::F32, dev);
    head_norm_forward(xs[k], sum_ss, count, eps, ws[k], out2.slice(1, k * half, (k + 1) * half), rs[k]);
    part_dot[k] = Tensor::empty({c.N, 1}, DType::F32, dev);
    head_norm_backward_dot(ds[k], xs[k], ws[k], rs[k], part_dot[k]);
  }
  add_forward(part_dot[0], part_dot[1], sum_dot);  // the all-reduce
  for (int k = 0; k < 2; ++k)
    head_norm_backward(ds[k], xs[k], ws[k], rs[k], sum_dot, count, dx2.slice(1, k * half, (k + 1) * half),
                       dw2.slice(0, k * L / 2, (k + 1) * L / 2));
  // Against the unsplit op (only the f32 summation order differs) and against float64.
  const Tol near{1e-5, 1e-6, 1e-5};
  check_close(name + " ss = unsplit", sum_ss, values(ss), near);
  check_close(name + " rstd = unsplit", rs[0], values(rstd), near);
  check_close(name + " rstd of rank 1 = unsplit", rs[1], values(rstd), near);
  std::vector<double> twice(r.dot_err.size());
  for (size_t i = 0; i < twice.size(); ++i) twice[i] = 2 * r.dot_err[i];  // two f32 sums, each off the exact one
  check_close(name + " dot = unsplit", sum_dot, values(dot), {1e-5, 1e-6, 0}, &twice);
  const Tol lowp = dt == DType::F32 ? near : tol(dt, Kind::Pointwise);  // one rounding apart at most
  check_close(name + " out = unsplit", out2, values(out), lowp);
  check_close(name + " dx = unsplit", dx2, values(dx), dt == DType::F32 ? near : tol(dt, Kind::Reduction));
  check_close(name + " dweight = unsplit", dw2, values(dw), near);
  std::vector<double> o_ref, dx_ref;  // the view's elements in (n, h, d) order
  for (int64_t n = 0; n < c.N; ++n)
    for (int64_t h = 0; h < c.H; ++h)
      for (int64_t d = 0; d < c.D; ++d) {
        o_ref.push_back(r.out[c.at(n, h, d)]);
        dx_ref.push_back(r.dx[c.at(n, h, d)]);
      }
  check_close(name + " out vs float64", out2, o_ref, tol(dt, Kind::Reduction));
  check_close(name + " dx vs float64", dx2, dx_ref, tol(dt, Kind::Reduction));
  check_close(name + " dweight vs float64", dw2, r.dw, tol(dt, Kind::Reduction));
}

}  // namespace

TEST_CASE("head_norm: the reference backward equals float64 finite differences of its forward") {
  for (const Case& c : {cases()[1], cases()[3], cases()[7]}) {
    Rng rng(4700);
    const int64_t L = c.L(), n = c.N * c.total * c.D;
    std::vector<double> xs(static_cast<size_t>(n)), w(static_cast<size_t>(L)), dout(static_cast<size_t>(n));
    for (double& v : xs) v = rng.uniform(-2, 2);
    for (double& v : w) v = rng.uniform(0.5, 1.5);
    for (double& v : dout) v = rng.uniform(-1, 1);
    const double eps = 1e-3;  // large enough to matter in the derivative
    const Ref r = reference(c, xs, w, dout, L, eps);
    auto loss = [&](const std::vector<double>& xv, const std::vector<double>& wv) {
      const Ref q = reference(c, xv, wv, dout, L, eps);
      double s = 0;
      for (size_t i = 0; i < q.out.size(); ++i)
        if (!std::isnan(q.out[i])) s += dout[i] * q.out[i];
      return s;
    };
    std::vector<double> fx(xs.size(), NAN), fw(w.size());
    for (size_t i = 0; i < xs.size(); ++i) {
      if (std::isnan(r.dx[i])) continue;  // not in the view
      const double x0 = xs[i], h = 1e-6;
      xs[i] = x0 + h;
      const double lp = loss(xs, w);
      xs[i] = x0 - h;
      const double lm = loss(xs, w);
      xs[i] = x0;
      fx[i] = (lp - lm) / (2 * h);
    }
    for (size_t i = 0; i < w.size(); ++i) {
      const double w0 = w[i], h = 1e-6;
      w[i] = w0 + h;
      const double lp = loss(xs, w);
      w[i] = w0 - h;
      const double lm = loss(xs, w);
      w[i] = w0;
      fw[i] = (lp - lm) / (2 * h);
    }
    check_close(str("head_norm reference dx vs finite differences: ", c.what), r.dx, fx, {1e-6, 1e-8, 0});
    check_close(str("head_norm reference dweight vs finite differences: ", c.what), r.dw, fw, {1e-6, 1e-8, 0});
  }
}

TEST_CASE("head_norm per head and whole row vs float64 on packed-qkv views; every dtype and device") {
  uint64_t seed = 4800;
  for (Device dev : test_devices())
    for (DType dt : float_dtypes())
      for (const Case& c : cases()) run(dev, dt, c, false, ++seed);
}

TEST_CASE("head_norm: out may alias x (in place on the packed qkv), dx may alias dout") {
  uint64_t seed = 4900;
  for (Device dev : test_devices())
    for (DType dt : float_dtypes())
      for (const Case& c : cases()) run(dev, dt, c, true, ++seed);
}

TEST_CASE("head_norm: a whole-row group split over 2 tensor-parallel ranks equals the unsplit op") {
  uint64_t seed = 5000;
  for (Device dev : test_devices())
    for (DType dt : float_dtypes())
      for (const Case& c : {cases()[2], cases()[3], cases()[6], cases()[8]}) run_split(dev, dt, c, ++seed);
}

TEST_CASE("head_norm: undefined dx or dweight are skipped") {
  for (Device dev : test_devices()) {
    const Case& c = cases()[0];
    Rng rng(5100);
    const Input xp = rand_input(rng, {c.N, c.total * c.D}, DType::F32, dev, -2, 2);
    const Input w = rand_input(rng, {c.D}, DType::F32, dev, 0.5, 1.5);
    const Tensor x = heads(xp.t, c);
    const Tensor ss = Tensor::empty({c.N, c.H}, DType::F32, dev), rstd = Tensor::empty({c.N, c.H}, DType::F32, dev),
                 dot = Tensor::empty({c.N, c.H}, DType::F32, dev), out = Tensor::empty({c.N, c.H, c.D}, DType::F32, dev);
    head_norm_sumsq(x, ss);
    head_norm_forward(x, ss, c.D, 1e-6f, w.t, out, rstd);
    head_norm_backward_dot(x, x, w.t, rstd, dot);
    const Tensor dw = Tensor::zeros({c.D}, DType::F32, dev), dx = Tensor::empty({c.N, c.H, c.D}, DType::F32, dev);
    head_norm_backward(x, x, w.t, rstd, dot, c.D, Tensor(), dw);
    head_norm_backward(x, x, w.t, rstd, dot, c.D, dx, Tensor());
    double s = 0;
    for (float v : dw.to_floats()) s += std::fabs(v);
    CHECK_MESSAGE(s > 0, dev.name() << ": dweight alone was not computed");
    CHECK(all_finite(dx));
  }
}

TEST_CASE("head_norm: invalid arguments throw naming the op") {
  const Tensor packed = Tensor::zeros({3, 8, 16}, DType::F32);
  const Tensor x = packed.slice(1, 0, 4);  // (3, 4, 16), row stride 128
  const Tensor ssh = Tensor::zeros({3, 4}, DType::F32), ssr = Tensor::zeros({3, 1}, DType::F32);
  const Tensor wd = Tensor::zeros({16}, DType::F32), wr = Tensor::zeros({64}, DType::F32);
  const Tensor out = Tensor::zeros({3, 4, 16}, DType::F32);
  const char* s = "head_norm_sumsq";
  const char* f = "head_norm_forward";
  check_throws_naming(s, [&] { head_norm_sumsq(Tensor::zeros({3, 64}, DType::F32), ssr); }, "2-D x");
  check_throws_naming(s, [&] { head_norm_sumsq(Tensor::zeros({3, 16, 4}, DType::F32).transpose(1, 2), ssh); },
                      "heads not packed");
  check_throws_naming(s, [&] { head_norm_sumsq(x, Tensor::zeros({3, 2}, DType::F32)); }, "ss (N, 2) with H = 4");
  check_throws_naming(s, [&] { head_norm_sumsq(Tensor::zeros({3, 0, 16}, DType::F32), Tensor::zeros({3, 0}, DType::F32)); },
                      "no heads");
  check_throws_naming(s, [&] { head_norm_sumsq(x, Tensor::zeros({3, 4}, DType::BF16)); }, "ss bf16");
  check_throws_naming(s, [&] { head_norm_sumsq(x, Tensor::zeros({4, 3}, DType::F32).transpose(0, 1)); }, "ss strided");
  check_throws_naming(f, [&] { head_norm_forward(x, ssh, 16, 1e-6f, wr, out, ssh); }, "per head with a (H·D) weight");
  check_throws_naming(f, [&] { head_norm_forward(x, ssr, 64, 1e-6f, wd, out, ssr); }, "whole row with a (D) weight");
  check_throws_naming(f, [&] { head_norm_forward(x, ssh, 8, 1e-6f, wd, out, ssh); }, "count < D");
  check_throws_naming(f, [&] { head_norm_forward(x, ssr, 32, 1e-6f, wr, out, ssr); }, "count < H·D");
  check_throws_naming(f, [&] { head_norm_forward(x, ssh, 16, -1.0f, wd, out, ssh); }, "eps < 0");
  check_throws_naming(f, [&] { head_norm_forward(x, ssh, 16, 1e-6f, Tensor::zeros({16}, DType::BF16), out, ssh); },
                      "weight dtype");
  check_throws_naming(f, [&] { head_norm_forward(x, ssh, 16, 1e-6f, wd, Tensor::zeros({3, 4, 16}, DType::F16), ssh); },
                      "out dtype");
  check_throws_naming(f, [&] { head_norm_forward(x, ssh, 16, 1e-6f, wd, out, ssr); }, "rstd shape differs from ss");
  check_throws_naming("head_norm_backward_dot", [&] { head_norm_backward_dot(out, x, wd, ssh, ssr); },
                      "dot shape differs from rstd");
  check_throws_naming("head_norm_backward", [&] {
    head_norm_backward(out, x, wd, ssh, ssh, 16, Tensor::zeros({3, 4, 8}, DType::F32), Tensor());
  }, "dx shape");
  check_throws_naming("head_norm_backward", [&] {
    head_norm_backward(out, x, wd, ssh, ssh, 16, out, Tensor::zeros({64}, DType::F32));
  }, "dweight shape");
  check_throws_naming("head_norm_backward", [&] {
    head_norm_backward(out, x, wd, ssh, ssh, 16, out, Tensor::zeros({16}, DType::F16));
  }, "dweight f16 for f32 x");
  check_throws_naming("head_norm_backward", [&] { head_norm_backward(out, x, wd, ssh, ssh, 0, out, Tensor()); }, "count 0");
}
