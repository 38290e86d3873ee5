// tests/parallel/test_comm.cpp — every collective of the MPI Communicator on
// real ranks, for every dtype, checked against values computed locally; the
// async forms, uneven (v) forms, in-place use, point-to-point, and the errors
// a misuse gets. CUDA paths (NCCL, MPI staged through host) run when a GPU is
// present and print SKIPPED otherwise.
// mpitron-test: np=2,4
// mpitron-test: timeout=300
#include <doctest/doctest.h>

#include <cmath>
#include <cstdio>
#include <cstring>

#include "core/device.h"
#include "parallel/communicator.h"

using namespace mpitron;

namespace {

bool mpi_up() {
  int up = 0;
  MPI_Initialized(&up);
  return up != 0;
}
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

// Rank r's value at element i: small integers, so every sum and max is exact
// in every dtype (bf16 holds integers up to 256 exactly) and order-independent.
float val(int r, int64_t i) { return static_cast<float>((r + 1) * ((i % 5) + 1) - static_cast<int>(i % 3)); }

Tensor rank_tensor(int r, int64_t n, DType dt, int64_t first = 0) {
  if (!is_floating(dt)) {
    std::vector<int64_t> v(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) v[static_cast<size_t>(i)] = static_cast<int64_t>(val(r, first + i));
    return Tensor::from_ints(v, {n}, dt);
  }
  std::vector<float> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[static_cast<size_t>(i)] = val(r, first + i);
  return Tensor::from_vector(v, {n}, dt);
}

const DType kAll[] = {DType::F32, DType::BF16, DType::F16, DType::I32, DType::I64};

void check_equal(const Tensor& got, const std::vector<float>& want, const char* what, DType dt) {
  const std::vector<float> g = got.to_floats();
  REQUIRE(g.size() == want.size());
  int bad = 0;
  for (size_t i = 0; i < g.size(); ++i) bad += g[i] != want[i];
  INFO(what, " dtype ", dtype_name(dt), " rank ", wrank());
  CHECK(bad == 0);
}

}  // namespace

TEST_CASE("comm mpi: all_reduce sum and max, every dtype, sync and async") {
  REQUIRE(mpi_up());
  const int r = wrank(), n = wsize();
  CommOptions o;
  o.name = "world";
  auto c = make_mpi_communicator(MPI_COMM_WORLD, o);
  CHECK(c->size() == n);
  CHECK(c->rank() == r);
  CHECK(std::string(c->backend()) == "mpi");
  const int64_t N = 1031;  // prime: no algorithm gets an even split
  for (DType dt : kAll) {
    std::vector<float> sum(N, 0.f), mx(N, -1e30f);
    for (int q = 0; q < n; ++q)
      for (int64_t i = 0; i < N; ++i) {
        sum[static_cast<size_t>(i)] += val(q, i);
        mx[static_cast<size_t>(i)] = std::max(mx[static_cast<size_t>(i)], val(q, i));
      }
    Tensor a = rank_tensor(r, N, dt);
    c->all_reduce(a, ReduceOp::Sum);
    check_equal(a, sum, "all_reduce sum", dt);
    Tensor b = rank_tensor(r, N, dt);
    WorkPtr w = c->all_reduce_async(b, ReduceOp::Max);
    w->wait();
    CHECK(w->test());
    check_equal(b, mx, "all_reduce max (async)", dt);
  }
  // i64 beyond what a float (or double) path would keep exact.
  const int64_t big = (int64_t{1} << 60) + 12345;
  Tensor i64 = Tensor::from_ints({big + r, -big - 7 * r}, {2}, DType::I64);
  c->all_reduce(i64, ReduceOp::Max);
  CHECK(i64.to_ints() == std::vector<int64_t>{big + n - 1, -big});
}

