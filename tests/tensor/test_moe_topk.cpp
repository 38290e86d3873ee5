// tests/tensor/test_moe_topk.cpp — the MoE router's top-k (tensor/moe_topk.h) against a
// reference written here: a stable sort of each row's (score, expert) pairs, descending
// by score, ties to the lower expert. Checked: values and indices exactly (a selection
// computes nothing), ties (rows of equal scores and repeated values), k = 1 and k = E,
// the backward's scatter (every other element zero), and bad k refused naming the op.
#include <algorithm>
#include <array>
#include <numeric>

#include "tests/tensor/op_harness.h"

using namespace mpitron;
using namespace mpitron::test;

namespace {

void run(Device dev, int64_t N, int64_t E, int64_t k, bool ties, uint64_t seed) {
  Rng rng(seed);
  const std::string name = case_name(dev, DType::F32, str("moe_topk N=", N, " E=", E, " k=", k, ties ? " ties" : ""));
  std::vector<double> s(static_cast<size_t>(N * E));
  for (auto& x : s) x = ties ? static_cast<double>(rng.randint(0, 3)) : static_cast<float>(rng.uniform(-4, 4));
  std::vector<double> want_v;
  std::vector<int64_t> want_i;
  for (int64_t n = 0; n < N; ++n) {
    std::vector<int64_t> order(static_cast<size_t>(E));
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(),
                     [&](int64_t a, int64_t b) { return s[static_cast<size_t>(n * E + a)] > s[static_cast<size_t>(n * E + b)]; });
    for (int64_t j = 0; j < k; ++j) {
      want_i.push_back(order[static_cast<size_t>(j)]);
      want_v.push_back(s[static_cast<size_t>(n * E + order[static_cast<size_t>(j)])]);
    }
  }
  const Tensor scores = make_tensor(s, {N, E}, DType::F32, dev);
  Out v = make_out({N, k}, DType::F32, dev);
  Tensor ix = Tensor::empty({N, k}, DType::I32, dev);
  moe_topk(scores, k, v.t, ix);
  check_out(name + " values", v, want_v, {0, 0, 0});
  const Tensor hix = ix.to(Device::cpu());
  int64_t wrong = 0;
  for (int64_t i = 0; i < N * k; ++i) wrong += hix.data<int32_t>()[i] != want_i[static_cast<size_t>(i)];
  CHECK_MESSAGE(wrong == 0, name << ": " << wrong << " indices differ from the stable descending order");
  // backward: dvalues scattered to the chosen experts, zeros elsewhere.
  const Input dv = rand_input(rng, {N, k}, DType::F32, dev, -1, 1);
  std::vector<double> want_ds(static_cast<size_t>(N * E), 0.0);
  for (int64_t i = 0; i < N * k; ++i) want_ds[static_cast<size_t>(i / k * E + want_i[static_cast<size_t>(i)])] = dv.v[static_cast<size_t>(i)];
  Out ds = make_out({N, E}, DType::F32, dev);
  moe_topk_backward(dv.t, ix, ds.t);
  check_out(name + " backward", ds, want_ds, {0, 0, 0});
}

}  // namespace

TEST_CASE("moe_topk: the k largest scores per row, ties to the lower expert, and the backward scatter") {
  uint64_t seed = 9600;
  for (Device dev : test_devices())
    for (const auto& [N, E, k] : std::vector<std::array<int64_t, 3>>{
             {1, 1, 1}, {7, 4, 2}, {64, 8, 2}, {33, 8, 8}, {300, 64, 6}, {5, 128, 1}, {1000, 16, 4}}) {
      run(dev, N, E, k, false, ++seed);
      run(dev, N, E, k, true, ++seed);
    }
}

TEST_CASE("moe_topk: bad k and shapes are refused naming the op") {
  const Tensor s = Tensor::zeros({3, 4}, DType::F32);
  check_throws_naming("moe_topk", [&] { moe_topk(s, 5, Tensor::zeros({3, 5}, DType::F32), Tensor::zeros({3, 5}, DType::I32)); },
                      "k above E");
  check_throws_naming("moe_topk", [&] { moe_topk(s, 0, Tensor::zeros({3, 0}, DType::F32), Tensor::zeros({3, 0}, DType::I32)); },
                      "k = 0");
  check_throws_naming("moe_topk", [&] { moe_topk(Tensor::zeros({3, 4}, DType::BF16), 2, Tensor::zeros({3, 2}, DType::F32), Tensor::zeros({3, 2}, DType::I32)); },
                      "bf16 scores");
  check_throws_naming("moe_topk_backward",
                      [&] { moe_topk_backward(Tensor::zeros({3, 2}, DType::F32), Tensor::zeros({3, 3}, DType::I32), Tensor::zeros({3, 4}, DType::F32)); },
                      "indices of the wrong shape");
}
