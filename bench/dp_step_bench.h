// bench/dp_step_bench.h — the data-parallel training step with and without
// overlap, at dp 2 and 4 (bench_comm --dp-step PRESET).
//
// For each dp in {2, 4} that fits the world, the world is cut into groups of dp
// consecutive ranks (ranks beyond the last whole group idle) and each group
// trains a GPT of the preset (train_step_bench.h) through the trainer's own model
// states (model/training/model_states.h), one step as the trainer drives it:
//   dp    plain data parallelism: gradient buckets all-reduced (GradBuckets) then
//         AdamW; overlap on = each bucket's all-reduce starts during backward as
//         soon as its gradients are final (--overlap-grad-reduce), off = all of
//         them after backward (--no-overlap-grad-reduce);
//   zero2 ZeRO-2 (ZeroOptimizer stage 2): buckets reduce-scattered during
//         backward, and --overlap-param-gather: the updated parameters'
//         all-gather left in flight after the step and waited for bucket by
//         bucket by the next forward; off = both after backward / in the step;
//   zero3 ZeRO-3: each block all-gathered before its forward and backward and its
//         gradients reduce-scattered after it; overlap on = the next block's
//         gather prefetched (stage3_prefetch_bucket_size > 0), off = none.
// Row: ms per step = the median over the timed steps of the slowest rank's step
// (a barrier before each step, the device synchronised at its end), and the
// saving of overlap. Buckets: --dp-bucket elements (default: an eighth of the
// model, so there is something to overlap). Tokens are synthetic.
// On CUDA the communicator is NCCL when every rank has its own GPU, else MPI
// staged through host memory (several ranks sharing one GPU: the numbers then
// measure the staging, not NCCL).
#pragma once
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "bench/train_step_bench.h"
#include "parallel/communicator.h"
#include "parallel/data_parallel.h"
#include "model/training/model_states.h"
#include "parallel/zero.h"

