// tests/tensor/test_gemm.cpp — gemm / gemm_backward conformance (every backend, every float dtype).
//
// Reference: a float64 triple loop written here. Forward tolerance: the out
// dtype's pointwise rtol plus the f32-accumulation bound 2·K·2^-24·Σ|a||b|
// (see op_harness.h). Backward: float64 central differences of the reference
// forward on small shapes, an explicit float64 backward on the large shape.
#include <array>

#include "tests/tensor/op_harness.h"

using namespace mpitron;
using namespace mpitron::test;

namespace {

constexpr double kU = 1.0 / 16777216.0;  // 2^-24, f32 unit roundoff

struct Dims {
  int64_t batch;  // 1 when neither operand is 3-D
  bool a3, b3;    // which operands carry the batch dim
  int64_t m, n, k;
  bool ta, tb;
};

Shape a_shape(const Dims& d) {
  Shape s = d.ta ? Shape{d.k, d.m} : Shape{d.m, d.k};
  if (d.a3) s.insert(s.begin(), d.batch);
  return s;
}
Shape b_shape(const Dims& d) {
  Shape s = d.tb ? Shape{d.n, d.k} : Shape{d.k, d.n};
  if (d.b3) s.insert(s.begin(), d.batch);
  return s;
}
Shape out_shape(const Dims& d) {
  if (d.a3 || d.b3) return {d.batch, d.m, d.n};
  return {d.m, d.n};
}

// op(a)[bi](i, k) and op(b)[bi](k, j) of the flat row-major buffers.
double opa(const Dims& d, const std::vector<double>& a, int64_t bi, int64_t i, int64_t k) {
  const int64_t off = d.a3 ? bi * d.m * d.k : 0;
  return d.ta ? a[off + k * d.m + i] : a[off + i * d.k + k];
}
double opb(const Dims& d, const std::vector<double>& b, int64_t bi, int64_t k, int64_t j) {
  const int64_t off = d.b3 ? bi * d.k * d.n : 0;
  return d.tb ? b[off + j * d.k + k] : b[off + k * d.n + j];
}

// out = alpha·op(a)·op(b) + beta·c + bias; `mag` gets the magnitude bound Σ|terms|.
std::vector<double> ref_gemm(const Dims& d, const std::vector<double>& a, const std::vector<double>& b,
                             double alpha, double beta, const std::vector<double>* c,
                             const std::vector<double>* bias, std::vector<double>* mag = nullptr) {
  std::vector<double> out(static_cast<size_t>(d.batch * d.m * d.n));
  if (mag) mag->assign(out.size(), 0.0);
  for (int64_t bi = 0; bi < d.batch; ++bi)
    for (int64_t i = 0; i < d.m; ++i)
      for (int64_t j = 0; j < d.n; ++j) {
        double acc = 0, am = 0;
        for (int64_t k = 0; k < d.k; ++k) {
          const double p = opa(d, a, bi, i, k) * opb(d, b, bi, k, j);
          acc += p;
          am += std::fabs(p);
        }
        const size_t o = static_cast<size_t>((bi * d.m + i) * d.n + j);
        double v = alpha * acc, mv = std::fabs(alpha) * am;
        if (beta != 0) {
          v += beta * (*c)[o];
          mv += std::fabs(beta * (*c)[o]);
        }
        if (bias) {
          v += (*bias)[j];
          mv += std::fabs((*bias)[j]);
        }
        out[o] = v;
        if (mag) (*mag)[o] = mv;
      }
  return out;
}

// Explicit float64 backward (for shapes too large for finite differences):
// da (a's layout), db (b's layout, summed over the batch when b is 2-D), dbias.
// With `absval`, every product is |·| (gives the magnitude for the error bound).
void ref_gemm_backward(const Dims& d, const std::vector<double>& dout, const std::vector<double>& a,
                       const std::vector<double>& b, std::vector<double>& da, std::vector<double>& db,
                       std::vector<double>& dbias, bool absval = false) {
  auto f = [&](double x) { return absval ? std::fabs(x) : x; };
  da.assign(a.size(), 0.0);
  db.assign(b.size(), 0.0);
  dbias.assign(static_cast<size_t>(d.n), 0.0);
  for (int64_t bi = 0; bi < d.batch; ++bi) {
    const int64_t aoff = d.a3 ? bi * d.m * d.k : 0, boff = d.b3 ? bi * d.k * d.n : 0;
    for (int64_t i = 0; i < d.m; ++i)
      for (int64_t j = 0; j < d.n; ++j) {
        const double g = dout[static_cast<size_t>((bi * d.m + i) * d.n + j)];
        dbias[j] += f(g);
        for (int64_t k = 0; k < d.k; ++k) {
          const size_t ai = static_cast<size_t>(aoff + (d.ta ? k * d.m + i : i * d.k + k));
          const size_t bj = static_cast<size_t>(boff + (d.tb ? j * d.k + k : k * d.n + j));
          da[ai] += f(g * b[bj]);
          db[bj] += f(g * a[ai]);
        }
      }
  }
}

std::vector<double> accum_bound(const std::vector<double>& mag, int64_t k) {
  std::vector<double> e(mag.size());
  for (size_t i = 0; i < mag.size(); ++i) e[i] = 2.0 * static_cast<double>(std::max<int64_t>(k, 1)) * kU * mag[i];
  return e;
}

std::string dims_str(const Dims& d) {
  return str("B=", d.batch, d.a3 ? " a3" : "", d.b3 ? " b3" : "", " M=", d.m, " N=", d.n, " K=", d.k,
             d.ta ? " aT" : "", d.tb ? " bT" : "");
}

// bias_offset: the bias is a view that many elements into its buffer (a parameter
// in the flat buffer may be only 2- or 4-byte aligned).
void run_forward(Device dev, DType dt, DType out_dt, const Dims& d, float alpha, float beta, bool with_bias,
                 uint64_t seed, int64_t bias_offset = 0) {
  Rng rng(seed);
  const Input a = rand_input(rng, a_shape(d), dt, dev, -1, 1);
  const Input b = rand_input(rng, b_shape(d), dt, dev, -1, 1);
  Input bias;
  if (with_bias) {
    bias = rand_input(rng, {d.n + bias_offset}, out_dt, dev, -1, 1);
    bias.t = bias.t.flat_range(bias_offset, d.n);
    bias.v.erase(bias.v.begin(), bias.v.begin() + bias_offset);
  }
  std::vector<double> c;
  Out out;
  if (beta != 0) {
    c = rand_input(rng, out_shape(d), out_dt, dev, -1, 1).v;
    out = make_out(out_shape(d), out_dt, dev, &c);
  } else {
    out = make_out(out_shape(d), out_dt, dev);  // NaN: beta = 0 must never read it
  }
  GemmArgs args;
  args.trans_a = d.ta;
  args.trans_b = d.tb;
  args.alpha = alpha;
  args.beta = beta;
  const PathProbe path;
  gemm(a.t, b.t, out.t, args, with_bias ? bias.t : Tensor());
  if (dev.is_cuda() && with_bias) {
    // Which of the two cuBLASLt decides (heuristic, run time); a bias must have taken one of them.
    const int64_t epi = path.delta("gemm.epilogue_bias"), kernel = path.delta("gemm.bias_kernel");
    CHECK_MESSAGE(epi + kernel >= 1, "gemm with bias counted no bias path; took " << path.taken());
    MESSAGE("gemm bias at offset " << bias_offset << ": " << path.taken());
  }
  std::vector<double> mag;
  const std::vector<double> ref = ref_gemm(d, a.v, b.v, alpha, beta, beta != 0 ? &c : nullptr,
                                           with_bias ? &bias.v : nullptr, &mag);
  std::vector<double> extra = accum_bound(mag, d.k + 2);
  if (dev.is_cuda() && with_bias && out_dt != DType::F32 && path.delta("gemm.epilogue_bias") > 0) {
    // cuBLASLt's bias epilogue with a 16-bit D rounds alpha·A·B + beta·C to D's type before
    // the bias is added (seen on an H200, cuBLAS 13.0: up to ~30 f16/bf16 ulps of the result
    // where the bias cancels the product), so the bound gets one rounding of that value.
    const double u = out_dt == DType::BF16 ? 1.0 / 256.0 : 1.0 / 2048.0;  // unit roundoff
    const std::vector<double> pre = ref_gemm(d, a.v, b.v, alpha, beta, beta != 0 ? &c : nullptr, nullptr);
    for (size_t i = 0; i < extra.size(); ++i) extra[i] += u * std::fabs(pre[i]);
  }
  check_out(case_name(dev, dt, str("gemm ", dims_str(d), " alpha=", alpha, " beta=", beta,
                                   with_bias ? str(" bias@+", bias_offset) : "", " out=", dtype_name(out_dt))),
            out, ref, tol(out_dt, Kind::Pointwise), &extra);
}

// Backward: kernel outputs vs finite differences (fd = true) or the explicit f64 backward.
void run_backward(Device dev, DType dt, DType grad_dt, const Dims& d, bool accumulate_a, bool accumulate_b,
                  bool fd, uint64_t seed) {
  Rng rng(seed);
  const Input a = rand_input(rng, a_shape(d), dt, dev, -1, 1);
  const Input b = rand_input(rng, b_shape(d), dt, dev, -1, 1);
  const Input dout = rand_input(rng, out_shape(d), dt, dev, -1, 1);
  const std::vector<double> da0 = rand_input(rng, a_shape(d), grad_dt, dev, -1, 1).v;
  const std::vector<double> db0 = rand_input(rng, b_shape(d), grad_dt, dev, -1, 1).v;
  const std::vector<double> dbias0 = rand_input(rng, {d.n}, grad_dt, dev, -1, 1).v;
  Out da = accumulate_a ? make_out(a_shape(d), grad_dt, dev, &da0) : make_out(a_shape(d), grad_dt, dev);
  Out db = accumulate_b ? make_out(b_shape(d), grad_dt, dev, &db0) : make_out(b_shape(d), grad_dt, dev);
  Out dbias = accumulate_b ? make_out({d.n}, grad_dt, dev, &dbias0) : make_out({d.n}, grad_dt, dev);
  GemmArgs args;
  args.trans_a = d.ta;
  args.trans_b = d.tb;
  gemm_backward(dout.t, a.t, b.t, da.t, db.t, dbias.t, args, accumulate_a, accumulate_b);

  std::vector<double> ga, gb, gbias, ma, mb, mbias;
  ref_gemm_backward(d, dout.v, a.v, b.v, ga, gb, gbias);
  ref_gemm_backward(d, dout.v, a.v, b.v, ma, mb, mbias, /*absval=*/true);
  const std::string name = case_name(dev, dt, str("gemm_backward ", dims_str(d), " grads=", dtype_name(grad_dt),
                                                  accumulate_a ? " acc_a" : "", accumulate_b ? " acc_b" : ""));
  if (fd) {
    // The explicit backward must agree with finite differences of the forward...
    const std::vector<double> fa = fd_grad(a.v, [&](const std::vector<double>& x) {
      return ref_gemm(d, x, b.v, 1, 0, nullptr, nullptr);
    }, dout.v, 0.5);
    const std::vector<double> fb = fd_grad(b.v, [&](const std::vector<double>& x) {
      return ref_gemm(d, a.v, x, 1, 0, nullptr, nullptr);
    }, dout.v, 0.5);
    std::vector<double> zb(static_cast<size_t>(d.n), 0.0);
    const std::vector<double> fbias = fd_grad(zb, [&](const std::vector<double>& x) {
      return ref_gemm(d, a.v, b.v, 1, 0, nullptr, &x);
    }, dout.v, 0.5);
    // ...and the kernel is checked against the finite differences.
    ga = fa;
    gb = fb;
    gbias = fbias;
  }
  const int64_t rows = d.batch * d.m;  // reduction length for db and dbias
  auto with_init = [](std::vector<double> g, const std::vector<double>& init, bool acc) {
    if (acc)
      for (size_t i = 0; i < g.size(); ++i) g[i] += init[i];
    return g;
  };
  // da reduces over N (and over the batch when a is shared); db over M (and the batch).
  const int64_t ka = d.n * (d.a3 ? 1 : d.batch);
  const int64_t kb = d.m * (d.b3 ? 1 : d.batch);
  std::vector<double> ea = accum_bound(ma, ka + 1), eb = accum_bound(mb, kb + 1), ebias = accum_bound(mbias, rows + 1);
  // (The map is linear in each operand, so central differences with h = 0.5 are exact
  // up to float64 roundoff, ~1e-13 here.)
  check_out(name + " da", da, with_init(ga, da0, accumulate_a), tol(grad_dt, Kind::Pointwise), &ea);
  check_out(name + " db", db, with_init(gb, db0, accumulate_b), tol(grad_dt, Kind::Pointwise), &eb);
  check_out(name + " dbias", dbias, with_init(gbias, dbias0, accumulate_b), tol(grad_dt, Kind::Pointwise), &ebias);
}

const std::vector<std::array<int64_t, 3>> kSmallMNK = {{1, 1, 1}, {7, 13, 37}, {13, 7, 8}, {3, 127, 5}};

}  // namespace

