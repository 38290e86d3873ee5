// tests/tensor/test_grouped_gemm.cpp — grouped_gemm / grouped_gemm_backward (tensor/grouped_gemm.h)
// against float64 references written here, on every backend and float dtype.
//
// Cases: groups of 0 rows first, in the middle and last; one group; 8 and 64 groups with
// uneven counts; an odd K and M (no 16-byte row strides: the per-group path on CUDA);
// with and without bias; weights in separate allocations and weights that are slices of
// one stacked (G, M, K) buffer; dx overwritten (poisoned before), dw and dbias accumulated
// onto nonzero values, in f32 and in the inputs' dtype; dx undefined and dw/dbias empty or
// with a hole (a frozen expert). On CUDA the path taken is asserted (check_path): the one
// cublasGemmGroupedBatchedEx call where grouped_gemm.h says it applies, a gemm per group
// otherwise.
//
// Tolerances (the gemm row of op_harness.h): |got − ref| ≤ rtol(out dtype)·|ref| + 1e-6
//   + 2·L·2^-24·(Σ_l |a_l·b_l| + |added|)
// rtol: the out dtype's one output rounding (bf16 2^-9, f16 2^-11, with the harness's slack;
// f32 1e-5); the last term is the γ_L bound of L products summed in f32 (L = K for y, M for
// dx, the group's rows for dw and dbias), plus the bias or the old dw/dbias value added in
// f32 before the one rounding. The inputs are exact in f32 (16-bit values widened), so
// nothing else errs.
#include <array>
#include <numeric>

#include "tests/tensor/op_harness.h"

using namespace mpitron;
using namespace mpitron::test;

namespace {

constexpr double kU = 1.0 / 16777216.0;  // 2^-24, f32 unit roundoff

Tol out_tol(DType dt) { return {tol(dt, Kind::Pointwise).rtol, 1e-6, 0}; }

struct Case {
  std::vector<int64_t> counts;
  int64_t M, K;
  bool bias, stacked;  // bias per group; w[g] slices of one (G, M, K) buffer
  bool dw_f32;         // dw / dbias in f32 (else the inputs' dtype)
  bool frozen;         // dw[1] and dbias[1] undefined (when G > 1)
};

std::string describe(const Case& c) {
  std::string cs;
  for (size_t g = 0; g < c.counts.size() && g < 10; ++g) cs += str(g ? "," : "", c.counts[g]);
  if (c.counts.size() > 10) cs += ",…";
  return str("G=", c.counts.size(), " counts {", cs, "} M=", c.M, " K=", c.K, c.bias ? " bias" : "",
             c.stacked ? " stacked w" : " separate w", c.dw_f32 ? " dw f32" : " dw in dtype", c.frozen ? " frozen[1]" : "");
}

// ref[r, j] = Σ_l A(r, l)·B(j, l) (+ add[j]) for r < rows, j < cols; bound[r, j] the γ_L term.
void ref_rows(int64_t rows, int64_t cols, int64_t L, const std::function<double(int64_t, int64_t)>& A,
              const std::function<double(int64_t, int64_t)>& B, const std::vector<double>* add,
              std::vector<double>& ref, std::vector<double>& bound) {
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t j = 0; j < cols; ++j) {
      double acc = 0, mag = 0;
      for (int64_t l = 0; l < L; ++l) {
        const double p = A(r, l) * B(j, l);
        acc += p;
        mag += std::fabs(p);
      }
      if (add) acc += (*add)[static_cast<size_t>(j)], mag += std::fabs((*add)[static_cast<size_t>(j)]);
      ref.push_back(acc);
      bound.push_back(2.0 * static_cast<double>(L + 1) * kU * mag);
    }
}

