// tests/parallel/test_expert_parallel.cpp — the expert-parallel token dispatchers
// (parallel/expert_parallel.h) on real ranks, against a host reference built from every
// rank's rows: for EP 2 and 4 (and two EP-2 groups side by side at 4 ranks), E = ep·{1,2,3}
// experts, random counts with empty experts and ranks that send or receive no rows at all:
//   - to_experts gives exactly the reference rows (local expert by local expert, source by
//     source), for alltoall and allgather alike (bit for bit: both only move rows);
//   - from_experts(to_experts(xp)) == xp (every row back where it came from);
//   - from_experts is the adjoint of to_experts: Σ_ranks ⟨to(x), y⟩ == Σ_ranks ⟨x, from(y)⟩
//     (in float64 over f32 values), so each is the other's backward;
//   - bad shapes are refused naming the sizes.
// MPITRON_TEST_DEVICE=cuda runs it on the GPU (the simulated one under make test-cuda-sim).
// mpitron-test: np=2,4
// mpitron-test: timeout=300
#include <doctest/doctest.h>
#include <mpi.h>

#include <cstdlib>
#include <cstring>
#include <random>

#include "parallel/expert_parallel.h"

using namespace mpitron;

namespace {

Device test_device() {
  const char* d = std::getenv("MPITRON_TEST_DEVICE");
  return d && std::strcmp(d, "cuda") == 0 && cuda_available() ? Device::cuda(0) : Device::cpu();
}

// The value of row i of rank s's xp, column c: distinct per (source, row, column).
float value(int s, int64_t i, int64_t c) { return static_cast<float>(s * 1000 + i) + 0.001f * static_cast<float>(c); }

struct Case {
  int64_t experts_per_rank;
  uint32_t seed;
  int empty_sender;    // this group rank sends no rows (−1: none)
  int empty_receiver;  // no rank sends rows to this group rank's experts (−1: none)
};

// counts[s][e]: rows rank s sends to global expert e (the same table on every rank).
std::vector<std::vector<int64_t>> make_counts(int P, int64_t E, const Case& c) {
  std::mt19937 rng(c.seed);
  std::vector<std::vector<int64_t>> counts(static_cast<size_t>(P), std::vector<int64_t>(static_cast<size_t>(E)));
  for (int s = 0; s < P; ++s)
    for (int64_t e = 0; e < E; ++e) {
      int64_t n = static_cast<int64_t>(rng() % 5);  // 0 … 4 rows: empty experts too
      if (s == c.empty_sender) n = 0;
      if (c.empty_receiver >= 0 && e / c.experts_per_rank == c.empty_receiver) n = 0;
      counts[static_cast<size_t>(s)][static_cast<size_t>(e)] = n;
    }
  return counts;
}

Tensor rows_of(int s, int64_t R, int64_t C, DType dt, Device dev) {
  std::vector<float> v;
  for (int64_t i = 0; i < R; ++i)
    for (int64_t c = 0; c < C; ++c) v.push_back(value(s, i, c));
  return Tensor::from_vector(v, {R, C}).to(dt).to(dev);
}

std::vector<float> host(const Tensor& t) {
  const Tensor h = t.to(Device::cpu()).to(DType::F32);
  return std::vector<float>(h.data<float>(), h.data<float>() + h.numel());
}

void run_case(Communicator& comm, Device dev, const Case& c, DType dt) {
  const int P = comm.size(), me = comm.rank();
  const int64_t E = c.experts_per_rank * P, El = c.experts_per_rank, C = 6;
  const auto counts = make_counts(P, E, c);
  auto rows_of_rank = [&](int s) {
    int64_t r = 0;
    for (int64_t n : counts[static_cast<size_t>(s)]) r += n;
    return r;
  };
  const int64_t R = rows_of_rank(me);
  // The reference xe: local expert by local expert, source by source, each source's rows in order.
  std::vector<std::vector<float>> sent;  // every rank's xp, as the host sees it (rounded to dt)
  for (int s = 0; s < P; ++s) sent.push_back(host(rows_of(s, rows_of_rank(s), C, dt, Device::cpu())));
  std::vector<float> want;
  std::vector<int64_t> want_counts(static_cast<size_t>(El), 0);
  for (int64_t l = 0; l < El; ++l) {
    const int64_t e = me * El + l;
    for (int s = 0; s < P; ++s) {
      int64_t start = 0;
      for (int64_t f = 0; f < e; ++f) start += counts[static_cast<size_t>(s)][static_cast<size_t>(f)];
      for (int64_t i = 0; i < counts[static_cast<size_t>(s)][static_cast<size_t>(e)]; ++i) {
        for (int64_t col = 0; col < C; ++col) want.push_back(sent[static_cast<size_t>(s)][static_cast<size_t>((start + i) * C + col)]);
        ++want_counts[static_cast<size_t>(l)];
      }
    }
  }
  const Tensor xp = rows_of(me, R, C, dt, dev);
  std::vector<float> first_xe;
  for (const MoeDispatcher d : {MoeDispatcher::AllToAll, MoeDispatcher::AllGather}) {
    const ExpertParallel ep{&comm, P, me, d};
    const std::string name = str(moe_dispatcher_name(d), " ", dtype_name(dt), " ep ", P, " rank ", me, " E=", E,
                                 " seed ", c.seed, " empty sender ", c.empty_sender, " empty receiver ", c.empty_receiver);
    CAPTURE(name);
    const ExpertExchange x(ep, counts[static_cast<size_t>(me)], dev);
    CHECK(x.rows() == R);
    CHECK(x.local_counts() == want_counts);
    const Tensor xe = x.to_experts(xp);
    REQUIRE(xe.dim(0) == x.local_rows());
    CHECK(host(xe) == want);
    CHECK(host(x.from_experts(xe)) == host(xp));
    // Adjoint: ⟨to(x), y⟩ summed over ranks equals ⟨x, from(y)⟩ summed over ranks.
    std::mt19937 rng(c.seed * 31u + static_cast<uint32_t>(me));
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);
    std::vector<float> yv(static_cast<size_t>(xe.numel()));
    for (float& f : yv) f = u(rng);
    const Tensor y = Tensor::from_vector(yv, xe.shape()).to(dt).to(dev);
    const std::vector<float> a = host(xe), b = host(y), xv = host(xp), fy = host(x.from_experts(y));
    double lhs = 0, rhs = 0;
    for (size_t i = 0; i < a.size(); ++i) lhs += static_cast<double>(a[i]) * b[i];
    for (size_t i = 0; i < xv.size(); ++i) rhs += static_cast<double>(xv[i]) * fy[i];
    MPI_Allreduce(MPI_IN_PLACE, &lhs, 1, MPI_DOUBLE, MPI_SUM, comm.mpi_comm());
    MPI_Allreduce(MPI_IN_PLACE, &rhs, 1, MPI_DOUBLE, MPI_SUM, comm.mpi_comm());
    CHECK(lhs == doctest::Approx(rhs).epsilon(1e-12));
    if (first_xe.empty()) first_xe = host(xe);
    else CHECK(host(xe) == first_xe);  // the two dispatchers give the same rows
    CHECK_THROWS_WITH_AS(x.to_experts(Tensor::zeros({R + 1, C}, dt, dev)), doctest::Contains("to_experts"), Error);
  }
}

}  // namespace

