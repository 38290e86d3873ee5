// tests/model/trainer_test_util.h — the parallel-layout trainer tests' harness
// (test_trainer_mp.cpp, test_trainer_zero3.cpp): the small GPT's flags, one training
// on a communicator, the single-process reference broadcast from rank 0, and the
// comparisons (1e-5 relative in f32).
#pragma once
#include <doctest/doctest.h>
#include <mpi.h>

#include <cmath>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "model/training/arguments.h"
#include "model/training/gpt_data.h"
#include "model/training/parallel_runtime.h"
#include "model/training/trainer.h"
#include "tests/model/mpi_test_util.h"

namespace mpitron::testing::trainer {

// MPITRON_TEST_DEVICE=cuda runs the same layouts on the GPU (tools/gpu_check.sh):
// the ranks share one GPU, so their device tensors go through MPI (host-staged).
// On the simulated device (make test-cuda-sim) every rank has its own device and
// the communicators are NCCL's (the stand-in of tests/cuda_sim/nccl.cpp).
inline std::string test_device() {
  const char* d = std::getenv("MPITRON_TEST_DEVICE");
  return d && *d ? d : "cpu";
}

inline std::vector<std::string> flags(const std::string& data) {
  std::vector<std::string> f = {"--num-layers", "4", "--hidden-size", "32", "--num-attention-heads", "4", "--seq-length", "16",
          "--micro-batch-size", "2", "--global-batch-size", "16", "--train-iters", "10", "--lr", "3e-3",
          "--lr-warmup-iters", "2", "--lr-decay-style", "cosine", "--hidden-dropout", "0.1",
          "--attention-dropout", "0.1", "--data-path", data,
          "--split", "90,10,0", "--log-interval", "5", "--eval-interval", "5", "--eval-iters", "1", "--seed", "7",
          "--device", test_device(), "--ddp-bucket-size", "3000"};
#if !defined(MPITRON_CUDA_SIM)
  if (test_device() == "cuda") f.push_back("--force-mpi-for-device");
#endif
  return f;
}

struct Result {
  std::vector<double> losses, grad_norms;
  double valid_loss = 0;
  std::vector<double> aux_losses;  // MoE: the load-balancing loss per iteration
  double peak_bytes = 0;           // this rank's measured tensor peak (single_process: rank 0's)
};

// The flags parsed into `a` (which may carry the world or dp size already), with GPT-2's
// vocabulary.
inline void parse_test_flags(std::vector<std::string> f, TrainArgs& a) {
  std::vector<char*> argv{const_cast<char*>("pretrain_gpt")};
  for (auto& s : f) argv.push_back(s.data());
  REQUIRE(parse_train_args(static_cast<int>(argv.size()), argv.data(), a));
  a.model.vocab_size = 50257;
  a.model.padded_vocab_size = 50304;
}

// The flags' dataset on every rank of the world: rank 0 builds the index caches first,
// the others then load them.
inline std::shared_ptr<SampleSource> test_gpt_data(const TrainArgs& a) {
  std::shared_ptr<SampleSource> data;
  if (world_rank() == 0) data = make_gpt_data(a, 50257);
  MPI_Barrier(MPI_COMM_WORLD);
  if (world_rank() != 0) data = make_gpt_data(a, 50257);
  return data;
}

// Trains on `comm` (MPI_COMM_SELF: one process) with the layout the flags give.
inline Result run(std::vector<std::string> f, MPI_Comm comm) {
  int size = 1;
  MPI_Comm_size(comm, &size);
  TrainArgs a;
  a.world_size = size;
  parse_test_flags(std::move(f), a);
  const std::shared_ptr<SampleSource> data = test_gpt_data(a);
  ParallelRuntime rt(comm, a);
#if defined(MPITRON_CUDA_SIM)
  if (test_device() == "cuda") {  // through parallel/comm_nccl.cpp
    const ParallelContext ctx = rt.context();
    for (Communicator* c : {ctx.dp, ctx.tp, ctx.pp, ctx.mp, ctx.embedding})
      if (c) CHECK_MESSAGE(std::string(c->backend()) == "nccl", c->describe());
  }
#endif
  Trainer t(a, data, rt.context());
  const TrainSummary s = t.run();
  if (rt.grid().tp_size() > 1) testing::check_tp_replicas_identical(t.model().params(), rt.grid().tp_comm());
  // The start-up estimate of this rank's memory agrees with the measured peak.
  // On CUDA the caching allocator hands out blocks of 1 MiB and more rounded up to
  // 2 MiB (core/allocator.cpp), which the estimate does not model: up to 1 MiB per
  // large buffer (weights, gradients, moments, logits, …) on top of the 10%.
  const double est = static_cast<double>(s.estimated_memory_bytes), peak = static_cast<double>(s.peak_memory_bytes);
  const double rounding = test_device() == "cuda" ? 16.0 * (1 << 20) : 0.0;
  CHECK_MESSAGE(std::abs(peak - est) <= 0.1 * est + rounding, "rank ", world_rank(), ": measured peak ", peak / 1e6,
                " MB vs estimate ", est / 1e6, " MB");
  return {s.losses, s.grad_norms, s.valid_loss, s.moe_aux_losses, peak};
}

// The single-process reference of a layout test: rank 0 trains it (alone, on
// MPI_COMM_SELF) and the other ranks receive its numbers — every rank training the
// same model only cost CPU time, the ranks sharing few cores.
inline Result single_process(const std::vector<std::string>& f) {
  Result r;
  if (world_rank() == 0) r = run(f, MPI_COMM_SELF);
  else MPI_Barrier(MPI_COMM_WORLD);  // run()'s barrier: rank 0 has built the dataset's index caches
  const auto bcast = [](std::vector<double>& v) {
    int n = static_cast<int>(v.size());
    MPI_Bcast(&n, 1, MPI_INT, 0, MPI_COMM_WORLD);
    v.resize(static_cast<size_t>(n));
    MPI_Bcast(v.data(), n, MPI_DOUBLE, 0, MPI_COMM_WORLD);
  };
  bcast(r.losses);
  bcast(r.grad_norms);
  bcast(r.aux_losses);
  MPI_Bcast(&r.valid_loss, 1, MPI_DOUBLE, 0, MPI_COMM_WORLD);
  MPI_Bcast(&r.peak_bytes, 1, MPI_DOUBLE, 0, MPI_COMM_WORLD);
  return r;
}

inline void check_close(const Result& got, const Result& want, double rel, const std::string& what) {
  REQUIRE(got.losses.size() == want.losses.size());
  REQUIRE(got.grad_norms.size() == want.grad_norms.size());
  for (size_t i = 0; i < got.losses.size(); ++i) {
    CHECK_MESSAGE(std::abs(got.losses[i] - want.losses[i]) <= rel * std::abs(want.losses[i]), what, " iteration ",
                  i + 1, " loss ", got.losses[i], " vs ", want.losses[i]);
    CHECK_MESSAGE(std::abs(got.grad_norms[i] - want.grad_norms[i]) <= rel * std::abs(want.grad_norms[i]), what,
                  " iteration ", i + 1, " grad norm ", got.grad_norms[i], " vs ", want.grad_norms[i]);
  }
  CHECK_MESSAGE(std::abs(got.valid_loss - want.valid_loss) <= rel * std::abs(want.valid_loss), what,
                " validation loss ", got.valid_loss, " vs ", want.valid_loss);
  REQUIRE(got.aux_losses.size() == want.aux_losses.size());
  for (size_t i = 0; i < got.aux_losses.size(); ++i)
    CHECK_MESSAGE(std::abs(got.aux_losses[i] - want.aux_losses[i]) <= rel * std::abs(want.aux_losses[i]), what,
                  " iteration ", i + 1, " load-balancing loss ", got.aux_losses[i], " vs ", want.aux_losses[i]);
}

// f with `extra` appended.
inline std::vector<std::string> plus(std::vector<std::string> f, const std::vector<std::string>& extra) {
  f.insert(f.end(), extra.begin(), extra.end());
  return f;
}

inline std::vector<std::string> with(std::vector<std::string> f, std::initializer_list<const char*> extra) {
  for (const char* e : extra) f.push_back(e);
  return f;
}

// Losses of part of a run against the single-process ones, within 1e-5 relative.
inline void check_part(const std::vector<double>& got, const std::vector<double>& want, const std::string& what) {
  REQUIRE(got.size() == want.size());
  for (size_t i = 0; i < got.size(); ++i)
    CHECK_MESSAGE(std::abs(got[i] - want[i]) <= 1e-5 * std::abs(want[i]), what, " step ", i, ": ", got[i], " vs ",
                  want[i]);
}

// The same run as a Llama-family model with grouped-query attention (4 heads,
// 2 kv groups), RMSNorm, SwiGLU, rope, an untied output layer and no biases.
inline std::vector<std::string> llama_flags(const std::string& data) {
  return with(flags(data), {"--group-query-attention", "--num-query-groups", "2", "--ffn-hidden-size", "48",
                            "--normalization", "RMSNorm", "--norm-epsilon", "1e-5", "--swiglu",
                            "--position-embedding-type", "rope", "--rotary-base", "1000",
                            "--untie-embeddings-and-output-weights", "--disable-bias-linear"});
}

}  // namespace mpitron::testing::trainer