TEST_CASE("gemm forward: transposes, awkward shapes, every dtype") {
  uint64_t seed = 100;
  for (Device dev : test_devices())
    for (DType dt : float_dtypes())
      for (auto [m, n, k] : kSmallMNK)
        for (int t = 0; t < 4; ++t) {
          const Dims d{1, false, false, m, n, k, (t & 1) != 0, (t & 2) != 0};
          run_forward(dev, dt, dt, d, 1.0f, 0.0f, false, ++seed);
        }
}

TEST_CASE("gemm forward: bias, alpha and beta (beta = 0 never reads out)") {
  uint64_t seed = 200;
  for (Device dev : test_devices())
    for (DType dt : float_dtypes())
      for (int t = 0; t < 4; ++t) {
        const Dims d{1, false, false, 13, 37, 7, (t & 1) != 0, (t & 2) != 0};
        run_forward(dev, dt, dt, d, 1.0f, 0.0f, true, ++seed);
        run_forward(dev, dt, dt, d, 0.5f, 0.75f, false, ++seed);
        run_forward(dev, dt, dt, d, -1.25f, 1.0f, true, ++seed);
        run_forward(dev, dt, dt, d, 2.0f, 0.0f, true, ++seed);
      }
}

TEST_CASE("gemm forward: a bias 2- or 4-byte aligned (a view in the flat parameter buffer)") {
  // cuBLASLt must learn the bias alignment before its heuristic picks an algorithm;
  // if it still refuses the epilogue at run time, the separate bias kernel adds it.
  uint64_t seed = 250;
  for (Device dev : test_devices())
    for (DType dt : float_dtypes())
      for (int64_t off : {1, 2, 3}) {
        run_forward(dev, dt, dt, Dims{1, false, false, 16, 64, 32, false, false}, 1.0f, 0.0f, true, ++seed, off);
        run_forward(dev, dt, dt, Dims{2, true, false, 8, 40, 24, false, true}, 1.0f, 1.0f, true, ++seed, off);
      }
}

