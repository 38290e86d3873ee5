// tests/tensor/test_cross_entropy_vp.cpp — vocab-parallel cross-entropy phases.
//
// cross_entropy_local_stats (phase 1) and cross_entropy_grad_from_lse (phase 2) on a
// column slice [vocab_start, vocab_start + Vl) of the vocabulary with global targets.
// References (float64, written here):
//   phase 1: lse_n = logsumexp over the slice's columns (every row, ignored ones too),
//            target_logit_n = logits[n, t_n − vocab_start] when in the slice, else 0;
//   composition: the full (N, V) logits split into 2 and 3 column slices, stats per
//            slice, the slices' lse combined on the host (stable log-sum-exp),
//            loss_n = lse_n − Σ target_logit_n, compared with the float64 loss and with
//            softmax_cross_entropy on the unsplit logits; phase 2 per slice with that
//            global lse, concatenated, compared with float64 scale·(softmax − onehot) and
//            with softmax_cross_entropy's dlogits; separate output and in place.
#include "tests/tensor/op_harness.h"

using namespace mpitron;
using namespace mpitron::test;

namespace {

// float64 logsumexp of each row of an (n, v) matrix (−inf for v = 0).
std::vector<double> ref_lse(const std::vector<double>& x, int64_t n, int64_t v) {
  std::vector<double> l(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    const double* r = &x[static_cast<size_t>(i * v)];
    double mx = -INFINITY, s = 0;
    for (int64_t j = 0; j < v; ++j) mx = std::max(mx, r[j]);
    for (int64_t j = 0; j < v; ++j) s += std::exp(r[j] - mx);
    l[i] = v > 0 ? mx + std::log(s) : -INFINITY;
  }
  return l;
}

// Columns [c0, c1) of an (n, v) matrix, as an (n, c1 − c0) matrix.
std::vector<double> columns(const std::vector<double>& x, int64_t n, int64_t v, int64_t c0, int64_t c1) {
  std::vector<double> out;
  out.reserve(static_cast<size_t>(n * (c1 - c0)));
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = c0; j < c1; ++j) out.push_back(x[static_cast<size_t>(i * v + j)]);
  return out;
}

// ---- phase 1 on one slice -------------------------------------------------------------------
// The slice holds columns [start, start + vl) of a vocabulary of start + vl + after columns.
void run_stats(Device dev, DType dt, DType tg_dt, int64_t n, int64_t vl, int64_t start, int64_t after,
               uint64_t seed) {
  Rng rng(seed);
  const int64_t vocab = start + vl + after;
  const Input logits = rand_input(rng, {n, vl}, dt, dev, -4, 4);
  std::vector<int64_t> tg(static_cast<size_t>(n));
  for (size_t i = 0; i < tg.size(); ++i) {
    const double u = rng.uniform(0, 1);
    if (i == 0) tg[i] = start + rng.randint(0, vl - 1);  // at least one in the slice
    else if (u < 0.2) tg[i] = rng.uniform(0, 1) < 0.5 ? -1 : -100;  // ignored
    else if (u < 0.6) tg[i] = start + rng.randint(0, vl - 1);       // in this slice
    else tg[i] = rng.randint(0, vocab - 1);                         // anywhere (often another slice)
  }
  if (n > 1) tg[static_cast<size_t>(n - 1)] = -1;  // at least one ignored row when there is room
  if (n > 2) tg[1] = start > 0 ? start - 1 : start + vl;  // just outside the slice (left or right edge)
  if (n > 3) tg[2] = start + vl - 1;                      // the slice's last column
  const Tensor targets = make_ints(tg, {n}, tg_dt, dev);
  Out lse = make_out({n}, DType::F32, dev), tl = make_out({n}, DType::F32, dev);
  const std::string name = case_name(dev, dt, str("cross_entropy_local_stats N=", n, " Vl=", vl, " start=", start,
                                                  " targets=", dtype_name(tg_dt)));
  cross_entropy_local_stats(logits.t, targets, start, lse.t, tl.t);

  const std::vector<double> lref = ref_lse(logits.v, n, vl);
  std::vector<double> tref(static_cast<size_t>(n), 0.0);
  for (int64_t i = 0; i < n; ++i) {
    const int64_t local = tg[i] - start;
    if (tg[i] >= 0 && local >= 0 && local < vl) tref[i] = logits.v[static_cast<size_t>(i * vl + local)];
  }
  // lse is an f32 reduction of rounded inputs (computed in f32 whatever the dtype).
  check_out(name + " lse", lse, lref, tol(DType::F32, Kind::Reduction));
  // The target logit is a copy: exact.
  check_out(name + " target_logit", tl, tref, {0, 0, 0});
  check_close(name + " logits unchanged", logits.t, logits.v, {0, 0, 0});
}