void run(Device dev, DType dt, const Case& c, uint64_t seed) {
  Rng rng(seed);
  const std::string name = case_name(dev, dt, "grouped_gemm " + describe(c));
  const int64_t G = static_cast<int64_t>(c.counts.size()), M = c.M, K = c.K;
  const int64_t R = std::accumulate(c.counts.begin(), c.counts.end(), int64_t{0});
  std::vector<int64_t> off(static_cast<size_t>(G) + 1, 0);
  for (int64_t g = 0; g < G; ++g) off[static_cast<size_t>(g) + 1] = off[static_cast<size_t>(g)] + c.counts[static_cast<size_t>(g)];

  const Input x = rand_input(rng, {R, K}, dt, dev, -1, 1), dy = rand_input(rng, {R, M}, dt, dev, -1, 1);
  std::vector<Tensor> w, bias;
  std::vector<std::vector<double>> wv, bv;  // wv[g] (M, K), bv[g] (M)
  if (c.stacked) {  // w[g] views into one buffer (kept alive by the views)
    const Input s = rand_input(rng, {G, M, K}, dt, dev, -1, 1);
    for (int64_t g = 0; g < G; ++g) {
      w.push_back(s.t.select(0, g));
      wv.emplace_back(s.v.begin() + g * M * K, s.v.begin() + (g + 1) * M * K);
    }
  } else {
    for (int64_t g = 0; g < G; ++g) {
      Input in = rand_input(rng, {M, K}, dt, dev, -1, 1);  // each its own allocation
      w.push_back(in.t);
      wv.push_back(std::move(in.v));
    }
  }
  if (c.bias)
    for (int64_t g = 0; g < G; ++g) {
      Input in = rand_input(rng, {M}, dt, dev, -1, 1);
      bias.push_back(in.t);
      bv.push_back(std::move(in.v));
    }
  const auto W = [&](int64_t g, int64_t m, int64_t k) { return wv[static_cast<size_t>(g)][static_cast<size_t>(m * K + k)]; };
  const size_t es = dtype_size(dt);
  const bool strides16 = (K * static_cast<int64_t>(es)) % 16 == 0 && (M * static_cast<int64_t>(es)) % 16 == 0;

  // ---- forward: y rows g = x rows g · w[g]ᵀ (+ bias[g]) ----
  {
    std::vector<double> ref, bound;
    for (int64_t g = 0; g < G; ++g) {
      const int64_t o = off[static_cast<size_t>(g)];
      ref_rows(c.counts[static_cast<size_t>(g)], M, K, [&](int64_t r, int64_t l) { return x.v[static_cast<size_t>((o + r) * K + l)]; },
               [&](int64_t j, int64_t l) { return W(g, j, l); }, c.bias ? &bv[static_cast<size_t>(g)] : nullptr, ref, bound);
    }
    Out y = make_out({R, M}, dt, dev);
    const PathProbe probe;
    grouped_gemm(x.t, w, c.counts, y.t, bias);
    check_out(name + " y", y, ref, out_tol(dt), &bound);
    if (R > 0 && M > 0)
      check_path(dev, probe, !c.bias && strides16 && outputs_aligned() ? "grouped_gemm.grouped" : "grouped_gemm.per_group",
                 name + " y");
  }

  // ---- backward: dx overwritten, dw / dbias accumulated onto their old values ----
  const DType gdt = c.dw_f32 ? DType::F32 : dt;
  std::vector<Out> dwo, dbo;
  std::vector<std::vector<double>> dw0, db0;
  std::vector<Tensor> dw, db;
  for (int64_t g = 0; g < G; ++g) {
    std::vector<double> a(static_cast<size_t>(M * K)), b(static_cast<size_t>(M));
    for (auto& v : a) v = round_to(gdt, rng.uniform(-1, 1));
    for (auto& v : b) v = round_to(gdt, rng.uniform(-1, 1));
    dwo.push_back(make_out({M, K}, gdt, dev, &a));
    dbo.push_back(make_out({M}, gdt, dev, &b));
    const bool hole = c.frozen && g == 1;
    dw.push_back(hole ? Tensor() : dwo.back().t);
    db.push_back(hole ? Tensor() : dbo.back().t);
    dw0.push_back(std::move(a));
    db0.push_back(std::move(b));
  }
  Out dx = make_out({R, K}, dt, dev);
  const PathProbe probe;
  grouped_gemm_backward(dy.t, x.t, w, c.counts, dx.t, dw, db);

  // dx rows g (c_g, K) = dy rows g · w[g]
  std::vector<double> rdx, bdx;
  for (int64_t g = 0; g < G; ++g) {
    const int64_t o = off[static_cast<size_t>(g)];
    ref_rows(c.counts[static_cast<size_t>(g)], K, M, [&](int64_t r, int64_t l) { return dy.v[static_cast<size_t>((o + r) * M + l)]; },
             [&](int64_t j, int64_t l) { return W(g, l, j); }, nullptr, rdx, bdx);
  }
  check_out(name + " dx", dx, rdx, out_tol(dt), &bdx);
  for (int64_t g = 0; g < G; ++g) {
    const int64_t o = off[static_cast<size_t>(g)], cg = c.counts[static_cast<size_t>(g)];
    const std::string gn = str(name, " group ", g, " (", cg, " rows)");
    if (c.frozen && g == 1) {  // not passed: its buffers keep their old values
      check_close(gn + " frozen dw untouched", dwo[1].t, dw0[1], {0, 0, 0});
      check_close(gn + " frozen dbias untouched", dbo[1].t, db0[1], {0, 0, 0});
      continue;
    }
    // dw[g] (M, K) = old + Σ_r dy[r, m]·x[r, k]: row m, column k, L = c_g
    std::vector<double> rdw, bdw;
    for (int64_t m = 0; m < M; ++m) {
      std::vector<double> add(static_cast<size_t>(K));
      for (int64_t k = 0; k < K; ++k) add[static_cast<size_t>(k)] = dw0[static_cast<size_t>(g)][static_cast<size_t>(m * K + k)];
      ref_rows(1, K, cg, [&](int64_t, int64_t l) { return dy.v[static_cast<size_t>((o + l) * M + m)]; },
               [&](int64_t k, int64_t l) { return x.v[static_cast<size_t>((o + l) * K + k)]; }, &add, rdw, bdw);
    }
    check_out(gn + " dw", dwo[static_cast<size_t>(g)], rdw, out_tol(gdt), &bdw);
    std::vector<double> rdb, bdb;
    ref_rows(1, M, cg, [&](int64_t, int64_t) { return 1.0; },
             [&](int64_t m, int64_t l) { return dy.v[static_cast<size_t>((o + l) * M + m)]; }, &db0[static_cast<size_t>(g)],
             rdb, bdb);
    check_out(gn + " dbias", dbo[static_cast<size_t>(g)], rdb, out_tol(gdt), &bdb);
  }
  if (R > 0 && M > 0 && K > 0) {
    const bool grouped_ok = strides16 && outputs_aligned();
    check_path(dev, probe, grouped_ok ? "grouped_gemm_dx.grouped" : "grouped_gemm_dx.per_group", name + " dx");
    check_path(dev, probe, grouped_ok && gdt == dt ? "grouped_gemm_dw.grouped" : "grouped_gemm_dw.per_group",
               name + " dw");
  }
}

