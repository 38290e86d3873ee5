// tests/parallel/test_zero.cpp — ZeRO-1 and ZeRO-2 AdamW over 2/4 real ranks
// against a single-process ReplicatedOptimizer (model/training/optimizer.h) fed the
// dp-averaged gradients, for a ParamSet of several parameters with mixed
// weight decay whose shards cut through parameters and decay segments; two
// micro-batches per step, loss scaling and gradient clipping included.
// mpitron-test: np=2,4
// mpitron-test: timeout=300
#include <doctest/doctest.h>

#include <cmath>
#include <cstdio>
#include <limits>
#include <string>

#include "core/device.h"
#include "model/training/optimizer.h"
#include "model/params.h"
#include "parallel/zero.h"

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

// 117 elements: with 4 ranks, shards of 30 (the last 27) cut through w1, w2, emb.
void declare(ParamSet& p) {
  p.add("w1", {5, 7}, true);
  p.add("b1", {7}, false);
  p.add("ln", {7}, false);
  p.add("w2", {7, 3}, true);
  p.add("b2", {3}, false);
  p.add("emb", {11, 4}, true);
}
std::vector<FlatParam> flat(const ParamSet& p) {
  std::vector<FlatParam> v;
  for (const ParamInfo& i : p.infos()) v.push_back({i.offset, i.numel(), i.weight_decay});
  return v;
}
// Initial values: magnitudes in [0.5, 1.5), mixed signs (relative errors stay meaningful).
std::vector<float> init_values(int64_t n) {
  std::vector<float> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i)
    v[static_cast<size_t>(i)] = (i % 3 == 0 ? -1.f : 1.f) * (0.5f + static_cast<float>((i * 37) % 100) / 100.f);
  return v;
}
// Rank r's (unscaled) gradient of element i at step s, micro-batch k.
float grad(int r, int s, int k, int64_t i) {
  const uint32_t h = static_cast<uint32_t>(r * 7919 + s * 1543 + k * 613 + i * 104729 + 11) * 2654435761u;
  return (static_cast<float>(h >> 8) / 16777216.0f - 0.5f) * (1.0f + static_cast<float>(s));
}
double max_rel_err(const std::vector<float>& got, const std::vector<float>& want) {
  double m = 0;
  for (size_t i = 0; i < got.size(); ++i)
    m = std::max(m, std::fabs(static_cast<double>(got[i]) - want[i]) / std::fabs(static_cast<double>(want[i])));
  return m;
}

struct Case {
  int stage;
  DType dtype;
  bool hooks;           // drive begin_micro_batch/mark_ready/on_backward_done (else only step)
  int64_t bucket_size;
  Device device = Device::cpu();
  bool overlap_gather = false;  // --overlap-param-gather: step() leaves the all-gathers in flight
  std::string optimizer = "adam";  // --optimizer (parallel/update_rule.h)
};

