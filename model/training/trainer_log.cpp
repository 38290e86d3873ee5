// The log interval's output (model/training/trainer_impl.h): Megatron's iteration line,
// its TensorBoard scalars (Megatron-LM's tags, or Megatron-DeepSpeed's with --deepspeed,
// docs/training.md) and the metrics JSONL row. The model kind writes the loss fields and
// any of its own (ModelKind::log_interval).
#include <cmath>

#include "core/allocator.h"
#include "core/device_memory.h"
#include "core/log.h"
#include "model/training/train_stats.h"
#include "model/training/trainer_impl.h"

namespace mpitron {

namespace {

// The interval's numbers the line, TensorBoard and metrics share.
struct IntervalNumbers {
  double secs = 0, ms = 0, tps = 0, flops = 0, avg = 0;
  float lr = 0;
  double peak_mb = 0, reserved_mb = 0;
  double params_norm = NAN;
  int64_t zeros = -1;
};

}  // namespace

void Trainer::Impl::tb_scalar(const std::string& group, const std::string& name, double v, bool vs_samples) {
  if (!tb) return;
  const std::string tag = args.deepspeed ? str(group, "/", name) : name;
  tb->add_scalar(tag, v, st.iteration);
  if (vs_samples) tb->add_scalar(tag + " vs samples", v, st.consumed_train_samples);
}

void Trainer::Impl::log(const Step& s, TrainSummary& sum) {
  const TrainArgs& a = args;
  IntervalNumbers n;
  n.secs = interval.timer.seconds();
  n.ms = 1e3 * n.secs / static_cast<double>(interval.iters);
  n.tps = static_cast<double>(interval.tokens) / n.secs;
  n.flops = n.tps * a.model.flops_per_token();
  n.avg = interval.loss_n ? interval.loss / static_cast<double>(interval.loss_n) : NAN;
  // Megatron's convention: the learning rate after this step's scheduler update (what the next step uses).
  n.lr = static_cast<float>(lr->lr_at(static_cast<double>(schedule_step())));
  // Live tensor peak, and what is reserved for it: CUDA the caching allocator's
  // segments (live + cached); the CPU has no cache of ours (malloc's is not seen).
  const MemoryStats mem = memory_stats(device);
  n.peak_mb = static_cast<double>(mem.peak_bytes) / 1e6;
  n.reserved_mb = (device.is_cuda() ? static_cast<double>(cuda_caching_allocator(device.index).stats().reserved_bytes)
                                    : static_cast<double>(mem.current_bytes)) / 1e6;
  LogFields losses, own;
  kind->log_interval(n.avg, losses, own);
  straggler->report(own);  // --log-straggler (collective)

  char line[896];
  std::snprintf(line, sizeof line,
                " iteration %8lld/%8lld | consumed samples: %12lld | elapsed time per iteration (ms): %.1f | "
                "learning rate: %.6E | global batch size: %5lld | %s | loss scale: %.1f | "
                "grad norm: %.3f | number of skipped iterations: %3lld | number of nan iterations: %3lld | "
                "tokens/s: %.0f | TFLOP/s: %.4f | MFU: %.2f%% | peak memory (MB): %.1f | "
                "reserved memory (MB): %.1f |",
                static_cast<long long>(st.iteration), static_cast<long long>(total_iters),
                static_cast<long long>(st.consumed_train_samples), n.ms, n.lr, static_cast<long long>(s.gbs),
                losses.text.c_str(), s.scale, s.result.grad_norm, static_cast<long long>(interval.skipped),
                static_cast<long long>(interval.nan), n.tps, n.flops / 1e12, 100.0 * n.flops / peak, n.peak_mb,
                n.reserved_mb);
  std::string extra;
  if (a.log_params_norm) {
    states->whole();
    n.params_norm = params_l2_norm(model->params(), par.mp);
    char buf[64];
    std::snprintf(buf, sizeof buf, " params norm: %.3f |", n.params_norm);
    extra += buf;
  }
  extra += own.text;
  if (a.log_num_zeros_in_grad) {
    const auto [zb, ze] = states->state_range();
    n.zeros = count_zero_grads(model->params(), states->grad_slice(), zb, ze, par.mp,
                               states->sharded() ? grad_mpi_comm() : MPI_COMM_NULL);
    extra += str(" number of zeros in grad: ", n.zeros, " |");
  }
  log_info(line, extra);

  if (tb) {
    for (const LogFields::Scalar& x : losses.scalars) tb_scalar(x.group, x.name, x.value);
    tb_scalar("learning-rate", "learning-rate", n.lr);
    tb_scalar("batch-size", "batch-size", static_cast<double>(s.gbs));
    tb_scalar("loss-scale", "loss-scale", s.scale);
    tb_scalar("grad-norm", "grad-norm", s.result.grad_norm);
    if (a.log_params_norm) tb_scalar("params-norm", "params-norm", n.params_norm);
    if (a.log_num_zeros_in_grad) tb_scalar("num-zeros", "num-zeros", static_cast<double>(n.zeros));
    for (const LogFields::Scalar& x : own.scalars) tb_scalar(x.group, x.name, x.value);
    int ranks = 1;
    if (world_comm() != MPI_COMM_NULL) MPI_Comm_size(world_comm(), &ranks);
    tb_scalar("throughput", "throughput", n.flops / 1e12 / ranks, false);  // Megatron's: TFLOP/s per rank
    tb_scalar("throughput", "tokens-per-second", n.tps, false);
    if (a.log_timers_to_tensorboard) {
      const double n_it = static_cast<double>(interval.iters);
      tb->add_scalar("iteration-time", n.secs / n_it, st.iteration);
      tb->add_scalar("forward-backward-time", 1e3 * interval.fwd_bwd_s / n_it, st.iteration);
      tb->add_scalar("optimizer-time", 1e3 * interval.optim_s / n_it, st.iteration);
    }
    tb->flush();
  }
  if (metrics) {
    nlohmann::json row{{"consumed_samples", st.consumed_train_samples}, {"lr", n.lr}, {"global_batch_size", s.gbs},
                       {"loss_scale", s.scale}, {"grad_norm", s.result.grad_norm},
                       {"skipped_iterations", interval.skipped}, {"nan_iterations", interval.nan},
                       {"ms_per_iteration", n.ms}, {"tokens_per_second", n.tps},
                       {"tflops", n.flops / 1e12}, {"mfu", n.flops / peak}};
    row.update(losses.metrics);
    row.update(own.metrics);
    metrics->log_json(st.iteration, row);
  }
  sum.peak_memory_bytes = memory_stats(device).peak_bytes;
  sum.estimated_memory_bytes = estimated_memory_bytes;
  if (!first_logged) sum.first_loss = n.avg;
  first_logged = true;
  sum.last_loss = n.avg;
  sum.tokens_per_second = n.tps;
  interval = Interval();  // its timer starts now
}

}  // namespace mpitron