// ---- the composition over P column slices ----------------------------------------------------
enum class Mode { Separate, InPlace };

void run_split(Device dev, DType dt, DType tg_dt, int64_t n, int64_t v, int parts, Mode mode, uint64_t seed) {
  REQUIRE(v % parts == 0);
  Rng rng(seed);
  const Input full = rand_input(rng, {n, v}, dt, dev, -4, 4);
  std::vector<int64_t> tg(static_cast<size_t>(n));
  int64_t valid = 0;
  for (auto& t : tg) {
    t = rng.randint(0, v - 1);
    if (n > 2 && rng.uniform(0, 1) < 0.25) t = -1;  // ignored positions
    valid += t >= 0;
  }
  const float scale = 1.0f / static_cast<float>(std::max<int64_t>(valid, 1));
  const Tensor targets = make_ints(tg, {n}, tg_dt, dev);
  const int64_t vl = v / parts;
  const std::string name =
      case_name(dev, dt, str("vocab-parallel cross-entropy N=", n, " V=", v, " slices=", parts, " targets=",
                             dtype_name(tg_dt), mode == Mode::InPlace ? " in-place" : ""));

  // Phase 1 per slice; combine on the host.
  std::vector<std::vector<double>> slice_vals(static_cast<size_t>(parts));
  std::vector<std::vector<double>> slice_lse(static_cast<size_t>(parts)), slice_tl(static_cast<size_t>(parts));
  std::vector<Tensor> slice_t(static_cast<size_t>(parts));
  for (int p = 0; p < parts; ++p) {
    slice_vals[p] = columns(full.v, n, v, p * vl, (p + 1) * vl);
    slice_t[p] = make_tensor(slice_vals[p], {n, vl}, dt, dev);  // exact: values already rounded to dt
    Out lse = make_out({n}, DType::F32, dev), tl = make_out({n}, DType::F32, dev);
    cross_entropy_local_stats(slice_t[p], targets, p * vl, lse.t, tl.t);
    CHECK_MESSAGE(lse.guards_ok(), name << " slice " << p << " lse: write outside the output");
    CHECK_MESSAGE(tl.guards_ok(), name << " slice " << p << " target_logit: write outside the output");
    CHECK_MESSAGE(lse.unwritten() == 0, name << " slice " << p << " lse: unwritten elements");
    CHECK_MESSAGE(tl.unwritten() == 0, name << " slice " << p << " target_logit: unwritten elements");
    slice_lse[p] = values(lse.t);
    slice_tl[p] = values(tl.t);
  }
  std::vector<double> glse(static_cast<size_t>(n)), loss(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    double mx = -INFINITY, s = 0, t = 0;
    for (int p = 0; p < parts; ++p) mx = std::max(mx, slice_lse[p][i]);
    for (int p = 0; p < parts; ++p) s += std::exp(slice_lse[p][i] - mx);
    for (int p = 0; p < parts; ++p) t += slice_tl[p][i];
    glse[i] = mx + std::log(s);
    loss[i] = tg[i] >= 0 ? glse[i] - t : 0.0;
  }

  // References: float64 on the full matrix, and the fused op on the unsplit logits.
  const std::vector<double> lse_full = ref_lse(full.v, n, v);
  std::vector<double> lref(static_cast<size_t>(n), 0.0), gref(full.v.size(), 0.0);
  for (int64_t i = 0; i < n; ++i) {
    if (tg[i] < 0) continue;
    lref[i] = lse_full[i] - full.v[static_cast<size_t>(i * v + tg[i])];
    for (int64_t j = 0; j < v; ++j)
      gref[i * v + j] = scale * (std::exp(full.v[i * v + j] - lse_full[i]) - (j == tg[i] ? 1.0 : 0.0));
  }
  Out fused_loss = make_out({n}, DType::F32, dev), fused_dl = make_out({n, v}, dt, dev);
  softmax_cross_entropy(full.t, targets, fused_loss.t, fused_dl.t, scale);
  const std::vector<double> fused_lv = values(fused_loss.t);

  const Tol lt = tol(DType::F32, Kind::Reduction);
  check_close(name + " global lse vs float64", glse, lse_full, lt);
  check_close(name + " loss vs float64", loss, lref, lt);
  // Both sides carry f32 reduction error: twice the tolerance.
  check_close(name + " loss vs softmax_cross_entropy", loss, fused_lv, {2 * lt.rtol, 2 * lt.atol, 2 * lt.ntol});

  // Phase 2 per slice with the global lse (as the f32 the caller would hold), concatenated.
  std::vector<double> glse_f32(glse.size());
  for (size_t i = 0; i < glse.size(); ++i) glse_f32[i] = static_cast<float>(glse[i]);
  const Tensor lse_t = make_tensor(glse_f32, {n}, DType::F32, dev);
  std::vector<double> grad(full.v.size());
  for (int p = 0; p < parts; ++p) {
    std::vector<double> g;
    const std::string sname = str(name, " slice ", p);
    if (mode == Mode::Separate) {
      Out dl = make_out({n, vl}, dt, dev);
      cross_entropy_grad_from_lse(slice_t[p], targets, p * vl, lse_t, dl.t, scale);
      CHECK_MESSAGE(dl.guards_ok(), sname << " dlogits: write outside the output");
      CHECK_MESSAGE(dl.unwritten() == 0, sname << " dlogits: unwritten elements");
      check_close(sname + " logits unchanged", slice_t[p], slice_vals[p], {0, 0, 0});
      g = values(dl.t);
    } else {
      const Tensor lg = slice_t[p].clone();
      cross_entropy_grad_from_lse(lg, targets, p * vl, lse_t, lg, scale);
      g = values(lg);
    }
    for (int64_t i = 0; i < n; ++i)
      for (int64_t j = 0; j < vl; ++j) grad[i * v + p * vl + j] = g[i * vl + j];
  }
  const Tol gt = tol(dt, Kind::Reduction);
  check_close(name + " dlogits vs float64", grad, gref, gt);
  check_close(name + " dlogits vs softmax_cross_entropy", grad, values(fused_dl.t),
              {2 * gt.rtol, 2 * gt.atol, 2 * gt.ntol});
}

}  // namespace