void run_case(const Case& cs) {
  const int r = wrank(), n = wsize();
  const int steps = 4, micro = 2;
  const float loss_scale = 8.0f;  // gradients arrive multiplied by it
  OptimizerConfig oc;
  oc.weight_decay = 0.1f;
  oc.clip_grad = 1.5f;  // clips in the later steps (gradients grow with s)
  oc.optimizer = cs.optimizer;
  const float lrs[steps] = {1e-2f, 2e-2f, 5e-3f, 1e-2f};

  // The reference: one process, averaged gradients.
  ParamSet ref;
  declare(ref);
  ref.allocate(cs.dtype, Device::cpu());
  const int64_t N = ref.numel();
  ref.values().copy_from(Tensor::from_vector(init_values(N), {N}, cs.dtype));
  ReplicatedOptimizer ropt(ref, oc);

  ParamSet mine;
  declare(mine);
  mine.allocate(cs.dtype, cs.device);
  mine.values().copy_from(Tensor::from_vector(init_values(N), {N}, cs.dtype).to(cs.device));
  CommOptions co;
  co.name = "dp";
  // Device tensors: NCCL with one GPU per rank (each rank has its own simulated one), else MPI staged through host.
#if defined(MPITRON_CUDA_SIM)
  co.force_mpi_for_device = false;
#else
  co.force_mpi_for_device = cuda_device_count() < n;
#endif
  auto dp = make_communicator(MPI_COMM_WORLD, cs.device, co);
  ZeroConfig zc;
  zc.stage = cs.stage;
  zc.optim = oc;
  zc.ddp.bucket_size = cs.bucket_size;
  zc.overlap_param_gather = cs.overlap_gather;
  ZeroOptimizer zopt(mine.values(), mine.grads(), flat(mine), *dp, zc);
  CHECK(zopt.shard_begin() == ShardLayout(N, n).begin(r));

  for (int s = 0; s < steps; ++s) {
    // Reference gradient: Σ over micro-batches of the mean over ranks, times the loss scale.
    std::vector<float> avg(static_cast<size_t>(N));
    for (int64_t i = 0; i < N; ++i) {
      double t = 0;
      for (int k = 0; k < micro; ++k)
        for (int q = 0; q < n; ++q) t += grad(q, s, k, i);
      avg[static_cast<size_t>(i)] = static_cast<float>(loss_scale * t / n);
    }
    ref.zero_grad();
    ref.grads().copy_from(Tensor::from_vector(avg, {N}));
    const StepResult want = ropt.step(lrs[s], loss_scale);

    zopt.zero_grad();
    for (int k = 0; k < micro; ++k) {
      if (cs.hooks) zopt.begin_micro_batch(k == micro - 1);
      // "Backward": accumulate this micro-batch's gradient, parameters completing last-first.
      std::vector<float> g = mine.grads().to_floats();
      for (int64_t i = 0; i < N; ++i) g[static_cast<size_t>(i)] += loss_scale * grad(r, s, k, i);
      mine.grads().copy_from(Tensor::from_vector(g, {N}).to(cs.device));
      if (cs.hooks) {
        for (size_t p = mine.infos().size(); p-- > 0;) zopt.mark_ready(p);
        zopt.on_backward_done();
      }
    }
    const StepResult got = zopt.step(lrs[s], loss_scale);
    INFO("stage ", cs.stage, " dtype ", dtype_name(cs.dtype), " hooks ", cs.hooks, " bucket ", cs.bucket_size,
         " overlap ", cs.overlap_gather, " step ", s, " rank ", r, " np ", n);
    if (cs.overlap_gather) {
      // A "forward" that reads the parameters last-first, each right after its own
      // buckets arrived (the next step gathers in that order).
      for (size_t p = mine.infos().size(); p-- > 0;) {
        zopt.params_needed(p, p + 1);
        const ParamInfo& pi = mine.infos()[p];
        CHECK(max_rel_err(mine.values().flat_range(pi.offset, pi.numel()).to_floats(),
                          ref.values().flat_range(pi.offset, pi.numel()).to_floats()) <=
              (cs.dtype == DType::F32 ? 1e-6 : 1.0 / 128));
      }
    }
    CHECK_FALSE(got.skipped);
    CHECK(std::fabs(got.grad_norm - want.grad_norm) <= 1e-6 * want.grad_norm);
    // Every rank holds the full, updated replica.
    const double err = max_rel_err(mine.values().to_floats(), ref.values().to_floats());
    if (cs.dtype == DType::F32)
      CHECK(err <= 1e-6);
    else
      CHECK(err <= 1.0 / 128);  // one bf16 ulp: masters within 1e-6 may round to neighbours
    // The owned slice of the f32 master, and the moments.
    const int64_t b = zopt.shard_begin(), len = zopt.shard_end() - b;
    const auto slice = [&](const Tensor& t) { return t.flat_range(b, len).to_floats(); };
    CHECK(max_rel_err(zopt.master_shard().to_floats(), slice(ropt.master())) <= 1e-6);
    if (cs.optimizer == "adam")
      CHECK(max_rel_err(zopt.exp_avg_sq_shard().to_floats(), slice(ropt.exp_avg_sq())) <= 1e-5);
    else {  // sgd: the momentum buffer, the one state (relative to its largest element: sums may cancel)
      const std::vector<float> m = zopt.exp_avg_shard().to_floats(), w = slice(ropt.exp_avg());
      double diff = 0, big = 0;
      for (size_t i = 0; i < m.size(); ++i) {
        diff = std::max(diff, std::fabs(static_cast<double>(m[i]) - w[i]));
        big = std::max(big, std::fabs(static_cast<double>(w[i])));
      }
      CHECK(diff <= 1e-5 * big);
    }
  }
  CHECK(zopt.steps_taken() == steps);
}
}  // namespace

