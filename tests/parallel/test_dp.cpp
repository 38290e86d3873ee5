// tests/parallel/test_dp.cpp — data-parallel gradient buckets on real ranks.
//
// What holds, and is checked here:
//   - bucketed all-reduce == one all-reduce of the whole buffer, BITWISE, when
//     every partial sum is exact (integer-valued gradients) — any reduction
//     order then gives the same bits;
//   - with arbitrary f32 gradients: bitwise at np=2 (a single a+b is
//     commutative, and the 1/dp pre-scale is the same multiply), and within
//     1e-6 relative at np>2: MPI (and NCCL) pick the reduction algorithm, hence
//     the summation order, by message size, so a bucket and the whole buffer
//     may be summed in different orders;
//   - buckets launch strictly in bucket order, whatever order params are marked.
// mpitron-test: np=2,4
// mpitron-test: timeout=180
#include <doctest/doctest.h>

#include <cmath>
#include <cstring>

#include "parallel/data_parallel.h"

using namespace mpitron;

namespace {
int wrank() {
  int r = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}
int wsize() {
  int n = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  return n;
}

// Sizes of a little model's parameters (one is empty, as an unused bias may be).
std::vector<FlatParam> layout(const std::vector<int64_t>& sizes, int64_t& total) {
  std::vector<FlatParam> v;
  total = 0;
  for (size_t i = 0; i < sizes.size(); ++i) {
    v.push_back({total, sizes[i], i % 2 == 0});
    total += sizes[i];
  }
  return v;
}
const std::vector<int64_t> kSizes = {10, 3, 7, 0, 20, 5, 13, 1, 9};

// Rank r's gradient element i: integers when `exact`, else arbitrary floats.
float grad(int r, int64_t i, bool exact) {
  if (exact) return static_cast<float>(((r + 3) * (i + 1)) % 17) - 8.0f;
  const uint32_t h = static_cast<uint32_t>(r * 7919 + i * 104729 + 17) * 2654435761u;
  return (static_cast<float>(h >> 8) / 16777216.0f - 0.5f) * std::pow(10.0f, static_cast<float>(i % 7) - 3.0f);
}
Tensor grads_of(int r, int64_t n, bool exact) {
  std::vector<float> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[static_cast<size_t>(i)] = grad(r, i, exact);
  return Tensor::from_vector(v, {n});
}
bool bitwise_equal(const Tensor& a, const Tensor& b) {
  return a.numel() == b.numel() && std::memcmp(a.data_ptr(), b.data_ptr(), a.nbytes()) == 0;
}
// Largest |a - b| relative to the mean magnitude of the summands (the scale
// of f32 summation error; relative to |sum| it is unbounded under cancellation).
double max_rel(const Tensor& a, const Tensor& b, bool exact) {
  const auto x = a.to_floats(), y = b.to_floats();
  double m = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    double mag = 0;
    for (int q = 0; q < wsize(); ++q) mag += std::fabs(grad(q, static_cast<int64_t>(i), exact));
    mag /= wsize();
    m = std::max(m, std::fabs(static_cast<double>(x[i]) - y[i]) / std::max(1e-30, mag));
  }
  return m;
}
}  // namespace

TEST_CASE("dp buckets: contiguous, reverse parameter order, closed at bucket_size") {
  int up = 0;
  MPI_Initialized(&up);
  REQUIRE(up);
  auto c = make_mpi_communicator(MPI_COMM_WORLD);
  int64_t total = 0;
  const auto params = layout(kSizes, total);
  Tensor g = Tensor::zeros({total}, DType::F32);
  DDPConfig cfg;
  cfg.bucket_size = 12;
  GradBuckets b(g, params, *c, cfg);
  REQUIRE(b.num_buckets() >= 2);
  int64_t expect_end = total;
  std::vector<int> seen(params.size(), 0);
  for (size_t k = 0; k < b.num_buckets(); ++k) {
    const auto& bk = b.bucket(k);
    CHECK(bk.end == expect_end);  // bucket 0 holds the LAST parameters
    expect_end = bk.begin;
    if (k + 1 < b.num_buckets()) {
      CHECK(bk.end - bk.begin >= 12);
      // Closed as soon as it reached the size: without its last-added param it was below.
      CHECK(bk.end - params[bk.params.back()].numel - bk.begin < 12);
    }
    for (size_t p : bk.params) {
      ++seen[p];
      CHECK(b.bucket_of(p) == k);
      CHECK(params[p].offset >= bk.begin);
      CHECK(params[p].offset + params[p].numel <= bk.end);
    }
  }
  CHECK(expect_end == 0);
  for (int s : seen) CHECK(s == 1);
  // bucket_size 0: one bucket.
  cfg.bucket_size = 0;
  GradBuckets one(g, params, *c, cfg);
  CHECK(one.num_buckets() == 1);
}

