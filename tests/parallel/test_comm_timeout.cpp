// tests/parallel/test_comm_timeout.cpp — a rank that skips a collective turns
// the others' hang into an Error naming it, within the timeout, and the test
// still ends cleanly on every rank (the late rank joins afterwards and the
// abandoned operation is drained).
// mpitron-test: np=2,4
// mpitron-test: timeout=120
#include <doctest/doctest.h>

#include <chrono>

#include "parallel/communicator.h"

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
double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}
}  // namespace

TEST_CASE("comm mpi timeout: the rank that skipped an all_reduce is named") {
  int up = 0;
  MPI_Initialized(&up);
  REQUIRE(up);
  const int r = wrank(), n = wsize();
  const int late = 1;  // this rank skips the collective
  CommOptions o;
  o.name = "dp";
  o.timeout_s = 1.0;
  o.diagnose_s = 0.5;
  auto c = make_mpi_communicator(MPI_COMM_WORLD, o);
  Tensor t = Tensor::from_vector({1.f, 2.f, 3.f}, {3});
  c->all_reduce(t);  // one good collective first: #1

  if (r != late) {
    const double t0 = now_s();
    std::string msg;
    try {
      c->all_reduce(t);  // #2: the late rank is not there
    } catch (const Error& e) {
      msg = e.what();
    }
    const double took = now_s() - t0;
    INFO("rank ", r, " error: ", msg);
    if (r == 0) MESSAGE(msg);  // the text a user would see
    CHECK(!msg.empty());
    CHECK(msg.find("all_reduce") != std::string::npos);
    CHECK(msg.find("#2") != std::string::npos);
    CHECK(msg.find("group 'dp'") != std::string::npos);
    CHECK(msg.find("world rank 1 (group rank 1): no answer") != std::string::npos);
    // Ranks that did arrive are not named.
    for (int q = 0; q < n; ++q)
      if (q != late) CHECK(msg.find(str("world rank ", q, " (group rank")) == std::string::npos);
    CHECK(msg.find(str("1 of ", n - 1, " other rank(s) did not arrive")) != std::string::npos);
    CHECK(took >= 1.0);
    CHECK(took < 1.0 + 0.5 + 5.0);
    CHECK(c->broken());
    CHECK_THROWS_WITH_AS(c->all_reduce(t), doctest::Contains("broken"), Error);
  }
  // Everyone meets here (the late rank waits in this barrier while the others time out).
  MPI_Barrier(MPI_COMM_WORLD);
  if (r == late) {
    c->all_reduce(t);  // the late rank's #2 completes the abandoned operations
    CHECK_FALSE(c->broken());
  } else {
    CHECK(c->drain(30.0));
  }
  MPI_Barrier(MPI_COMM_WORLD);
  c.reset();
  MPI_Barrier(MPI_COMM_WORLD);
}

TEST_CASE("comm mpi timeout: a recv whose sender never sends names the peer") {
  const int r = wrank(), n = wsize();
  CommOptions o;
  o.name = "pp";
  o.timeout_s = 0.5;
  o.diagnose_s = 0.3;
  auto c = make_mpi_communicator(MPI_COMM_WORLD, o);
  if (r == 0) {
    Tensor t = Tensor::zeros({4}, DType::F32);
    std::string msg;
    try {
      c->recv(t, n - 1, 9);
    } catch (const Error& e) {
      msg = e.what();
    }
    INFO(msg);
    CHECK(msg.find(str("recv(f32[4] cpu from group rank ", n - 1)) != std::string::npos);
    CHECK(msg.find(str("world rank ", n - 1, " (group rank ", n - 1, "): no answer")) != std::string::npos);
  }
  MPI_Barrier(MPI_COMM_WORLD);
  if (r == n - 1) c->send(Tensor::zeros({4}, DType::F32), 0, 9);  // the abandoned recv completes
  if (r == 0) CHECK(c->drain(30.0));
  MPI_Barrier(MPI_COMM_WORLD);
}
