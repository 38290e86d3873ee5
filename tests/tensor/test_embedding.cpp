// tests/tensor/test_embedding.cpp — embedding lookup and scatter-add backward.
//
// Reference: float64 gather / scatter-add written here with vocab-parallel
// semantics (row = id − vocab_start; rows outside [0, V) read as zeros and get
// no gradient). Backward: float64 central differences of the reference forward
// with respect to the table (small shapes; the map is linear, so h = 0.5 is
// exact), the direct scatter-add on the large shape. Repeated ids must sum.
#include "tests/tensor/op_harness.h"

using namespace mpitron;
using namespace mpitron::test;

namespace {

std::vector<double> ref_embed(const std::vector<int64_t>& ids, const std::vector<double>& table, int64_t v, int64_t c,
                              int64_t vocab_start) {
  std::vector<double> out(ids.size() * static_cast<size_t>(c), 0.0);
  for (size_t n = 0; n < ids.size(); ++n) {
    const int64_t r = ids[n] - vocab_start;
    if (r < 0 || r >= v) continue;
    for (int64_t j = 0; j < c; ++j) out[n * c + j] = table[static_cast<size_t>(r * c + j)];
  }
  return out;
}

void run(Device dev, DType dt, DType id_dt, DType grad_dt, int64_t n, int64_t v, int64_t c, int64_t vocab_start,
         bool accumulate, uint64_t seed) {
  Rng rng(seed);
  std::vector<int64_t> ids(static_cast<size_t>(n));
  // Ids cover rows below, inside and above this rank's [vocab_start, vocab_start + V).
  const int64_t lo = vocab_start > 0 ? vocab_start - 3 : 0, hi = vocab_start + v - 1 + (vocab_start > 0 ? 3 : 0);
  for (auto& id : ids) id = rng.randint(lo, hi);
  if (n >= 3) ids[1] = ids[2] = ids[0];  // repeated ids
  const Tensor tids = make_ints(ids, {n}, id_dt, dev);
  const Input table = rand_input(rng, {v, c}, dt, dev, -1, 1);
  const std::vector<double> out0 = rand_input(rng, {n, c}, dt, dev, -1, 1).v;
  Out out = accumulate ? make_out({n, c}, dt, dev, &out0) : make_out({n, c}, dt, dev);
  const PathProbe fwd_path;
  embedding_forward(tids, table.t, out.t, accumulate, vocab_start);
  std::vector<double> ref = ref_embed(ids, table.v, v, c, vocab_start);
  for (size_t i = 0; i < ref.size() && accumulate; ++i) ref[i] += out0[i];
  const std::string name = case_name(dev, dt, str("embedding N=", n, " V=", v, " C=", c, " ids=", dtype_name(id_dt),
                                                  " vocab_start=", vocab_start, accumulate ? " accumulate" : ""));
  check_path(dev, fwd_path, vec_path("embedding_forward", c % 8 == 0), name + " forward");
  // Plain lookup is a copy: exact. With accumulate, one rounding of the sum.
  check_out(name + " forward", out, ref, accumulate ? tol(dt, Kind::Pointwise) : Tol{0, 0, 0});

  const Input dout = rand_input(rng, {n, c}, dt, dev, -1, 1);
  const std::vector<double> dt0 = rand_input(rng, {v, c}, grad_dt, dev, -1, 1).v;
  Out dtable = make_out({v, c}, grad_dt, dev, &dt0);
  const PathProbe bwd_path;
  embedding_backward(dout.t, tids, dtable.t, vocab_start);
  check_path(dev, bwd_path, vec_path("embedding_backward", c % 8 == 0), name + " backward");
  std::vector<double> g;
  if (v * c <= 2000) {
    g = fd_grad(table.v, [&](const std::vector<double>& tv) { return ref_embed(ids, tv, v, c, vocab_start); }, dout.v, 0.5);
  } else {
    g.assign(table.v.size(), 0.0);
    for (size_t k = 0; k < ids.size(); ++k) {
      const int64_t r = ids[k] - vocab_start;
      if (r >= 0 && r < v)
        for (int64_t j = 0; j < c; ++j) g[static_cast<size_t>(r * c + j)] += dout.v[k * c + j];
    }
  }
  for (size_t i = 0; i < g.size(); ++i) g[i] += dt0[i];
  check_out(name + " backward dtable=" + dtype_name(grad_dt), dtable, g, tol(grad_dt, Kind::Reduction));
}

}  // namespace

TEST_CASE("embedding forward/backward: id dtypes, repeated ids, accumulate, every dtype") {
  uint64_t seed = 5000;
  for (Device dev : test_devices())
    for (DType dt : float_dtypes()) {
      run(dev, dt, DType::I32, dt, 1, 1, 1, 0, false, ++seed);
      run(dev, dt, DType::I32, dt, 37, 13, 7, 0, false, ++seed);
      run(dev, dt, DType::I64, DType::F32, 37, 13, 7, 0, true, ++seed);
      run(dev, dt, DType::I64, dt, 127, 5, 13, 0, false, ++seed);  // every row repeated many times
      run(dev, dt, DType::I32, DType::F32, 2048, 5003, 64, 0, false, ++seed);
    }
}

TEST_CASE("embedding: vocab-parallel rows outside [vocab_start, vocab_start + V) give zeros and no gradient") {
  uint64_t seed = 5100;
  for (Device dev : test_devices())
    for (DType dt : float_dtypes()) {
      run(dev, dt, DType::I32, dt, 41, 11, 9, 20, false, ++seed);
      run(dev, dt, DType::I64, DType::F32, 41, 11, 9, 20, true, ++seed);
    }
}

TEST_CASE("embedding backward is deterministic with repeated ids (CPU)") {
  Rng rng(5200);
  std::vector<int64_t> ids(4096);
  for (auto& id : ids) id = rng.randint(0, 7);
  const Tensor tids = Tensor::from_ints(ids, {4096}, DType::I32);
  const Input dout = rand_input(rng, {4096, 33}, DType::F32, Device::cpu(), -1, 1);
  Tensor a = Tensor::zeros({8, 33}, DType::F32), b = Tensor::zeros({8, 33}, DType::F32);
  embedding_backward(dout.t, tids, a);
  embedding_backward(dout.t, tids, b);
  CHECK(std::memcmp(a.data_ptr(), b.data_ptr(), a.nbytes()) == 0);
}

TEST_CASE("embedding: invalid arguments throw naming the op") {
  const Tensor ids = Tensor::from_ints({0, 1, 2}, {3}), table = Tensor::zeros({5, 4}, DType::F32);
  check_throws_naming("embedding_forward", [&] { embedding_forward(Tensor::zeros({3}, DType::F32), table, Tensor::zeros({3, 4}, DType::F32)); },
                      "float ids");
  check_throws_naming("embedding_forward", [&] { embedding_forward(ids, table, Tensor::zeros({3, 5}, DType::F32)); }, "out shape");
  check_throws_naming("embedding_forward", [&] { embedding_forward(ids, table, Tensor::zeros({3, 4}, DType::BF16)); }, "out dtype");
  check_throws_naming("embedding_forward", [&] { embedding_forward(ids, Tensor::zeros({20}, DType::F32), Tensor::zeros({3, 4}, DType::F32)); },
                      "1-D table");
  check_throws_naming("embedding_backward", [&] { embedding_backward(Tensor::zeros({3, 4}, DType::BF16), ids, Tensor::zeros({5, 4}, DType::F16)); },
                      "dtable dtype");
  check_throws_naming("embedding_backward", [&] { embedding_backward(Tensor::zeros({2, 4}, DType::F32), ids, table); }, "dout rows");
}
