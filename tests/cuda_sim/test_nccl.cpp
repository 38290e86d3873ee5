// tests/cuda_sim/test_nccl.cpp — the simulated device's NCCL stand-in and the
// NCCL communicator (parallel/comm_nccl.cpp) on it, two ranks (simulated-device
// builds only): the collectives and point-to-point batches are right; a
// collective stays in flight while later kernels of the default stream run (the
// data-parallel bucket reduce during backward); a collective queued without the
// cudaStreamWaitEvent that orders it after its input's writer is a race; NCCL's
// group semantics and asynchronous error query.
// mpitron-test: np=2
// mpitron-test: timeout=300
#include <doctest/doctest.h>
#include <mpi.h>
#include <nccl.h>

#include <cuda_runtime.h>
#include <cuda_sim_tools.h>

#include <string>

#include "core/device.h"
#include "parallel/communicator.h"
#include "parallel/data_parallel.h"
#include "tensor/tensor.h"

using namespace mpitron;

namespace {

int wrank() {
  int r = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}

const Device kDev = Device::cuda(0);

std::vector<float> iota(int64_t n, float base) {
  std::vector<float> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[static_cast<size_t>(i)] = base + static_cast<float>(i % 7);
  return v;
}

// A raw NCCL communicator over the world, from a unique id rank 0 broadcasts over MPI.
ncclComm_t raw_comm() {
  ncclUniqueId id;
  if (wrank() == 0) REQUIRE(ncclGetUniqueId(&id) == ncclSuccess);
  MPI_Bcast(&id, sizeof id, MPI_BYTE, 0, MPI_COMM_WORLD);
  ncclComm_t c = nullptr;
  REQUIRE(ncclCommInitRank(&c, 2, id, wrank()) == ncclSuccess);
  int n = 0, r = -1;
  ncclCommCount(c, &n);
  ncclCommUserRank(c, &r);
  CHECK(n == 2);
  CHECK(r == wrank());
  return c;
}

}  // namespace

TEST_CASE("nccl stand-in: comm_nccl.cpp's broadcast, send/recv and grouped batches over two ranks") {
  const int me = wrank(), peer = 1 - me;
  auto c = make_communicator(MPI_COMM_WORLD, kDev);
  REQUIRE(std::string(c->backend()) == "nccl");
  for (DType dt : {DType::F32, DType::BF16}) {
    Tensor t = Tensor::from_vector(iota(37, me == 1 ? 10.f : 1.f), {37}, DType::F32).to(dt).to(kDev);
    c->broadcast(t, 1);
    CHECK(t.to(DType::F32).to_floats() == iota(37, 10.f));
    // Both ranks send and receive at once (one NCCL group each): no deadlock.
    Tensor out = Tensor::from_vector(iota(1000, 100.f * (me + 1)), {1000}, DType::F32).to(dt).to(kDev);
    Tensor in = Tensor::zeros({1000}, dt, kDev);
    c->batch_p2p_async({{true, out, peer, 0}, {false, in, peer, 0}})->wait();
    CHECK(in.to(DType::F32).to_floats() == iota(1000, 100.f * (peer + 1)));
  }
  Tensor s = Tensor::from_vector(iota(9, 3.f), {9}, DType::F32).to(kDev);
  Tensor r = Tensor::zeros({9}, DType::F32, kDev);
  if (me == 0) c->send(s, 1);
  else c->recv(r, 0);
  if (me == 1) CHECK(r.to_floats() == iota(9, 3.f));
  c->barrier();
}