TEST_CASE("gemm forward: f32 out from bf16/f16 inputs") {
  uint64_t seed = 300;
  for (Device dev : test_devices())
    for (DType dt : {DType::BF16, DType::F16})
      for (int t = 0; t < 4; ++t) {
        run_forward(dev, dt, DType::F32, {1, false, false, 7, 13, 37, (t & 1) != 0, (t & 2) != 0}, 1, 0, false, ++seed);
        run_forward(dev, dt, DType::F32, {1, false, false, 13, 7, 127, (t & 1) != 0, (t & 2) != 0}, 1, 0.5f, true, ++seed);
        run_forward(dev, dt, DType::F32, {3, true, false, 5, 9, 11, (t & 1) != 0, (t & 2) != 0}, 1, 0, true, ++seed);
      }
}

TEST_CASE("gemm forward: batched, with a shared 2-D operand") {
  uint64_t seed = 400;
  for (Device dev : test_devices())
    for (DType dt : float_dtypes())
      for (int t = 0; t < 4; ++t) {
        const bool ta = t & 1, tb = t & 2;
        run_forward(dev, dt, dt, {3, true, true, 7, 5, 13, ta, tb}, 1, 0, false, ++seed);
        run_forward(dev, dt, dt, {3, true, false, 7, 5, 13, ta, tb}, 1, 0, true, ++seed);   // shared b (linear layer)
        run_forward(dev, dt, dt, {4, false, true, 5, 11, 9, ta, tb}, 1, 0, false, ++seed);  // shared a
        run_forward(dev, dt, dt, {2, true, true, 1, 1, 1, ta, tb}, 0.5f, 0.25f, true, ++seed);
      }
}

