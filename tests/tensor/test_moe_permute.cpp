// tests/tensor/test_moe_permute.cpp — MoE token permutation (tensor/moe_permute.h,
// autograd/moe.h) against float64 references written here from the documented math:
//  - moe_routing is a stable sort of the flat (n, j) choices by expert (computed here
//    independently), counts per expert, capacity dropping the later choices of a full
//    expert;
//  - permute, unpermute and both backwards (dprobs included) within the dtype's
//    tolerance of float64, every output element written, no write outside;
//  - with probabilities 1/k (k = 1, 2, 4) unpermute(permute(x)) is x bit for bit, and
//    the gradient through both is the incoming one bit for bit (issue #28's first test);
//  - the tape's nodes give the same gradients as the kernels' reference; bad arguments
//    are refused naming the op.
#include <array>

#include "autograd/moe.h"
#include "tests/tensor/op_harness.h"

using namespace mpitron;
using namespace mpitron::test;

namespace {

// k distinct experts per token, uniformly.
std::vector<int64_t> random_choices(Rng& rng, int64_t N, int64_t k, int64_t E) {
  std::vector<int64_t> idx;
  for (int64_t n = 0; n < N; ++n) {
    std::vector<int64_t> experts(static_cast<size_t>(E));
    for (int64_t e = 0; e < E; ++e) experts[static_cast<size_t>(e)] = e;
    for (int64_t j = 0; j < k; ++j) {
      const int64_t pick = rng.randint(j, E - 1);
      std::swap(experts[static_cast<size_t>(j)], experts[static_cast<size_t>(pick)]);
      idx.push_back(experts[static_cast<size_t>(j)]);
    }
  }
  return idx;
}

// The reference permutation: experts in order, each expert's choices in flat order,
// at most `cap` per expert (0: all).
std::vector<int32_t> ref_dest(const std::vector<int64_t>& idx, int64_t E, int64_t cap, std::vector<int64_t>& counts) {
  std::vector<int32_t> dest(idx.size(), -1);
  counts.assign(static_cast<size_t>(E), 0);
  int32_t row = 0;
  for (int64_t e = 0; e < E; ++e)
    for (size_t i = 0; i < idx.size(); ++i)
      if (idx[i] == e && (cap == 0 || counts[static_cast<size_t>(e)] < cap)) {
        dest[i] = row++;
        ++counts[static_cast<size_t>(e)];
      }
  return dest;
}

std::vector<double> probs_of(Rng& rng, int64_t N, int64_t k) {
  std::vector<double> p(static_cast<size_t>(N * k));
  for (auto& x : p) x = static_cast<float>(rng.uniform(0.05, 1.0));
  return p;
}

Tensor dest_tensor(const std::vector<int32_t>& d, Device dev) {
  return make_ints(std::vector<int64_t>(d.begin(), d.end()), {static_cast<int64_t>(d.size())}, DType::I32, dev);
}

void run(Device dev, DType dt, int64_t N, int64_t k, int64_t C, int64_t E, int64_t cap, uint64_t seed) {
  Rng rng(seed);
  const std::string name = case_name(dev, dt, str("moe N=", N, " k=", k, " C=", C, " E=", E, " cap=", cap));
  const std::vector<int64_t> idx = random_choices(rng, N, k, E);
  std::vector<int64_t> counts;
  const std::vector<int32_t> want = ref_dest(idx, E, cap, counts);
  const MoeRouting r = moe_routing(make_ints(idx, {N, k}, DType::I64, dev), E, cap);
  CHECK_MESSAGE(r.dest == want, name << ": routing differs from the stable sort by expert");
  CHECK_MESSAGE(r.counts == counts, name << ": counts per expert");
  const int64_t R = r.rows();
  const Tensor dest = dest_tensor(r.dest, dev);
  const Input x = rand_input(rng, {N, C}, dt, dev, -2, 2);
  const std::vector<double> p = probs_of(rng, N, k);
  const Tensor probs = make_tensor(p, {N, k}, DType::F32, dev);

  // permute and its backward
  std::vector<double> ref_perm(static_cast<size_t>(R * C));
  for (int64_t i = 0; i < N * k; ++i)
    if (want[i] >= 0)
      for (int64_t c = 0; c < C; ++c) ref_perm[static_cast<size_t>(want[i] * C + c)] = x.v[static_cast<size_t>(i / k * C + c)];
  Out perm = make_out({R, C}, dt, dev);
  moe_permute(x.t, dest, perm.t);
  check_out(name + " permute", perm, ref_perm, {0, 0, 0});
  const Input dperm = rand_input(rng, {R, C}, dt, dev, -1, 1);
  std::vector<double> ref_dx(static_cast<size_t>(N * C), 0.0);
  for (int64_t i = 0; i < N * k; ++i)
    if (want[i] >= 0)
      for (int64_t c = 0; c < C; ++c)
        ref_dx[static_cast<size_t>(i / k * C + c)] += dperm.v[static_cast<size_t>(want[i] * C + c)];
  Out dx = make_out({N, C}, dt, dev);
  moe_permute_backward(dperm.t, dest, dx.t);
  check_out(name + " permute backward", dx, ref_dx, tol(dt, Kind::Reduction));

  // unpermute and its backward (in: the experts' outputs, R rows)
  const Input in = rand_input(rng, {R, C}, dt, dev, -2, 2);
  std::vector<double> ref_y(static_cast<size_t>(N * C), 0.0);
  for (int64_t i = 0; i < N * k; ++i)
    if (want[i] >= 0)
      for (int64_t c = 0; c < C; ++c)
        ref_y[static_cast<size_t>(i / k * C + c)] += p[static_cast<size_t>(i)] * in.v[static_cast<size_t>(want[i] * C + c)];
  Out y = make_out({N, C}, dt, dev);
  moe_unpermute(in.t, dest, probs, y.t);
  check_out(name + " unpermute", y, ref_y, tol(dt, Kind::Reduction));
  const Input dy = rand_input(rng, {N, C}, dt, dev, -1, 1);
  std::vector<double> ref_din(static_cast<size_t>(R * C)), ref_dp(static_cast<size_t>(N * k), 0.0);
  for (int64_t i = 0; i < N * k; ++i) {
    if (want[i] < 0) continue;
    for (int64_t c = 0; c < C; ++c) {
      const double g = dy.v[static_cast<size_t>(i / k * C + c)];
      ref_din[static_cast<size_t>(want[i] * C + c)] = round_to(dt, p[static_cast<size_t>(i)] * g);
      ref_dp[static_cast<size_t>(i)] += g * in.v[static_cast<size_t>(want[i] * C + c)];
    }
  }
  Out din = make_out({R, C}, dt, dev), dp = make_out({N, k}, DType::F32, dev);
  moe_unpermute_backward(dy.t, in.t, dest, probs, din.t, dp.t);
  check_out(name + " unpermute backward din", din, ref_din, tol(dt, Kind::Pointwise));
  // dprobs: a sum over C products of dtype-rounded inputs, accumulated in f32.
  check_out(name + " unpermute backward dprobs", dp, ref_dp, tol(DType::F32, Kind::Reduction));
}

}  // namespace