TEST_CASE("nccl stand-in: a bucket's all-reduce is in flight while later backward kernels run") {
  const int me = wrank();
  auto dp = make_communicator(MPI_COMM_WORLD, kDev);
  // Two parameters of 3000 elements, one bucket each (bucket 0 holds the last parameter).
  Tensor grads = Tensor::zeros({6000}, DType::F32, kDev);
  std::vector<FlatParam> params = {{0, 3000}, {3000, 3000}};
  DDPConfig cfg;
  cfg.bucket_size = 3000;
  GradBuckets b(grads, params, *dp, cfg);
  REQUIRE(b.num_buckets() == 2);
  b.begin_backward(true);
  if (me == 1) {  // rank 1 joins the bucket's collective only when rank 0 says so
    int go = 0;
    MPI_Recv(&go, 1, MPI_INT, 0, 7, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
  }
  grads.flat_range(3000, 3000).fill(2.0 + me);  // "backward" wrote parameter 1's gradient
  b.mark_ready(1);                               // its bucket starts reducing
  REQUIRE(b.bucket(0).launched);
  // Backward goes on: kernels for parameter 0's gradient on the default stream.
  Tensor g0 = grads.flat_range(0, 3000);
  for (int k = 0; k < 20; ++k) g0.fill(static_cast<double>(k + me));
  const float last = g0.to_floats()[5];  // the default stream ran all of them
  CHECK(last == static_cast<float>(19 + me));
  if (me == 0) {
    // They ran while the collective was waiting for rank 1: in flight.
    CHECK_FALSE(b.bucket(0).work->test());
    int go = 1;
    MPI_Send(&go, 1, MPI_INT, 1, 7, MPI_COMM_WORLD);
  }
  b.mark_ready(0);
  b.on_backward_done();
  b.wait_all();
  const std::vector<float> g = grads.to_floats();
  CHECK(g[3000] == doctest::Approx((2.0 + 3.0) / 2));  // averaged over dp
  CHECK(g[5999] == doctest::Approx((2.0 + 3.0) / 2));
  CHECK(g[0] == doctest::Approx((19.0 + 20.0) / 2));
}

TEST_CASE("nccl stand-in: a collective not ordered after its input's writer is a race") {
  ncclComm_t c = raw_comm();
  cudaStream_t s;
  REQUIRE(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) == cudaSuccess);
  Tensor t = Tensor::zeros({512}, DType::F32, kDev);
  t.fill(1.0);  // written on the default stream
  // No cudaStreamWaitEvent: refused at the call on both ranks, naming both streams.
  CHECK(ncclAllReduce(t.data_ptr(), t.data_ptr(), 512, ncclFloat32, ncclSum, c, s) == ncclInvalidUsage);
  const std::string why = ncclGetLastError(c);
  INFO(why);
  CHECK(why.find("stream race: ncclAllReduce on stream") != std::string::npos);
  CHECK(why.find("kernel fill_kernel on the legacy default stream wrote") != std::string::npos);  // the latest writer
  CHECK(why.find("cudaStreamWaitEvent") != std::string::npos);
  // Ordered by an event: runs, and the default stream reads the result after the completion event.
  cudaEvent_t ready, done;
  cudaEventCreateWithFlags(&ready, cudaEventDisableTiming);
  cudaEventCreateWithFlags(&done, cudaEventDisableTiming);
  REQUIRE(cudaEventRecord(ready, nullptr) == cudaSuccess);
  REQUIRE(cudaStreamWaitEvent(s, ready, 0) == cudaSuccess);
  REQUIRE(ncclAllReduce(t.data_ptr(), t.data_ptr(), 512, ncclFloat32, ncclSum, c, s) == ncclSuccess);
  REQUIRE(cudaEventRecord(done, s) == cudaSuccess);
  // Reading it on the default stream before waiting for `done` would race too.
  Tensor copy = Tensor::zeros({512}, DType::F32, kDev);
  CHECK(cudaMemcpyAsync(copy.data_ptr(), t.data_ptr(), 2048, cudaMemcpyDeviceToDevice, nullptr) ==
        cudaErrorIllegalState);
  cudaGetLastError();
  REQUIRE(cudaStreamWaitEvent(nullptr, done, 0) == cudaSuccess);
  CHECK(t.to_floats()[511] == 2.0f);
  ncclResult_t async = ncclInternalError;
  CHECK(ncclCommGetAsyncError(c, &async) == ncclSuccess);
  CHECK(async == ncclSuccess);
  cudaEventDestroy(ready);
  cudaEventDestroy(done);
  CHECK(ncclCommDestroy(c) == ncclSuccess);
  cudaStreamDestroy(s);
}