TEST_CASE("gemm forward: moderately large") {
  uint64_t seed = 500;
  for (Device dev : test_devices())
    for (DType dt : float_dtypes()) {
      run_forward(dev, dt, dt, {1, false, false, 257, 320, 384, false, true}, 1, 0, true, ++seed);
      run_forward(dev, dt, dt, {1, false, false, 131, 96, 520, true, false}, 1, 1, false, ++seed);
    }
}

TEST_CASE("gemm backward vs finite differences: transposes, accumulate flags, every dtype") {
  uint64_t seed = 600;
  for (Device dev : test_devices())
    for (DType dt : float_dtypes())
      for (int t = 0; t < 4; ++t) {
        const bool ta = t & 1, tb = t & 2;
        run_backward(dev, dt, dt, {1, false, false, 7, 13, 37, ta, tb}, false, true, true, ++seed);
        run_backward(dev, dt, dt, {1, false, false, 1, 1, 1, ta, tb}, true, false, true, ++seed);
        run_backward(dev, dt, DType::F32, {1, false, false, 13, 5, 7, ta, tb}, true, true, true, ++seed);
        run_backward(dev, dt, dt, {3, true, true, 5, 7, 3, ta, tb}, false, false, true, ++seed);
        // Batched a/dout with a shared 2-D b: db and dbias are summed over the batch.
        run_backward(dev, dt, DType::F32, {3, true, false, 5, 7, 11, ta, tb}, false, true, true, ++seed);
        run_backward(dev, dt, dt, {2, true, false, 7, 3, 5, ta, tb}, true, false, true, ++seed);
      }
}