TEST_CASE("comm mpi: bf16/f16 sums round per step like NCCL (non-integer values)") {
  REQUIRE(mpi_up());
  const int r = wrank(), n = wsize();
  auto c = make_mpi_communicator(MPI_COMM_WORLD);
  // Every rank contributes the same value x: the exact sum n·x rounds to within
  // n half-ulps of the dtype in any reduction order.
  for (DType dt : {DType::BF16, DType::F16}) {
    std::vector<float> x(257);
    for (size_t i = 0; i < x.size(); ++i) x[i] = 0.1f + 0.37f * static_cast<float>(i);
    Tensor t = Tensor::from_vector(x, {257}, dt);
    const std::vector<float> xr = t.to_floats();  // x rounded to dt
    c->all_reduce(t);
    const std::vector<float> g = t.to_floats();
    const double ulp = dt == DType::BF16 ? 1.0 / 128 : 1.0 / 1024;
    int bad = 0;
    for (size_t i = 0; i < g.size(); ++i) {
      const double want = n * static_cast<double>(xr[i]);
      bad += std::fabs(g[i] - want) > n * ulp * std::fabs(want);
    }
    INFO("dtype ", dtype_name(dt), " rank ", r);
    CHECK(bad == 0);
  }
}

TEST_CASE("comm mpi: reduce_scatter and all_gather, even and uneven, separate and in place") {
  REQUIRE(mpi_up());
  const int r = wrank(), n = wsize();
  auto c = make_mpi_communicator(MPI_COMM_WORLD);
  for (DType dt : kAll) {
    // Even: chunks of 7.
    const int64_t k = 7;
    std::vector<float> sum(static_cast<size_t>(n * k), 0.f);
    for (int q = 0; q < n; ++q)
      for (int64_t i = 0; i < n * k; ++i) sum[static_cast<size_t>(i)] += val(q, i);
    const std::vector<float> mine(sum.begin() + r * k, sum.begin() + (r + 1) * k);
    Tensor in = rank_tensor(r, n * k, dt);
    Tensor out = Tensor::empty({k}, dt);
    c->reduce_scatter(in, out);
    check_equal(out, mine, "reduce_scatter", dt);
    // In place: out is this rank's chunk of in.
    Tensor in2 = rank_tensor(r, n * k, dt);
    c->reduce_scatter(in2, in2.flat_range(r * k, k));
    check_equal(in2.flat_range(r * k, k), mine, "reduce_scatter in place", dt);

    // Uneven: rank q gets q+1 elements except the last gets 0 (padding-like).
    std::vector<int64_t> counts(static_cast<size_t>(n));
    int64_t total = 0, my_first = 0;
    for (int q = 0; q < n; ++q) {
      counts[static_cast<size_t>(q)] = q == n - 1 ? 0 : q + 2;
      if (q < r) my_first += counts[static_cast<size_t>(q)];
      total += counts[static_cast<size_t>(q)];
    }
    const int64_t mc = counts[static_cast<size_t>(r)];
    std::vector<float> vsum(static_cast<size_t>(total), 0.f);
    for (int q = 0; q < n; ++q)
      for (int64_t i = 0; i < total; ++i) vsum[static_cast<size_t>(i)] += val(q, i);
    Tensor vin = rank_tensor(r, total, dt);
    Tensor vout = Tensor::empty({mc}, dt);
    c->reduce_scatter_v(vin, vout, counts);
    check_equal(vout, std::vector<float>(vsum.begin() + my_first, vsum.begin() + my_first + mc), "reduce_scatter_v",
                dt);

    // all_gather: everyone's chunk is rank_tensor(q, k, first = q*k).
    std::vector<float> gathered;
    for (int q = 0; q < n; ++q)
      for (int64_t i = 0; i < k; ++i) gathered.push_back(val(q, q * k + i));
    Tensor gout = Tensor::zeros({n * k}, dt);
    c->all_gather(rank_tensor(r, k, dt, r * k), gout);
    check_equal(gout, gathered, "all_gather", dt);
    Tensor gin = Tensor::zeros({n * k}, dt);
    gin.flat_range(r * k, k).copy_from(rank_tensor(r, k, dt, r * k));
    WorkPtr w = c->all_gather_async(gin.flat_range(r * k, k), gin);
    w->wait();
    check_equal(gin, gathered, "all_gather in place (async)", dt);

    // all_gather_v, in place, uneven counts with an empty one.
    std::vector<float> vg;
    for (int q = 0; q < n; ++q)
      for (int64_t i = 0; i < counts[static_cast<size_t>(q)]; ++i) vg.push_back(val(q, 100 + i));
    Tensor vbuf = Tensor::zeros({total}, dt);
    vbuf.flat_range(my_first, mc).copy_from(rank_tensor(r, mc, dt, 100));
    c->all_gather_v(vbuf.flat_range(my_first, mc), vbuf, counts);
    check_equal(vbuf, vg, "all_gather_v in place", dt);
  }
}