TEST_CASE("cross_entropy_local_stats: slice lse and target logit, every dtype") {
  uint64_t seed = 7000;
  for (Device dev : test_devices())
    for (DType dt : float_dtypes()) {
      //                     N     Vl    start   after
      run_stats(dev, dt, DType::I32, 1, 1, 0, 0, ++seed);
      run_stats(dev, dt, DType::I64, 1, 13, 5, 7, ++seed);
      run_stats(dev, dt, DType::I64, 7, 13, 0, 26, ++seed);
      run_stats(dev, dt, DType::I32, 13, 37, 37, 37, ++seed);
      run_stats(dev, dt, DType::I64, 3, 127, 254, 0, ++seed);
      run_stats(dev, dt, DType::I32, 31, 1001, 2002, 3, ++seed);
      run_stats(dev, dt, DType::I64, 5, 64, 128, 64, ++seed);  // Vl a multiple of 8: vectorised path
      run_stats(dev, dt, DType::I32, 16, 25131, 25131, 0, ++seed);  // half of 50262, odd
      run_stats(dev, dt, DType::I64, 4, 16752, 16752, 16752, ++seed);
    }
}

TEST_CASE("vocab-parallel cross-entropy: 2 and 3 slices match the unsplit op and float64") {
  uint64_t seed = 7100;
  for (Device dev : test_devices())
    for (DType dt : float_dtypes())
      for (Mode mode : {Mode::Separate, Mode::InPlace})
        for (int parts : {2, 3}) {
          run_split(dev, dt, DType::I32, 1, 6, parts, mode, ++seed);
          run_split(dev, dt, DType::I64, 7, 78, parts, mode, ++seed);
          run_split(dev, dt, DType::I32, 13, 390, parts, mode, ++seed);
          run_split(dev, dt, DType::I64, 5, 4800, parts, mode, ++seed);  // slices of 2400 / 1600: multiples of 8
          run_split(dev, dt, DType::I32, 8, 50262, parts, mode, ++seed);  // slices of 25131 / 16754
        }
}

TEST_CASE("vocab-parallel cross-entropy: ignored rows get an lse, zero target logit and zero gradient") {
  for (Device dev : test_devices())
    for (DType dt : float_dtypes()) {
      Rng rng(7200);
      const int64_t n = 5, vl = 11, start = 22;
      const Input logits = rand_input(rng, {n, vl}, dt, dev, -3, 3);
      const Tensor targets = make_ints({-1, -1, -100, -1, -7}, {n}, DType::I64, dev);
      Out lse = make_out({n}, DType::F32, dev), tl = make_out({n}, DType::F32, dev);
      cross_entropy_local_stats(logits.t, targets, start, lse.t, tl.t);
      check_out(case_name(dev, dt, "all ignored lse"), lse, ref_lse(logits.v, n, vl), tol(DType::F32, Kind::Reduction));
      check_out(case_name(dev, dt, "all ignored target_logit"), tl, std::vector<double>(n, 0.0), {0, 0, 0});
      const Tensor glse = make_tensor(std::vector<double>(n, 7.5), {n}, DType::F32, dev);
      Out dl = make_out({n, vl}, dt, dev);
      cross_entropy_grad_from_lse(logits.t, targets, start, glse, dl.t, 0.5f);
      check_out(case_name(dev, dt, "all ignored dlogits"), dl, std::vector<double>(n * vl, 0.0), {0, 0, 0});
    }
}