TEST_CASE("nccl stand-in: group semantics; an event recorded inside an open group is refused") {
  const int me = wrank(), peer = 1 - me;
  ncclComm_t c = raw_comm();
  cudaStream_t s;
  REQUIRE(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) == cudaSuccess);
  CHECK(ncclGroupEnd() == ncclInvalidUsage);  // without a start
  Tensor out = Tensor::from_vector(iota(64, 5.f * (me + 1)), {64}, DType::F32).to(kDev);
  Tensor in = Tensor::zeros({64}, DType::F32, kDev);
  REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
  cudaEvent_t done;
  cudaEventCreate(&done);
  REQUIRE(ncclGroupStart() == ncclSuccess);
  REQUIRE(ncclGroupStart() == ncclSuccess);  // nested: only the outermost end launches
  REQUIRE(ncclSend(out.data_ptr(), 64, ncclFloat32, peer, c, s) == ncclSuccess);
  REQUIRE(ncclGroupEnd() == ncclSuccess);
  REQUIRE(ncclRecv(in.data_ptr(), 64, ncclFloat32, peer, c, s) == ncclSuccess);
  // The send and receive are not queued yet: an event recorded now would not cover them.
  CHECK(cudaEventRecord(done, s) == cudaErrorIllegalState);
  CHECK(std::string(cudaGetErrorString(cudaErrorIllegalState)).find("an ncclGroupEnd missing") != std::string::npos);
  cudaGetLastError();
  CHECK(ncclRecv(in.data_ptr(), 64, ncclFloat32, 7, c, s) == ncclInvalidArgument);  // no rank 7
  REQUIRE(ncclGroupEnd() == ncclSuccess);
  REQUIRE(cudaEventRecord(done, s) == cudaSuccess);
  REQUIRE(cudaStreamWaitEvent(nullptr, done, 0) == cudaSuccess);
  CHECK(in.to_floats() == iota(64, 5.f * (peer + 1)));
  cudaEventDestroy(done);
  CHECK(ncclCommDestroy(c) == ncclSuccess);
  cudaStreamDestroy(s);
}

TEST_CASE("nccl stand-in: ncclCommAbort stops an operation that cannot complete; the async error says so") {
  const int me = wrank();
  ncclComm_t c = raw_comm();
  cudaStream_t s;
  REQUIRE(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) == cudaSuccess);
  Tensor in = Tensor::zeros({16}, DType::F32, kDev);
  REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
  if (me == 0) {  // a receive rank 1 never matches
    REQUIRE(ncclRecv(in.data_ptr(), 16, ncclFloat32, 1, c, s) == ncclSuccess);
    CHECK(cudaStreamQuery(s) == cudaErrorNotReady);
    ncclResult_t async = ncclInternalError;
    CHECK(ncclCommGetAsyncError(c, &async) == ncclSuccess);
    CHECK(async == ncclSuccess);
    CHECK(ncclCommAbort(c) == ncclSuccess);
    CHECK(cudaStreamSynchronize(s) == cudaSuccess);  // the receive gave up
    CHECK(ncclCommGetAsyncError(c, &async) == ncclSuccess);
    CHECK(async == ncclRemoteError);
    CHECK(ncclSend(in.data_ptr(), 16, ncclFloat32, 1, c, s) == ncclInvalidUsage);
  } else {
    CHECK(ncclCommDestroy(c) == ncclSuccess);
  }
  MPI_Barrier(MPI_COMM_WORLD);
  cudaStreamDestroy(s);
}