TEST_CASE("dp buckets: bucketed all-reduce == one all-reduce of the buffer") {
  const int r = wrank(), n = wsize();
  auto c = make_mpi_communicator(MPI_COMM_WORLD);
  int64_t total = 0;
  const auto params = layout(kSizes, total);
  for (bool exact : {true, false}) {
    for (int64_t bucket_size : {int64_t{1}, int64_t{12}, int64_t{40}, int64_t{0}}) {
      Tensor g = grads_of(r, total, exact);
      DDPConfig cfg;
      cfg.bucket_size = bucket_size;
      GradBuckets b(g, params, *c, cfg);
      b.begin_backward(true);
      for (size_t i = params.size(); i-- > 0;) b.mark_ready(i);  // as backward: last parameter first
      b.on_backward_done();
      b.wait_all();
      // The reference: the whole buffer pre-scaled by 1/n the same way, one all-reduce.
      Tensor ref = grads_of(r, total, exact);
      std::vector<float> v = ref.to_floats();
      for (float& x : v) x *= 1.0f / static_cast<float>(n);
      ref = Tensor::from_vector(v, {total});
      c->all_reduce(ref);
      INFO("exact ", exact, " bucket_size ", bucket_size, " np ", n, " buckets ", b.num_buckets());
      if (exact || n == 2)
        CHECK(bitwise_equal(g, ref));
      else
        CHECK(max_rel(g, ref, exact) <= 1e-6);
      // And the average is right: against sums computed locally in double.
      std::vector<float> avg(static_cast<size_t>(total));
      for (int64_t i = 0; i < total; ++i) {
        double s = 0;
        for (int q = 0; q < n; ++q) s += grad(q, i, exact);
        avg[static_cast<size_t>(i)] = static_cast<float>(s / n);
      }
      CHECK(max_rel(g, Tensor::from_vector(avg, {total}), exact) <= 1e-6);
    }
  }
}

TEST_CASE("dp buckets: launch in bucket order whatever the marking order; overlap off; no-sync micro-batches") {
  const int r = wrank(), n = wsize();
  auto c = make_mpi_communicator(MPI_COMM_WORLD);
  int64_t total = 0;
  const auto params = layout(kSizes, total);
  Tensor g = grads_of(r, total, true);
  DDPConfig cfg;
  cfg.bucket_size = 12;
  GradBuckets b(g, params, *c, cfg);
  REQUIRE(b.num_buckets() >= 3);
  // Forward order: bucket 0 (the last params) completes LAST, so nothing may launch before it.
  b.begin_backward(true);
  for (size_t i = 0; i < params.size(); ++i) {
    b.mark_ready(i);
    // Bucket 0 holds the last parameter: until it is marked, nothing may launch.
    if (i + 1 < params.size())
      for (size_t k = 0; k < b.num_buckets(); ++k) CHECK_FALSE(b.bucket(k).launched);
  }
  for (size_t k = 0; k < b.num_buckets(); ++k) CHECK(b.bucket(k).launched);
  CHECK_THROWS_AS(b.mark_ready(0), Error);  // twice in one backward
  b.on_backward_done();
  b.wait_all();
  std::vector<float> want(static_cast<size_t>(total), 0.f);
  for (int q = 0; q < n; ++q)
    for (int64_t i = 0; i < total; ++i) want[static_cast<size_t>(i)] += grad(q, i, true) / static_cast<float>(n);
  CHECK(g.to_floats() == want);

  // Reverse order with overlap: bucket k launches exactly when its last param is marked.
  Tensor g2 = grads_of(r, total, true);
  GradBuckets b2(g2, params, *c, cfg);
  b2.begin_backward(true);
  for (size_t i = params.size(); i-- > 0;) {
    b2.mark_ready(i);
    const size_t k = b2.bucket_of(i);
    const bool bucket_done = b2.bucket(k).params.back() == i;
    CHECK(b2.bucket(k).launched == bucket_done);
  }
  b2.on_backward_done();
  b2.wait_all();
  CHECK(g2.to_floats() == want);

  // Overlap off: nothing launches until on_backward_done.
  cfg.overlap_grad_reduce = false;
  Tensor g3 = grads_of(r, total, true);
  GradBuckets b3(g3, params, *c, cfg);
  b3.begin_backward(true);
  for (size_t i = params.size(); i-- > 0;) b3.mark_ready(i);
  for (size_t k = 0; k < b3.num_buckets(); ++k) CHECK_FALSE(b3.bucket(k).launched);
  b3.on_backward_done();
  b3.wait_all();
  CHECK(g3.to_floats() == want);

  // A no-sync micro-batch: marking does nothing, the local gradients stay.
  Tensor g4 = grads_of(r, total, true);
  GradBuckets b4(g4, params, *c, cfg);
  b4.begin_backward(false);
  for (size_t i = params.size(); i-- > 0;) b4.mark_ready(i);
  b4.on_backward_done();
  b4.wait_all();
  CHECK(bitwise_equal(g4, grads_of(r, total, true)));
}