TEST_CASE("comm mpi: broadcast, send/recv ring, barrier, u16 moves") {
  REQUIRE(mpi_up());
  const int r = wrank(), n = wsize();
  auto c = make_mpi_communicator(MPI_COMM_WORLD);
  for (DType dt : {DType::F32, DType::BF16, DType::F16, DType::I32, DType::I64, DType::U16}) {
    const int root = n - 1;
    Tensor t = rank_tensor(r, 33, dt);
    c->broadcast(t, root);
    std::vector<float> want(33);
    for (int64_t i = 0; i < 33; ++i) want[static_cast<size_t>(i)] = val(root, i);
    if (dt == DType::U16) {
      // u16 from_vector of negatives is not meaningful: compare bytes with the root's tensor instead.
      Tensor ref = rank_tensor(root, 33, dt);
      CHECK(std::memcmp(ref.data_ptr(), t.data_ptr(), t.nbytes()) == 0);
    } else {
      check_equal(t, want, "broadcast", dt);
    }
    // Ring: send to r+1, receive from r-1; async both, so no ordering deadlock.
    const int to = (r + 1) % n, from = (r + n - 1) % n;
    Tensor s = rank_tensor(r, 17, dt), got = Tensor::zeros({17}, dt);
    WorkPtr rw = c->recv_async(got, from, 5);
    WorkPtr sw = c->send_async(s, to, 5);
    sw->wait();
    rw->wait();
    Tensor ref = rank_tensor(from, 17, dt);
    CHECK(std::memcmp(ref.data_ptr(), got.data_ptr(), got.nbytes()) == 0);
  }
  c->barrier();
  CHECK(c->collectives_issued() == 7);  // 6 broadcasts + barrier
}

TEST_CASE("comm mpi: sub-groups report world ranks; misuse errors say what and where") {
  REQUIRE(mpi_up());
  const int r = wrank(), n = wsize();
  MPI_Comm half;
  MPI_Comm_split(MPI_COMM_WORLD, r % 2, r, &half);
  {
    CommOptions o;
    o.name = r % 2 ? "odd" : "even";
    auto c = make_mpi_communicator(half, o);
    std::vector<int> want;
    for (int q = r % 2; q < n; q += 2) want.push_back(q);
    CHECK(c->world_ranks() == want);
    CHECK(c->describe().find(o.name) != std::string::npos);
    Tensor t = rank_tensor(r, 4, DType::F32);
    c->all_reduce(t);
    std::vector<float> sum(4, 0.f);
    for (int q : want)
      for (int i = 0; i < 4; ++i) sum[static_cast<size_t>(i)] += val(q, i);
    check_equal(t, sum, "sub-group all_reduce", DType::F32);

    // Local argument checks throw before anything is sent (all ranks alike).
    Tensor u = Tensor::zeros({4}, DType::U16);
    CHECK_THROWS_WITH_AS(c->all_reduce(u), doctest::Contains("cannot reduce u16"), Error);
    std::vector<int64_t> bad(static_cast<size_t>(c->size()), 1);
    bad[0] = 3;
    CHECK_THROWS_WITH_AS(c->reduce_scatter_v(Tensor::zeros({2}, DType::F32), Tensor::zeros({1}, DType::F32), bad),
                         doctest::Contains("counts sum to"), Error);
    CHECK_THROWS_WITH_AS(c->all_reduce(Tensor::zeros({4, 4}, DType::F32).transpose(0, 1)),
                         doctest::Contains("not contiguous"), Error);
    CHECK_FALSE(c->broken());
    c->barrier();
  }
  MPI_Comm_free(&half);
}