TEST_CASE("moe: routing, permute, unpermute and their backwards against float64") {
  uint64_t seed = 9100;
  for (Device dev : test_devices())
    for (DType dt : float_dtypes())
      for (const auto& [N, k, C, E] : std::vector<std::array<int64_t, 4>>{
               {1, 1, 8, 1}, {7, 2, 16, 4}, {33, 2, 40, 8}, {64, 4, 24, 8}, {50, 3, 13, 5}, {5, 2, 8, 16}}) {
        run(dev, dt, N, k, C, E, 0, ++seed);
        run(dev, dt, N, k, C, E, std::max<int64_t>(1, N * k / E / 2), ++seed);  // some choices dropped
      }
}

TEST_CASE("moe: with probabilities 1/k, unpermute(permute(x)) is x and the gradient through both is dy, bit for bit") {
  for (Device dev : test_devices())
    for (DType dt : float_dtypes())
      for (int64_t k : {1, 2, 4}) {
        Rng rng(9300 + static_cast<uint64_t>(k));
        const int64_t N = 37, C = 24, E = 8;
        const std::string name = case_name(dev, dt, str("moe round trip k=", k));
        const MoeRouting r = moe_routing(make_ints(random_choices(rng, N, k, E), {N, k}, DType::I32, dev), E);
        const Tensor dest = dest_tensor(r.dest, dev);
        const Tensor probs =
            Tensor::from_vector(std::vector<float>(static_cast<size_t>(N * k), 1.0f / static_cast<float>(k)), {N, k}).to(dev);
        const Input x = rand_input(rng, {N, C}, dt, dev, -3, 3);
        Tensor perm = Tensor::empty({r.rows(), C}, dt, dev), y = Tensor::empty({N, C}, dt, dev);
        moe_permute(x.t, dest, perm);
        moe_unpermute(perm, dest, probs, y);
        check_close(name + " forward", y, x.v, {0, 0, 0});
        const Input dy = rand_input(rng, {N, C}, dt, dev, -3, 3);
        Tensor din = Tensor::empty({r.rows(), C}, dt, dev), dp = Tensor::empty({N, k}, DType::F32, dev);
        Tensor dx = Tensor::empty({N, C}, dt, dev);
        moe_unpermute_backward(dy.t, perm, dest, probs, din, dp);
        moe_permute_backward(din, dest, dx);
        check_close(name + " backward", dx, dy.v, {0, 0, 0});
      }
}