TEST_CASE("dp buckets: reduce-scatter to contiguous shard owners, overwrite and accumulate") {
  const int r = wrank(), n = wsize();
  auto c = make_mpi_communicator(MPI_COMM_WORLD);
  int64_t total = 0;
  const auto params = layout(kSizes, total);
  const ShardLayout shards(total, n);
  const int64_t sb = shards.begin(r), sn = shards.size(r);
  std::vector<float> avg(static_cast<size_t>(total), 0.f);
  for (int q = 0; q < n; ++q)
    for (int64_t i = 0; i < total; ++i) avg[static_cast<size_t>(i)] += grad(q, i, true) / static_cast<float>(n);
  const std::vector<float> mine(avg.begin() + sb, avg.begin() + sb + sn);
  for (int64_t bucket_size : {int64_t{5}, int64_t{12}, int64_t{0}}) {
    DDPConfig cfg;
    cfg.bucket_size = bucket_size;
    // Separate shard buffer, overwritten.
    Tensor g = grads_of(r, total, true);
    Tensor shard = Tensor::zeros({sn}, DType::F32);
    {
      GradBuckets b(g, params, *c, cfg, shards, shard, false);
      b.begin_backward(true);
      for (size_t i = params.size(); i-- > 0;) b.mark_ready(i);
      b.on_backward_done();
      b.wait_all();
    }
    CHECK(shard.to_floats() == mine);
    // In place: the shard is the grad buffer's own slice (ZeRO-1).
    Tensor g2 = grads_of(r, total, true);
    {
      GradBuckets b(g2, params, *c, cfg, shards, g2.flat_range(sb, sn), false);
      b.begin_backward(true);
      for (size_t i = params.size(); i-- > 0;) b.mark_ready(i);
      b.on_backward_done();
      b.wait_all();
    }
    CHECK(g2.flat_range(sb, sn).to_floats() == mine);
    // Accumulate twice (two micro-batches, ZeRO-2) into a shard that starts at 1.
    Tensor acc = Tensor::from_vector(std::vector<float>(static_cast<size_t>(sn), 1.0f), {sn});
    GradBuckets b(g, params, *c, cfg, shards, acc, true);
    for (int mb = 0; mb < 2; ++mb) {
      g.copy_from(grads_of(r, total, true));
      b.begin_backward(true);
      for (size_t i = params.size(); i-- > 0;) b.mark_ready(i);
      b.on_backward_done();
      b.wait_all();
    }
    std::vector<float> want(mine);
    for (float& x : want) x = 1.0f + x + x;
    CHECK(acc.to_floats() == want);
  }
}
