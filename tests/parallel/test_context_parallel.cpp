// tests/parallel/test_context_parallel.cpp — context-parallel attention
// (parallel/context_parallel.h) on real ranks: every comm type (p2p ring, all_gather,
// a2a) at CP 2 and CP 4 (and two CP-2 groups side by side at 4 ranks), MHA and GQA,
// with and without attention dropout, f32 and bf16, equals attention_forward /
// attention_backward over the whole sequence on one rank (itself checked against a
// float64 reference in tests/tensor/): each rank's output and lse rows and its dQ,
// dK, dV rows, at the global positions of the chunks it holds (rank r: r and 2P−1−r).
// MPITRON_TEST_DEVICE=cuda runs it on the GPU (the simulated one under make test-cuda-sim).
// mpitron-test: np=2,4
// mpitron-test: timeout=300
#include <mpi.h>

#include <cstdlib>
#include <cstring>

#include "parallel/context_parallel.h"
#include "tests/tensor/op_harness.h"

using namespace mpitron;
using namespace mpitron::test;

namespace {

Device test_device() {
  const char* d = std::getenv("MPITRON_TEST_DEVICE");
  return d && std::strcmp(d, "cuda") == 0 && cuda_available() ? Device::cuda(0) : Device::cpu();
}

// This rank's rows of a (B, T, …) tensor: chunks r and 2P−1−r, concatenated.
Tensor local_rows(const ContextParallel& cp, const Tensor& full) {
  const int64_t T = full.dim(1);
  Shape s = full.shape();
  s[1] = cp.local_seq(T);
  const Tensor out = Tensor::empty(s, full.dtype(), full.device());
  for (const ContextParallel::Run& r : cp.runs(T))
    out.slice(1, r.local, r.local + r.len).copy_from(full.slice(1, r.global, r.global + r.len));
  return out;
}
// The lse (B, NH, T) rows of this rank.
Tensor local_lse(const ContextParallel& cp, const Tensor& full) {
  const int64_t T = full.dim(2);
  const Tensor out = Tensor::empty({full.dim(0), full.dim(1), cp.local_seq(T)}, DType::F32, full.device());
  for (const ContextParallel::Run& r : cp.runs(T))
    out.slice(2, r.local, r.local + r.len).copy_from(full.slice(2, r.global, r.global + r.len));
  return out;
}

struct Case {
  int64_t b, t, nh, g, hd;
  DType dt;
  float p;  // attention dropout
};

void run_case(const ContextParallel& cp, Device dev, const Case& c, uint64_t seed) {
  Rng rng(seed);  // the same sequence on every rank
  const Input qkv = rand_input(rng, {c.b, c.t, c.nh + 2 * c.g, c.hd}, c.dt, dev, -1.5, 1.5);
  const Input dout = rand_input(rng, {c.b, c.t, c.nh, c.hd}, c.dt, dev, -1, 1);
  const float scale = 1.0f / std::sqrt(static_cast<float>(c.hd));
  const AttentionDropout drop{c.p, 99, 5000, 3};  // first_head 3: a TP rank's offset
  // One rank's whole-sequence attention: the reference.
  const Tensor out = Tensor::empty({c.b, c.t, c.nh, c.hd}, c.dt, dev), lse = Tensor::empty({c.b, c.nh, c.t}, DType::F32, dev);
  attention_forward(qkv.t, out, lse, scale, drop);
  const Tensor dqkv = Tensor::empty(qkv.t.shape(), c.dt, dev);
  attention_backward(dout.t, qkv.t, out, lse, dqkv, scale, drop);

  const int64_t tl = cp.local_seq(c.t);
  const Tensor lq = local_rows(cp, qkv.t), ld = local_rows(cp, dout.t);
  const Tensor lo = Tensor::empty({c.b, tl, c.nh, c.hd}, c.dt, dev), ll = Tensor::empty({c.b, c.nh, tl}, DType::F32, dev);
  cp_attention_forward(cp, lq, lo, ll, scale, drop);
  const Tensor ldq = Tensor::empty(lq.shape(), c.dt, dev);
  cp_attention_backward(cp, ld, lq, lo, ll, ldq, scale, drop);

  const std::string name = str(dev.name(), " ", dtype_name(c.dt), " cp ", cp.size, " rank ", cp.rank, " ",
                               cp_comm_type_name(cp.type), " B=", c.b, " T=", c.t, " NH=", c.nh, " G=", c.g,
                               " HD=", c.hd, " p=", c.p);
  const Tol t = c.dt == DType::F32 ? Tol{2e-5, 1e-6, 2e-5} : tol(c.dt, Kind::Attention);
  check_close(name + " out", lo, values(local_rows(cp, out)), t);
  if (cp.type != CpCommType::AllToAll)  // a2a keeps the head-sharded statistics (context_parallel.h)
    check_close(name + " lse", ll, values(local_lse(cp, lse)), Tol{2e-5, 1e-6, 0});
  check_close(name + " dqkv", ldq, values(local_rows(cp, dqkv)), t);
}

// The cp groups of this test: the whole world, and at 4 ranks also pairs {0,1} {2,3}.
struct Group {
  MPI_Comm comm = MPI_COMM_NULL;
  std::unique_ptr<Communicator> c;
};

void run_all(MPI_Comm comm, Device dev) {
  int size = 1, rank = 0;
  MPI_Comm_size(comm, &size);
  MPI_Comm_rank(comm, &rank);
  CommOptions o;
  o.name = "cp";
#if !defined(MPITRON_CUDA_SIM)
  // On a GPU the ranks share one device (tools/gpu_check.sh), which NCCL refuses: MPI, host-staged.
  o.force_mpi_for_device = true;
#endif
  auto c = make_communicator(comm, dev, o);
  uint64_t seed = 100 * static_cast<uint64_t>(size);
  for (CpCommType type : {CpCommType::P2P, CpCommType::AllGather, CpCommType::AllToAll}) {
    const ContextParallel cp{c.get(), size, rank, type};
    const int64_t T = 6 * 2 * size;  // chunks of 6 tokens
    run_case(cp, dev, {2, T, 4, 4, 8, DType::F32, 0.0f}, ++seed);    // MHA
    run_case(cp, dev, {1, T, 8, 4, 8, DType::F32, 0.0f}, ++seed);    // GQA
    run_case(cp, dev, {2, T, 8, 4, 16, DType::F32, 0.1f}, ++seed);   // attention dropout: the one-process mask
    run_case(cp, dev, {1, T, 4, 4, 8, DType::BF16, 0.0f}, ++seed);
    if (type != CpCommType::AllToAll) run_case(cp, dev, {1, T, 6, 2, 8, DType::F32, 0.0f}, ++seed);  // G = 2 < CP 4
  }
}

}  // namespace