TEST_CASE("expert-parallel dispatchers: alltoall and allgather move every row to its expert and back") {
  const Device dev = test_device();
  int w = 0, n = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &w);
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  std::vector<int> sizes = {n};
  if (n == 4) sizes.push_back(2);  // two EP-2 groups side by side
  for (const int P : sizes) {
    MPI_Comm sub;
    MPI_Comm_split(MPI_COMM_WORLD, w / P, w % P, &sub);
    CommOptions o;
    o.name = "ep";
    auto comm = make_communicator(sub, dev, o);
    for (const DType dt : {DType::F32, DType::BF16})
      for (const Case& c : {Case{1, 1, -1, -1}, Case{2, 2, -1, -1}, Case{3, 3, 0, -1}, Case{2, 4, -1, P - 1},
                            Case{1, 5, 1, 0}})
        run_case(*comm, dev, c, dt);
    comm.reset();
    MPI_Comm_free(&sub);
  }
}

TEST_CASE("expert parallelism: the layout and the refusals name the flags") {
  int n = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  CommOptions o;
  o.name = "ep";
  auto comm = make_communicator(MPI_COMM_WORLD, Device::cpu(), o);
  const ExpertParallel ep{comm.get(), n, comm->rank(), MoeDispatcher::AllToAll};
  CHECK(ep.first(4 * n) == 4 * comm->rank());
  CHECK(ep.holds(4 * comm->rank() + 3, 4 * n));
  CHECK(!ep.holds(4 * comm->rank() + 4, 4 * n));
  CHECK_THROWS_WITH_AS(ExpertExchange(ep, std::vector<int64_t>(static_cast<size_t>(n + 1), 1), Device::cpu()),
                       doctest::Contains("--expert-model-parallel-size"), Error);
  CHECK_THROWS_WITH_AS(parse_moe_dispatcher("flex"), doctest::Contains("--moe-token-dispatcher-type flex"), Error);
  CHECK(parse_moe_dispatcher("alltoall") == MoeDispatcher::AllToAll);
}