TEST_CASE("vocab-parallel cross-entropy: N = 0 is a no-op") {
  for (Device dev : test_devices()) {
    const Tensor logits = Tensor::zeros({0, 9}, DType::F32).to(dev);
    const Tensor targets = make_ints({}, {0}, DType::I32, dev);
    const Tensor lse = Tensor::zeros({0}, DType::F32).to(dev), tl = Tensor::zeros({0}, DType::F32).to(dev);
    cross_entropy_local_stats(logits, targets, 9, lse, tl);
    cross_entropy_grad_from_lse(logits, targets, 9, lse, logits, 1.0f);
  }
}

TEST_CASE("vocab-parallel cross-entropy: invalid arguments throw naming the op") {
  const Tensor logits = Tensor::zeros({4, 6}, DType::F32), tg = Tensor::from_ints({0, 1, 2, 3}, {4});
  const Tensor lse = Tensor::zeros({4}, DType::F32), tl = Tensor::zeros({4}, DType::F32);
  {
    const char* op = "cross_entropy_local_stats";
    check_throws_naming(op, [&] { cross_entropy_local_stats(logits, Tensor::from_ints({0, 1, 2}, {3}), 0, lse, tl); }, "targets shape");
    check_throws_naming(op, [&] { cross_entropy_local_stats(logits, Tensor::zeros({4}, DType::F32), 0, lse, tl); }, "float targets");
    check_throws_naming(op, [&] { cross_entropy_local_stats(logits, tg, 0, Tensor::zeros({4}, DType::BF16), tl); }, "lse dtype");
    check_throws_naming(op, [&] { cross_entropy_local_stats(logits, tg, 0, Tensor::zeros({5}, DType::F32), tl); }, "lse shape");
    check_throws_naming(op, [&] { cross_entropy_local_stats(logits, tg, 0, lse, Tensor::zeros({4}, DType::F16)); }, "target_logit dtype");
    check_throws_naming(op, [&] { cross_entropy_local_stats(logits, tg, 0, lse, Tensor::zeros({4, 1}, DType::F32)); }, "target_logit shape");
    check_throws_naming(op, [&] { cross_entropy_local_stats(logits, tg, 0, lse, Tensor()); }, "target_logit undefined");
    check_throws_naming(op, [&] { cross_entropy_local_stats(logits, tg, -1, lse, tl); }, "negative vocab_start");
    check_throws_naming(op, [&] { cross_entropy_local_stats(Tensor::zeros({2, 2, 6}, DType::F32), tg, 0, lse, tl); }, "3-D logits");
    check_throws_naming(op, [&] { cross_entropy_local_stats(Tensor::zeros({4, 6}, DType::I32), tg, 0, lse, tl); }, "integer logits");
  }
  {
    const char* op = "cross_entropy_grad_from_lse";
    const Tensor dl = Tensor::zeros({4, 6}, DType::F32);
    check_throws_naming(op, [&] { cross_entropy_grad_from_lse(logits, Tensor::from_ints({0, 1, 2}, {3}), 0, lse, dl, 1); }, "targets shape");
    check_throws_naming(op, [&] { cross_entropy_grad_from_lse(logits, Tensor::zeros({4}, DType::F32), 0, lse, dl, 1); }, "float targets");
    check_throws_naming(op, [&] { cross_entropy_grad_from_lse(logits, tg, 0, Tensor::zeros({4}, DType::F16), dl, 1); }, "lse dtype");
    check_throws_naming(op, [&] { cross_entropy_grad_from_lse(logits, tg, 0, Tensor::zeros({3}, DType::F32), dl, 1); }, "lse shape");
    check_throws_naming(op, [&] { cross_entropy_grad_from_lse(logits, tg, 0, lse, Tensor::zeros({4, 6}, DType::BF16), 1); }, "dlogits dtype");
    check_throws_naming(op, [&] { cross_entropy_grad_from_lse(logits, tg, 0, lse, Tensor::zeros({4, 5}, DType::F32), 1); }, "dlogits shape");
    check_throws_naming(op, [&] { cross_entropy_grad_from_lse(logits, tg, 0, lse, Tensor(), 1); }, "dlogits undefined");
    check_throws_naming(op, [&] { cross_entropy_grad_from_lse(logits, tg, -3, lse, dl, 1); }, "negative vocab_start");
    check_throws_naming(op, [&] { cross_entropy_grad_from_lse(Tensor::zeros({2, 2, 6}, DType::F32), tg, 0, lse, dl, 1); }, "3-D logits");
  }
}