namespace mpitron::bench {

struct DpStepOptions {
  std::string preset = "tiny";
  DType dtype = DType::F32;
  int64_t batch = 4, seq = 128;
  int warmup = 1, steps = 4;
  int64_t bucket = 0;  // elements per bucket; 0: an eighth of the model
};

struct DpStepRow {
  int dp = 0;
  std::string mode, backend;
  double ms_off = 0, ms_on = 0;
};

// Median over steps of the slowest rank's step (ms), for one (mode, overlap) on `dp`.
inline double dp_step_ms(const DpStepOptions& o, const GPTConfig& cfg, Device dev, Communicator& dp,
                         const std::string& mode, bool overlap, int64_t bucket) {
  GPT model(cfg, dev);
  fast_init(model, 1234);
  // The trainer's own model states (model/training/model_states.h): dp = replicated with
  // gradient buckets, zero2 = ZeRO-2, zero3 = ZeRO-3 (blocks gathered on demand).
  StatesConfig sc;
  sc.stage = mode == "dp" ? 0 : mode == "zero2" ? 2 : 3;
  sc.ddp.bucket_size = bucket;
  sc.ddp.overlap_grad_reduce = overlap;
  sc.overlap_param_gather = overlap && sc.stage == 2;
  sc.zero3.prefetch = overlap;
  std::unique_ptr<ModelStates> states = make_model_states(sc, model, &dp, nullptr);
  std::mt19937 rng(static_cast<uint32_t>(7 + dp.rank()));
  std::uniform_int_distribution<int> tok(0, static_cast<int>(cfg.vocab_size) - 1);
  std::vector<int64_t> in(static_cast<size_t>(o.batch * o.seq)), tg(in.size());
  for (size_t i = 0; i < in.size(); ++i) in[i] = tok(rng), tg[i] = tok(rng);
  const Tensor tokens = Tensor::from_ints(in, {o.batch, o.seq}), targets = Tensor::from_ints(tg, {o.batch, o.seq});
  std::vector<double> times;
  for (int it = 0; it < o.warmup + o.steps; ++it) {
    device_synchronize();
    MPI_Barrier(dp.mpi_comm());
    const auto t0 = std::chrono::steady_clock::now();
    states->zero_grad();
    states->begin_backward(true);
    ForwardOptions f;
    states->add_hooks(f, true);
    Tape tape;
    Var loss = model.forward(tape, tokens, targets, f);
    tape.backward(loss, 1.0f);
    states->end_backward();
    states->step(1e-4f, 1.0f, {});
    device_synchronize();
    double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count(), worst = 0;
    MPI_Allreduce(&ms, &worst, 1, MPI_DOUBLE, MPI_MAX, dp.mpi_comm());
    if (it >= o.warmup) times.push_back(worst);
  }
  states->whole();
  std::sort(times.begin(), times.end());
  return times[times.size() / 2];
}

// Runs every dp in {2, 4} that fits the world; rows are complete on world rank 0.
inline std::vector<DpStepRow> run_dp_step_bench(const DpStepOptions& o, Device dev) {
  int rank = 0, world = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  GPTConfig cfg;
  apply_preset(find_preset(o.preset), cfg);
  cfg.seq_length = o.seq;
  cfg.max_position_embeddings = std::max<int64_t>(cfg.max_position_embeddings, o.seq);
  cfg.compute_dtype = o.dtype;
  cfg.hidden_dropout = 0;
  cfg.attention_dropout = 0;
  const int64_t bucket = o.bucket > 0 ? o.bucket : std::max<int64_t>(1, cfg.num_parameters() / 8);
  std::vector<DpStepRow> rows;
  for (int dp : {2, 4}) {
    if (dp > world) continue;
    const int groups = world / dp;
    const int color = rank < groups * dp ? rank / dp : MPI_UNDEFINED;
    MPI_Comm sub = MPI_COMM_NULL;
    MPI_Comm_split(MPI_COMM_WORLD, color, rank, &sub);
    DpStepRow rr[3];
    if (sub != MPI_COMM_NULL) {
      CommOptions co;
      co.name = "dp";
      // NCCL needs a GPU per rank; ranks sharing a GPU go through MPI (staged via host memory).
      int local = 0;
      MPI_Comm node;
      MPI_Comm_split_type(sub, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &node);
      MPI_Comm_size(node, &local);
      MPI_Comm_free(&node);
      co.force_mpi_for_device = dev.is_cuda() && local > cuda_device_count();
      {
        auto comm = make_communicator(sub, dev, co);
        const char* modes[3] = {"dp", "zero2", "zero3"};
        for (int m = 0; m < 3; ++m) {
          rr[m].dp = dp;
          rr[m].mode = modes[m];
          rr[m].backend = comm->backend();
          rr[m].ms_off = dp_step_ms(o, cfg, dev, *comm, modes[m], false, bucket);
          rr[m].ms_on = dp_step_ms(o, cfg, dev, *comm, modes[m], true, bucket);
        }
      }
      MPI_Comm_free(&sub);
    }
    MPI_Barrier(MPI_COMM_WORLD);
    if (rank == 0) rows.insert(rows.end(), {rr[0], rr[1], rr[2]});
  }
  return rows;
}

inline void print_dp_step_rows(const DpStepOptions& o, Device dev, const std::vector<DpStepRow>& rows) {
  std::printf("\ndata-parallel step, %s %s on %s, B=%lld T=%lld, %d timed steps after %d warm-up "
              "(ms = median of the slowest rank's step)\n",
              o.preset.c_str(), dtype_name(o.dtype), dev.name().c_str(), static_cast<long long>(o.batch),
              static_cast<long long>(o.seq), o.steps, o.warmup);
  std::printf("%4s %-6s %-8s %12s %12s %9s\n", "dp", "mode", "backend", "overlap off", "overlap on", "saved");
  for (const DpStepRow& r : rows)
    std::printf("%4d %-6s %-8s %9.2f ms %9.2f ms %8.1f%%\n", r.dp, r.mode.c_str(), r.backend.c_str(), r.ms_off,
                r.ms_on, 100.0 * (1.0 - r.ms_on / r.ms_off));
  std::fflush(stdout);
}

}  // namespace mpitron::bench