TEST_CASE("context-parallel attention equals one rank's attention: p2p, all_gather, a2a") {
  const Device dev = test_device();
  run_all(MPI_COMM_WORLD, dev);
  int n = 1, w = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  MPI_Comm_rank(MPI_COMM_WORLD, &w);
  if (n == 4) {  // two cp groups of 2 side by side (as with dp 2)
    MPI_Comm pair;
    MPI_Comm_split(MPI_COMM_WORLD, w / 2, w, &pair);
    run_all(pair, dev);
    MPI_Comm_free(&pair);
  }
}

TEST_CASE("context parallelism: the layout and the refusals name the flags") {
  int n = 1, w = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  MPI_Comm_rank(MPI_COMM_WORLD, &w);
  CommOptions o;
  o.name = "cp";
  auto c = make_communicator(MPI_COMM_WORLD, Device::cpu(), o);
  ContextParallel cp{c.get(), n, w, CpCommType::P2P};
  // Rank r holds chunks r and 2P−1−r.
  const int64_t T = 8 * n;
  const int64_t tc = T / (2 * n);
  CHECK(cp.global_position(0, T) == w * tc);
  CHECK(cp.global_position(tc, T) == (2 * n - 1 - w) * tc);
  CHECK(cp.global_position(2 * tc - 1, T) == (2 * n - w) * tc - 1);
  CHECK(cp.describe(T).find(str("holds chunks ", w, " and ", 2 * n - 1 - w)) != std::string::npos);
  CHECK_THROWS_WITH_AS(check_context_parallel(cp, 2 * n + 1, 4, 4), doctest::Contains("--seq-length"), Error);
  CHECK_THROWS_WITH_AS(check_context_parallel(cp, 2 * n + 1, 4, 4), doctest::Contains("--context-parallel-size"), Error);
  cp.type = CpCommType::AllToAll;
  CHECK_THROWS_WITH_AS(check_context_parallel(cp, T, 4 * n + 1, 1), doctest::Contains("--cp-comm-type a2a"), Error);
  CHECK_NOTHROW(check_context_parallel(cp, T, 4 * n, n));
  CHECK_THROWS_WITH_AS(parse_cp_comm_type("ring"), doctest::Contains("--cp-comm-type"), Error);
  CHECK(parse_cp_comm_type("all_gather") == CpCommType::AllGather);
}