TEST_CASE("zero: ZeRO-1 and ZeRO-2 AdamW == single-process AdamW on the averaged gradients") {
  int up = 0;
  MPI_Initialized(&up);
  REQUIRE(up);
  for (int stage : {1, 2})
    for (int64_t bucket : {int64_t{0}, int64_t{10}}) run_case({stage, DType::F32, true, bucket});
  run_case({1, DType::F32, false, 16});  // no hooks: step() reduces the accumulated buffer itself
  run_case({2, DType::F32, false, 16});
  run_case({1, DType::BF16, true, 16});  // separate f32 master
  run_case({2, DType::BF16, true, 16});
  run_case({2, DType::F32, true, 10, Device::cpu(), true});  // the parameter all-gather overlapped
  run_case({1, DType::BF16, true, 16, Device::cpu(), true});
}

TEST_CASE("zero: ZeRO-1 and ZeRO-2 SGD with momentum == single-process SGD on the averaged gradients") {
  for (int stage : {1, 2}) {
    Case c{stage, DType::F32, true, 10};
    c.optimizer = "sgd";
    run_case(c);
  }
  Case bf{1, DType::BF16, true, 16};  // separate f32 master
  bf.optimizer = "sgd";
  run_case(bf);
}

TEST_CASE("zero cuda: ZeRO-1/2 on device tensors == single-process AdamW on the host") {
  const int r = wrank(), n = wsize();
  (void)n;
  if (!cuda_available()) {
    if (r == 0) std::printf("SKIPPED cuda: %s\n", cuda_unavailable_reason().c_str());
    return;
  }
  cuda_set_device(r % cuda_device_count());
  const Device dev = Device::cuda(cuda_current_device());
  if (r == 0)
#if defined(MPITRON_CUDA_SIM)
    std::printf("zero cuda: nccl backend (the simulated device's stand-in)\n");
#else
    std::printf("zero cuda: %s backend\n", cuda_device_count() >= n ? "nccl" : "mpi staged through host");
#endif
  for (int stage : {1, 2}) {
    run_case({stage, DType::F32, true, 10, dev});
    run_case({stage, DType::BF16, true, 16, dev});
  }
  run_case({2, DType::F32, true, 10, dev, true});

}

TEST_CASE("zero: a non-finite gradient on one rank skips the step on every rank") {
  const int r = wrank(), n = wsize();
  ParamSet p;
  declare(p);
  p.allocate(DType::F32, Device::cpu());
  const int64_t N = p.numel();
  p.values().copy_from(Tensor::from_vector(init_values(N), {N}));
  auto dp = make_mpi_communicator(MPI_COMM_WORLD);
  ZeroConfig zc;
  zc.stage = 1;
  ZeroOptimizer z(p.values(), p.grads(), flat(p), *dp, zc);
  z.zero_grad();
  std::vector<float> g(static_cast<size_t>(N), 0.25f);
  if (r == n - 1) g[3] = std::numeric_limits<float>::infinity();  // owned by rank 0
  p.grads().copy_from(Tensor::from_vector(g, {N}));
  const StepResult res = z.step(1e-2f, 1.0f);
  CHECK(res.skipped);
  CHECK(p.values().to_floats() == init_values(N));
  CHECK(z.steps_taken() == 0);
}