std::vector<Case> cases() {
  std::vector<Case> v = {
      {{0, 5, 0, 3, 0}, 16, 24, false, false, false, false},  // empty groups first, middle, last
      {{0, 5, 0, 3, 0}, 16, 24, true, true, true, false},
      {{7}, 8, 16, false, true, false, false},  // one group
      {{7}, 8, 16, true, false, true, false},
      {{3, 0, 9, 1, 12, 5, 0, 2}, 24, 32, false, true, false, true},  // 8 uneven groups, a frozen expert
      {{3, 0, 9, 1, 12, 5, 0, 2}, 24, 32, true, false, true, false},
      {{4, 6, 3}, 5, 7, false, false, false, false},  // odd M and K: no 16-byte row strides
      {{4, 6, 3}, 5, 7, true, true, true, true},
  };
  Rng rng(4242);  // 64 groups: 0-4 rows each, about a quarter empty
  Case big{{}, 8, 16, false, false, false, false};
  for (int g = 0; g < 64; ++g) big.counts.push_back(rng.uniform(0, 1) < 0.25 ? 0 : rng.randint(1, 4));
  v.push_back(big);
  big.bias = true, big.stacked = true, big.dw_f32 = true;
  v.push_back(big);
  return v;
}

}  // namespace

TEST_CASE("grouped_gemm: y, dx, dw, dbias per group against float64, every dtype and backend") {
  uint64_t seed = 7100;
  for (Device dev : test_devices())
    for (DType dt : float_dtypes())
      for (const Case& c : cases()) run(dev, dt, c, ++seed);
}

TEST_CASE("grouped_gemm_backward: dx undefined and empty dw / dbias are skipped") {
  for (Device dev : test_devices()) {
    Rng rng(77);
    const std::vector<int64_t> counts{2, 0, 3};
    const Input x = rand_input(rng, {5, 8}, DType::F32, dev, -1, 1), dy = rand_input(rng, {5, 4}, DType::F32, dev, -1, 1);
    std::vector<Tensor> w;
    for (int g = 0; g < 3; ++g) w.push_back(rand_input(rng, {4, 8}, DType::F32, dev, -1, 1).t);
    Out dx = make_out({5, 8}, DType::F32, dev);
    grouped_gemm_backward(dy.t, x.t, w, counts, dx.t, {}, {});  // dx only
    CHECK_MESSAGE((dx.unwritten() == 0 && dx.guards_ok()), case_name(dev, DType::F32, "dx only"));
    std::vector<double> zeros(4, 0.0);
    std::vector<Out> db;
    std::vector<Tensor> dbt;
    for (int g = 0; g < 3; ++g) db.push_back(make_out({4}, DType::F32, dev, &zeros)), dbt.push_back(db.back().t);
    grouped_gemm_backward(dy.t, x.t, w, counts, Tensor(), {}, dbt);  // dbias only
    for (int g = 0; g < 3; ++g) {
      std::vector<double> want(4, 0.0);
      const int64_t o = g == 0 ? 0 : 2, n = counts[static_cast<size_t>(g)];
      for (int64_t r = o; r < o + n; ++r)
        for (int m = 0; m < 4; ++m) want[static_cast<size_t>(m)] += dy.v[static_cast<size_t>(r * 4 + m)];
      check_out(case_name(dev, DType::F32, str("dbias only, group ", g)), db[static_cast<size_t>(g)], want, {1e-6, 1e-6, 0});
    }
  }
}