TEST_CASE("comm cuda: MPI staged through host, and NCCL") {
  REQUIRE(mpi_up());
  const int r = wrank(), n = wsize();
  if (!cuda_available()) {
    if (r == 0) std::printf("SKIPPED cuda: %s\n", cuda_unavailable_reason().c_str());
    return;
  }
  cuda_set_device(r % cuda_device_count());
  const Device dev = Device::cuda(cuda_current_device());
  {
    // Several ranks may share one GPU on this path.
    CommOptions o;
    o.force_mpi_for_device = true;
    auto c = make_communicator(MPI_COMM_WORLD, dev, o);
    CHECK(std::string(c->backend()) == "mpi");
    for (DType dt : kAll) {
      std::vector<float> sum(100, 0.f);
      for (int q = 0; q < n; ++q)
        for (int64_t i = 0; i < 100; ++i) sum[static_cast<size_t>(i)] += val(q, i);
      Tensor t = rank_tensor(r, 100, dt).to(dev);
      c->all_reduce(t);
      check_equal(t, sum, "staged all_reduce", dt);
      Tensor g = Tensor::zeros({n * 10}, dt, dev);
      c->all_gather(rank_tensor(r, 10, dt).to(dev), g);
      std::vector<float> want;
      for (int q = 0; q < n; ++q)
        for (int64_t i = 0; i < 10; ++i) want.push_back(val(q, i));
      check_equal(g, want, "staged all_gather", dt);
    }
  }
  // NCCL needs one GPU per rank of the group (each rank has its own simulated device).
#if defined(MPITRON_CUDA_SIM)
  int enough = 1, all = 0;
#else
  int enough = cuda_device_count() >= n, all = 0;
#endif
  MPI_Allreduce(&enough, &all, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  if (!all) {
    if (r == 0) std::printf("SKIPPED cuda: NCCL needs %d GPUs, %d present\n", n, cuda_device_count());
    return;
  }
  auto c = make_communicator(MPI_COMM_WORLD, dev);
  CHECK(std::string(c->backend()) == "nccl");
  for (DType dt : kAll) {
    std::vector<float> sum(1031, 0.f), mx(1031, -1e30f);
    for (int q = 0; q < n; ++q)
      for (int64_t i = 0; i < 1031; ++i) {
        sum[static_cast<size_t>(i)] += val(q, i);
        mx[static_cast<size_t>(i)] = std::max(mx[static_cast<size_t>(i)], val(q, i));
      }
    Tensor a = rank_tensor(r, 1031, dt).to(dev);
    c->all_reduce(a);
    check_equal(a, sum, "nccl all_reduce", dt);
    Tensor b = rank_tensor(r, 1031, dt).to(dev);
    c->all_reduce_async(b, ReduceOp::Max)->wait();
    check_equal(b, mx, "nccl all_reduce max", dt);
    std::vector<int64_t> counts(static_cast<size_t>(n));
    int64_t total = 0, my_first = 0;
    for (int q = 0; q < n; ++q) {
      counts[static_cast<size_t>(q)] = q + 1;
      if (q < r) my_first += q + 1;
      total += q + 1;
    }
    std::vector<float> vsum(static_cast<size_t>(total), 0.f);
    for (int q = 0; q < n; ++q)
      for (int64_t i = 0; i < total; ++i) vsum[static_cast<size_t>(i)] += val(q, i);
    Tensor vin = rank_tensor(r, total, dt).to(dev);
    c->reduce_scatter_v(vin, vin.flat_range(my_first, r + 1), counts);
    check_equal(vin.flat_range(my_first, r + 1),
                std::vector<float>(vsum.begin() + my_first, vsum.begin() + my_first + r + 1), "nccl reduce_scatter_v",
                dt);
    Tensor vg = Tensor::zeros({total}, dt, dev);
    vg.flat_range(my_first, r + 1).copy_from(rank_tensor(r, r + 1, dt).to(dev));
    c->all_gather_v(vg.flat_range(my_first, r + 1), vg, counts);
    std::vector<float> want;
    for (int q = 0; q < n; ++q)
      for (int64_t i = 0; i < q + 1; ++i) want.push_back(val(q, i));
    check_equal(vg, want, "nccl all_gather_v", dt);
  }
  c->barrier();
}