TEST_CASE("moe: the tape's permute and unpermute nodes") {
  for (Device dev : test_devices()) {
    Rng rng(9400);
    const int64_t N = 9, k = 2, C = 16, E = 4;
    const std::vector<int64_t> idx = random_choices(rng, N, k, E);
    const MoeRouting r = moe_routing(make_ints(idx, {N, k}, DType::I64, Device::cpu()), E);
    const Tensor dest = dest_tensor(r.dest, dev);
    const Input x = rand_input(rng, {N, C}, DType::F32, dev, -1, 1);
    const std::vector<double> p = probs_of(rng, N, k);
    Tape tape;
    Var xv(x.t, true), pv(make_tensor(p, {N, k}, DType::F32, dev), true);
    const Var perm = ag::moe_permute(tape, xv, dest, r.rows());
    const Var y = ag::moe_unpermute(tape, perm, dest, pv, N);
    const Input dy = rand_input(rng, {N, C}, DType::F32, dev, -1, 1);
    tape.backward(y, dy.t);
    // y[n] = Σ_j p[n, j] x[n]: dx[n] = Σ_j p[n, j] dy[n], dp[n, j] = ⟨dy[n], x[n]⟩.
    std::vector<double> ref_dx(static_cast<size_t>(N * C)), ref_dp(static_cast<size_t>(N * k));
    for (int64_t n = 0; n < N; ++n)
      for (int64_t c = 0; c < C; ++c) {
        const double g = dy.v[static_cast<size_t>(n * C + c)];
        for (int64_t j = 0; j < k; ++j) {
          ref_dx[static_cast<size_t>(n * C + c)] += p[static_cast<size_t>(n * k + j)] * g;
          ref_dp[static_cast<size_t>(n * k + j)] += g * x.v[static_cast<size_t>(n * C + c)];
        }
      }
    const std::string name = case_name(dev, DType::F32, "moe tape");
    check_close(name + " dx", xv.grad(), ref_dx, tol(DType::F32, Kind::Reduction));
    check_close(name + " dprobs", pv.grad(), ref_dp, tol(DType::F32, Kind::Reduction));
  }
}

TEST_CASE("moe: bad arguments are refused naming the op") {
  const Tensor idx = Tensor::from_ints({0, 5}, {1, 2}, DType::I32);
  check_throws_naming("moe_routing", [&] { moe_routing(idx, 4); }, "expert 5 of 4");
  check_throws_naming("moe_routing", [&] { moe_routing(Tensor::from_ints({0}, {1}, DType::I32), 4); }, "1-d indices");
  const Tensor x = Tensor::zeros({3, 8}, DType::F32), out = Tensor::zeros({6, 8}, DType::F32);
  check_throws_naming("moe_permute", [&] { moe_permute(x, Tensor::from_ints({0, 1, 2, 3, 4}, {5}, DType::I32), out); },
                      "5 dest entries for 3 tokens");
  check_throws_naming("moe_permute", [&] { moe_permute(x, Tensor::from_ints({0, 1, 2, 3, 4, 5}, {6}, DType::I64), out); },
                      "i64 dest");
  check_throws_naming("moe_permute", [&] { moe_permute(x, Tensor::from_ints({0, 1, 2}, {3}, DType::I32), Tensor::zeros({6, 4}, DType::F32)); },
                      "column mismatch");
  const Tensor dest = Tensor::from_ints({0, 1, 2, 3, 4, 5}, {6}, DType::I32);
  check_throws_naming("moe_unpermute", [&] { moe_unpermute(out, dest, Tensor::zeros({3, 3}, DType::F32), x); },
                      "probs of the wrong shape");
}