TEST_CASE("grouped_gemm: bad arguments are refused naming the op") {
  const auto z = [](const Shape& s, DType t = DType::F32) { return Tensor::zeros(s, t); };
  const Tensor x = z({5, 4}), y = z({5, 3}), dy = z({5, 3});
  const std::vector<Tensor> w{z({3, 4}), z({3, 4})};
  const std::vector<int64_t> counts{2, 3};
  check_throws_naming("grouped_gemm", [&] { grouped_gemm(x, w, {2, 2}, y); }, "counts summing to 4 rows, x has 5");
  check_throws_naming("grouped_gemm", [&] { grouped_gemm(x, w, {5}, y); }, "one count for two weights");
  check_throws_naming("grouped_gemm", [&] { grouped_gemm(x, w, {6, -1}, y); }, "a negative count");
  check_throws_naming("grouped_gemm", [&] { grouped_gemm(x, {z({3, 4}), z({2, 4})}, counts, y); }, "w[1] of another M");
  check_throws_naming("grouped_gemm", [&] { grouped_gemm(x, {z({3, 4}), z({3, 5})}, counts, y); }, "w[1] of another K");
  check_throws_naming("grouped_gemm", [&] { grouped_gemm(x, {z({3, 4}), z({3, 4}, DType::BF16)}, counts, y); },
                      "w[1] of another dtype");
  check_throws_naming("grouped_gemm", [&] { grouped_gemm(x, {z({3, 4}), Tensor()}, counts, y); }, "w[1] undefined");
  check_throws_naming("grouped_gemm", [&] { grouped_gemm(x, {z({3, 4}), z({4, 3}).transpose(0, 1)}, counts, y); },
                      "w[1] transposed (not contiguous)");
  check_throws_naming("grouped_gemm", [&] { grouped_gemm(x, w, counts, z({5, 4})); }, "y of the wrong shape");
  check_throws_naming("grouped_gemm", [&] { grouped_gemm(x, w, counts, z({5, 3}, DType::BF16)); }, "y of another dtype");
  check_throws_naming("grouped_gemm", [&] { grouped_gemm(x, w, counts, y, {z({3})}); }, "one bias for two groups");
  check_throws_naming("grouped_gemm", [&] { grouped_gemm(x, w, counts, y, {z({3}), z({4})}); }, "bias[1] of the wrong size");
  check_throws_naming("grouped_gemm", [&] { grouped_gemm(x, w, counts, y, {z({3}), z({3}, DType::F16)}); },
                      "bias[1] of another dtype");
  check_throws_naming("grouped_gemm", [&] { grouped_gemm(z({5, 4}, DType::I32), w, counts, y); }, "integer x");
  const char* bw = "grouped_gemm_backward";
  const Tensor dx = z({5, 4});
  check_throws_naming(bw, [&] { grouped_gemm_backward(dy, x, w, {1, 3}, dx, {}, {}); }, "counts summing to 4");
  check_throws_naming(bw, [&] { grouped_gemm_backward(dy, x, w, {5}, dx, {}, {}); }, "one count for two weights");
  check_throws_naming(bw, [&] { grouped_gemm_backward(z({5, 2}), x, w, counts, dx, {}, {}); }, "dy of the wrong shape");
  check_throws_naming(bw, [&] { grouped_gemm_backward(dy, x, w, counts, z({5, 3}), {}, {}); }, "dx of the wrong shape");
  check_throws_naming(bw, [&] { grouped_gemm_backward(dy, x, w, counts, dx, {z({3, 4})}, {}); }, "one dw for two groups");
  check_throws_naming(bw, [&] { grouped_gemm_backward(dy, x, w, counts, dx, {z({3, 4}), z({4, 3})}, {}); },
                      "dw[1] of the wrong shape");
  check_throws_naming(bw, [&] { grouped_gemm_backward(dy, x, w, counts, dx, {z({3, 4}), z({3, 4}, DType::F16)}, {}); },
                      "dw[1] f16 for f32 weights");
  check_throws_naming(bw, [&] { grouped_gemm_backward(dy, x, w, counts, dx, {}, {z({3}), z({2})}); },
                      "dbias[1] of the wrong size");
  check_throws_naming(bw, [&] { grouped_gemm_backward(dy, x, w, counts, dx, {}, {z({3}), z({3}), z({3})}); },
                      "three dbias for two groups");
}