TEST_CASE("gemm backward: shared 2-D a with batched b") {
  uint64_t seed = 650;
  for (Device dev : test_devices())
    for (DType dt : float_dtypes())
      run_backward(dev, dt, dt, {3, false, true, 5, 7, 4, false, false}, false, false, true, ++seed);
}

TEST_CASE("gemm backward: moderately large (explicit f64 backward)") {
  uint64_t seed = 700;
  for (Device dev : test_devices())
    for (DType dt : float_dtypes())
      run_backward(dev, dt, DType::F32, {2, true, false, 96, 160, 200, false, true}, false, true, false, ++seed);
}

TEST_CASE("gemm backward: undefined gradients are skipped") {
  for (Device dev : test_devices()) {
    Rng rng(7);
    const Dims d{1, false, false, 7, 5, 3, false, true};
    const Input a = rand_input(rng, a_shape(d), DType::F32, dev, -1, 1);
    const Input b = rand_input(rng, b_shape(d), DType::F32, dev, -1, 1);
    const Input dout = rand_input(rng, out_shape(d), DType::F32, dev, -1, 1);
    Out da = make_out(a_shape(d), DType::F32, dev);
    GemmArgs args;
    args.trans_b = true;
    gemm_backward(dout.t, a.t, b.t, da.t, Tensor(), Tensor(), args, false, true);
    std::vector<double> ga, gb, gbias;
    ref_gemm_backward(d, dout.v, a.v, b.v, ga, gb, gbias);
    check_out(case_name(dev, DType::F32, "gemm_backward da only"), da, ga, {1e-5, 1e-5, 0});
  }
}

TEST_CASE("gemm: invalid arguments throw naming the op") {
  const Tensor a = Tensor::zeros({4, 5}, DType::F32), b = Tensor::zeros({5, 6}, DType::F32);
  const Tensor out = Tensor::zeros({4, 6}, DType::F32);
  check_throws_naming("gemm", [&] { gemm(a, Tensor::zeros({4, 6}, DType::F32), out); }, "inner dim mismatch");
  check_throws_naming("gemm", [&] { gemm(a, Tensor::zeros({5, 6}, DType::BF16), out); }, "a/b dtypes differ");
  check_throws_naming("gemm", [&] { gemm(a, b, Tensor::zeros({4, 7}, DType::F32)); }, "out shape");
  check_throws_naming("gemm", [&] { gemm(a, b, Tensor::zeros({4, 6}, DType::I32)); }, "int out");
  check_throws_naming("gemm", [&] { gemm(a, b, out, {}, Tensor::zeros({6}, DType::BF16)); }, "bias dtype");
  check_throws_naming("gemm", [&] { gemm(a, b, out, {}, Tensor::zeros({7}, DType::F32)); }, "bias shape");
  check_throws_naming("gemm", [&] { gemm(Tensor::zeros({5, 4}, DType::F32).transpose(0, 1), b, out); },
                      "non-contiguous a");
  check_throws_naming("gemm", [&] {
    gemm(Tensor::zeros({2, 4, 5}, DType::F32), Tensor::zeros({3, 5, 6}, DType::F32), Tensor::zeros({3, 4, 6}, DType::F32));
  }, "batch mismatch");
  check_throws_naming("gemm_backward", [&] {
    gemm_backward(Tensor::zeros({4, 6}, DType::F32), a, b, Tensor::zeros({4, 4}, DType::F32), Tensor(), Tensor());
  }, "da shape");
  check_throws_naming("gemm_backward", [&] {
    gemm_backward(Tensor::zeros({4, 7}, DType::F32), a, b, Tensor(), Tensor(), Tensor());
  }, "dout shape");
}

TEST_CASE("gemm forward: K = 0 gives beta * out + bias (no GEMM: the bias kernel alone)") {
  uint64_t seed = 900;
  for (Device dev : test_devices())
    for (DType dt : float_dtypes()) {
      run_forward(dev, dt, dt, {1, false, false, 5, 7, 0, false, false}, 1.0f, 0.5f, true, ++seed);
      run_forward(dev, dt, dt, {1, false, false, 5, 7, 0, true, true}, 1.0f, 0.0f, true, ++seed);
      run_forward(dev, dt, dt, {2, true, false, 3, 4, 0, false, false}, 1.0f, 1.0f, false, ++seed);
    }
}
