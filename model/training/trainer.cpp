#include "model/training/trainer.h"

#include <algorithm>
#include <chrono>
#include <cblas.h>
#include <csignal>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
#include <random>
#include <nlohmann/json.hpp>

#include "core/device_memory.h"
#include "core/allocator.h"
#include "core/log.h"
#include "core/timer.h"
#include "io/checkpoint.h"
#include "model/training/async_save.h"
#include "io/metrics_jsonl.h"
#include "io/tensorboard.h"
#include "model/training/train_model.h"
#include "model/training/train_stats.h"
#include "model/gpt.h"
#include "model/memory.h"
#include "model/training/model_states.h"
#include "model/training/optimizer.h"
#include "model/training/lr_schedule.h"
#include "model/training/step_guard.h"
#include "parallel/communicator.h"
#include "parallel/data_parallel.h"
#include "parallel/pipeline_exec.h"
#include "parallel/schedule_check.h"

namespace mpitron {

namespace {
// A fresh run's lineage id: 16 random hex digits from rank 0, the same on every rank.
std::string new_run_id(MPI_Comm world) {
  uint64_t v = (static_cast<uint64_t>(std::random_device{}()) << 32) ^ std::random_device{}() ^
               static_cast<uint64_t>(std::chrono::system_clock::now().time_since_epoch().count());
  if (world != MPI_COMM_NULL) MPI_Bcast(&v, 1, MPI_UINT64_T, 0, world);
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(v));
  return buf;
}
bool same_path(const std::string& a, const std::string& b) {
  std::error_code ec1, ec2;
  const auto x = std::filesystem::weakly_canonical(a, ec1), y = std::filesystem::weakly_canonical(b, ec2);
  return !ec1 && !ec2 && x == y;
}
}  // namespace


std::vector<int64_t> samples_per_split(const TrainArgs& a) {
  const int64_t iters = a.uses_samples() ? (a.train_samples + a.global_batch_size - 1) / a.global_batch_size
                                         : a.train_iters;
  const int64_t train = a.uses_samples() ? a.train_samples : a.train_iters * a.global_batch_size;
  const int64_t evals = iters / a.eval_interval + 1;
  return {train, evals * a.eval_iters * a.global_batch_size, a.eval_iters * a.global_batch_size};
}

namespace {

// Peak FLOP/s that MFU is measured against: the H100 datasheet for bf16/fp16
// on CUDA (989 TFLOP/s dense), else a sgemm measured now on this CPU.
double peak_flops(const Device& d, DType t, std::string& what) {
  if (d.is_cuda()) {
    what = t == DType::F32 ? "H100 tf32 dense 494.5 TFLOP/s" : "H100 bf16 dense 989 TFLOP/s";
    return t == DType::F32 ? 494.5e12 : 989e12;
  }
  const int n = 1024;
  std::vector<float> a(static_cast<size_t>(n) * n, 0.5f), b(a), c(a.size());
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1.0f, a.data(), n, b.data(), n, 0.0f, c.data(), n);
  Timer timer;
  const int reps = 4;
  for (int i = 0; i < reps; ++i)
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1.0f, a.data(), n, b.data(), n, 0.0f, c.data(), n);
  const double f = 2.0 * n * n * n * reps / timer.seconds();
  what = str("sgemm measured on this CPU ", static_cast<int>(f / 1e9), " GFLOP/s");
  return f;
}

// Set by SIGTERM / SIGUSR1 (what Slurm sends before a job's time runs out)
// under --exit-signal-handler; the loop checks it after every step.
volatile std::sig_atomic_t g_exit_signal = 0;
extern "C" void on_exit_signal(int sig) { g_exit_signal = sig; }

std::string sci(double v, int prec = 6) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*E", prec, v);
  return buf;
}

}  // namespace

struct Trainer::Impl {
  TrainArgs args;
  std::shared_ptr<SampleSource> data;
  Device device;
  std::unique_ptr<TrainModel> task;  // the GPT or BERT being trained
  GPT* model = nullptr;              // its core: parameters, chunks, blocks
  ParallelContext par;
  std::unique_ptr<ModelStates> states;       // replicated or ZeRO-1/2/3 (model/training/model_states.h)
  LossScaler scaler;
  std::unique_ptr<LRSchedule> lr;
  std::unique_ptr<BatchRampup> rampup;
  TrainState st;
  std::unique_ptr<io::TensorBoardWriter> tb;
  std::unique_ptr<io::MetricsJsonl> metrics;
  std::string peak_what;
  double peak = 0;
  int64_t total_iters = 0;
  std::map<int64_t, parallel::Schedule> schedules;  // pipeline schedule per micro-batch count
  std::unique_ptr<StepGuard> guard;  // non-finite and spike checks of each step
  // Mixture of Experts: the run's settings as the MoE layers read them (loss_scale set per step)
  // and the step's statistics they add to.
  MoeRun moe_run;
  MoeStats moe_stats;
  const MoeRun* moe() const { return args.model.moe() ? &moe_run : nullptr; }
  // The step's load-balancing and z losses: summed over the MoE layers (pipeline stages), averaged
  // over the micro-batches and data-parallel ranks, as the loss; tokens per expert and dropped
  // choices summed over every layer, micro-batch and data-parallel rank.
  struct MoeStep {
    double aux = 0, z = 0, dropped = 0;
    std::vector<double> tokens;
  };
  MoeStep take_moe_stats(int64_t n_micro) {
    // [aux, z, dropped, tokens per expert …]: one collective over the pipeline, one over dp.
    std::vector<double> v = {moe_stats.aux_loss, moe_stats.z_loss, static_cast<double>(moe_stats.dropped)};
    moe_stats.tokens_per_expert.resize(static_cast<size_t>(args.model.num_experts), 0);
    for (const int64_t t : moe_stats.tokens_per_expert) v.push_back(static_cast<double>(t));
    v = sum_over(par.pp_comm, std::move(v));
    // Aux-loss-free balancing: this rank's MoE layers' counts (the same layers on every dp rank)
    // join the sum over dp; the biases move before the next forward (Megatron: in finalize_model_grads).
    const std::vector<int64_t> bias_layers = model->expert_bias_layers();
    const size_t head = v.size(), E = static_cast<size_t>(args.model.num_experts);
    for (const int64_t l : bias_layers) {
      std::vector<int64_t>& t = moe_stats.layer_tokens[l];
      t.resize(E, 0);
      for (const int64_t x : t) v.push_back(static_cast<double>(x));
    }
    v = sum_over(par.dp_comm, std::move(v));
    if (!bias_layers.empty()) {
      std::map<int64_t, std::vector<double>> counts;
      for (size_t i = 0; i < bias_layers.size(); ++i)
        counts[bias_layers[i]].assign(v.begin() + static_cast<std::ptrdiff_t>(head + i * E),
                                      v.begin() + static_cast<std::ptrdiff_t>(head + (i + 1) * E));
      model->update_expert_bias(counts, args.moe.expert_bias_update_rate);
    }
    v.resize(head);
    moe_stats.clear();
    const double n = static_cast<double>(par.dp_size * n_micro);
    MoeStep r;
    r.aux = v[0] / n;
    r.z = v[1] / n;
    r.dropped = v[2];
    r.tokens.assign(v.begin() + 3, v.end());
    return r;
  }

  // Host-scalar collectives (losses, stop decisions) run on MPI-backend
  // Communicators of the same groups, so they have the communicator timeout:
  // a frozen rank is named and the job ends (parallel/job_exit.h) instead of a
  // blocking MPI_Allreduce spinning for ever. Built in the constructor, in the
  // same order on every rank (collective).
  std::map<MPI_Comm, std::unique_ptr<Communicator>> host_comms;
  void make_host_comm(MPI_Comm c, const char* name) {
    if (c == MPI_COMM_NULL || host_comms.count(c)) return;
    CommOptions o;
    o.name = name;
    host_comms[c] = make_mpi_communicator(c, o);
  }
  Communicator& host(MPI_Comm c) const { return *host_comms.at(c); }

  // Bitwise OR of v over every rank: one verdict for all.
  int world_or(int v) const {
    if (world_comm() == MPI_COMM_NULL) return v;
    std::vector<int32_t> bits(31);
    for (int b = 0; b < 31; ++b) bits[static_cast<size_t>(b)] = (v >> b) & 1;
    Tensor t = Tensor::from_ints(std::vector<int64_t>(bits.begin(), bits.end()), {31}, DType::I32);
    host(world_comm()).all_reduce(t, ReduceOp::Max);
    int out = 0;
    for (int b = 0; b < 31; ++b) out |= (t.data<int32_t>()[b] != 0 ? 1 : 0) << b;
    return out;
  }

  // Before a save: the weights and moments this rank holds are finite on every
  // rank, or the run stops here (a checkpoint never holds NaN/Inf).
  void check_state_finite() {
    const OptimState s = local_state();
    int bad = 0;
    const char* names[3] = {"master weights", "Adam first moments", "Adam second moments"};
    const Tensor* ts[3] = {&s.master, &s.exp_avg, &s.exp_avg_sq};
    for (int k = 0; k < 3; ++k) {
      if (!ts[k]->defined() || ts[k]->numel() == 0) continue;
      const Tensor h = ts[k]->to(Device::cpu());
      const float* p = h.data<float>();
      for (int64_t i = 0, n = h.numel(); i < n; ++i)
        if (!std::isfinite(p[i])) {
          bad |= 1 << k;
          break;
        }
    }
    bad = world_or(bad);
    if (!bad) return;
    std::string what;
    for (int k = 0; k < 3; ++k)
      if (bad & (1 << k)) what += (what.empty() ? "" : ", ") + std::string(names[k]);
    MPT_THROW(str("iteration ", st.iteration, ": the ", what, " hold NaN or Inf; not saving a checkpoint"),
              "the run diverged: lower --lr or --init-method-std, or resume from the last good checkpoint");
  }

  // --spike-rerun: back to the newest checkpoint of --save; the data goes on
  // after the spike's batch (the consumed-sample counters are kept).
  void rerun_from_checkpoint() {
    if (async) async->wait();  // the newest checkpoint may still be being written
    const TrainState keep = st;
    LoadOptions lo;
    OptimState loaded;
    SaveInfo li;
    const auto [sb, se] = state_range();
    states->whole();  // the load writes every value
    const bool found = load_checkpoint(args.save, *model, loaded, sb, se, scaler, st, lo, &li, world_comm());
    MPT_CHECK(found, str("--spike-rerun: a spike at iteration ", keep.iteration, " but no checkpoint in --save ",
                         args.save, " to go back to"),
              "give --save-interval so a checkpoint exists before spikes can happen");
    states->install(loaded, true);
    log_warn("--spike-rerun: back to checkpoint ", li.dir, " (iteration ", st.iteration, "); the data goes on at sample ",
             keep.consumed_train_samples);
    st.consumed_train_samples = keep.consumed_train_samples;
    st.consumed_valid_samples = keep.consumed_valid_samples;
    st.skipped_iterations = keep.skipped_iterations;
    st.skipped_samples = keep.skipped_samples;
  }

  // The memory a rank may use: the device's, or --memory-cap below it.
  int64_t capacity() const {
    const int64_t dev = device_memory_bytes(device);
    return args.memory_cap_mb > 0 ? std::min(dev, args.memory_cap_mb * int64_t{1000000}) : dev;
  }
  std::string capacity_name() const {
    return args.memory_cap_mb > 0 && capacity() < device_memory_bytes(device)
               ? str("--memory-cap ", args.memory_cap_mb, " (on ", device.name(), ")")
               : device.name();
  }

  MPI_Comm world_comm() const { return par.world != MPI_COMM_NULL ? par.world : par.dp_comm; }
  // Sum of v over every rank (stop decisions).
  double world_sum(double v) const { return sum_over(world_comm(), v); }
  // Sum over the pipeline group: the last stage's loss reaches every stage.
  double pp_sum(double v) const { return sum_over(par.pp_comm, v); }
  bool pipelined() const { return par.pp_size > 1; }
  // Micro-batches of the first step (with --rampup-batch-size, of its first global batch).
  int64_t first_micro_batches() const {
    const int64_t gbs = args.rampup_batch_size.size() == 3 ? args.rampup_batch_size[0] : args.global_batch_size;
    return gbs / (args.micro_batch_size * args.data_parallel_size);
  }

  // The schedule of a step with n_micro micro-batches (built, or read from
  // --pipeline-schedule FILE, and checked once).
  const parallel::Schedule& schedule_for(int64_t n_micro) {
    auto it = schedules.find(n_micro);
    if (it != schedules.end()) return it->second;
    const std::string& name = args.pipeline_schedule;
    const int pp = par.pp_size, v = static_cast<int>(args.virtual_pipeline_stages());
    parallel::Schedule s;
    if (name.empty()) {
      s = parallel::builtin_schedule(v > 1 ? "interleaved" : "1f1b", pp, static_cast<int>(n_micro), v);
    } else if (parallel::is_builtin_schedule(name)) {
      s = parallel::builtin_schedule(name, pp, static_cast<int>(n_micro), v);
    } else {
      s = parallel::read_schedule_file(name);
      MPT_CHECK(s.pp == pp && s.virtual_stages == v && s.micro_batches == n_micro,
                str("--pipeline-schedule ", name, " is for pp ", s.pp, ", ", s.virtual_stages, " virtual stages, ",
                    s.micro_batches, " micro-batches; this run needs pp ", pp, ", ", v, " virtual stages, ", n_micro,
                    " micro-batches (global batch / (micro batch x data-parallel size))"),
                "write the schedule for this layout and batch, or pick a built-in (gpipe, 1f1b, interleaved, zb-h1, zbv)");
    }
    parallel::validate_schedule(s);
    return schedules.emplace(n_micro, std::move(s)).first->second;
  }

  // Sum of v over the dp group (identity on one process).
  // Sum of a host scalar over `comm` (identity for MPI_COMM_NULL: one process).
  double sum_over(MPI_Comm comm, double v) const { return sum_over(comm, std::vector<double>{v})[0]; }
  // Element-wise, one collective for the whole vector.
  std::vector<double> sum_over(MPI_Comm comm, std::vector<double> v) const {
    if (comm == MPI_COMM_NULL) return v;
    // Doubles as their bits (the communicators reduce no f64): gathered, then summed in rank order.
    Communicator& c = host(comm);
    const int64_t n = static_cast<int64_t>(v.size());
    std::vector<int64_t> bits(v.size());
    std::memcpy(bits.data(), v.data(), v.size() * sizeof(double));
    Tensor in = Tensor::from_ints(bits, {n}, DType::I64), out = Tensor::empty({c.size() * n}, DType::I64);
    c.all_gather(in, out);
    std::vector<double> sum(v.size(), 0.0);
    for (int64_t r = 0; r < c.size(); ++r)
      for (int64_t i = 0; i < n; ++i) {
        double x = 0;
        std::memcpy(&x, out.data<int64_t>() + r * n + i, sizeof x);
        sum[static_cast<size_t>(i)] += x;
      }
    return sum;
  }
  double dp_sum(double v) const { return sum_over(par.dp_comm, v); }
  // Context parallelism: each cp rank's loss is the mean over its part of every
  // sequence (equal token counts), so their mean is the whole sequence's.
  double cp_mean(double v) const { return sum_over(par.cp_comm, v) / static_cast<double>(par.cp_size); }
  // Gradients are reduced (and ZeRO shards) over dp × cp: the cp ranks hold the same
  // parameters, each with the gradient of its part of the sequences.
  Communicator* grad_comm() const { return par.cp_size > 1 ? par.dp_cp : par.dp; }
  MPI_Comm grad_mpi_comm() const { return par.cp_size > 1 ? par.dp_cp_comm : par.dp_comm; }
  int grad_ranks() const { return par.dp_size * par.cp_size; }
  // The ranks ZeRO shards the states over: dp x cp, or with expert parallelism the edp group.
  int shard_ranks() const { return grad_ranks() / par.ep_size; }
  // Replicated state (no ZeRO) is written by one rank of every dp × cp group.
  // (With expert parallelism the ep ranks hold different experts: the first expert-data-parallel
  // replica writes, each rank its own experts and the dense parameters on ep rank 0, ParamInfo::canonical.)
  bool writes_replicas() const { return par.dp_rank / par.ep_size == 0 && par.cp_rank == 0; }
  // Micro-batch k of the global batch starting at `consumed`: this rank's slice
  // (Megatron's sampler: each chunk of mbs·dp samples is split by dp rank).
  int64_t micro_first(int64_t consumed, int64_t k) const {
    return consumed + (k * par.dp_size + par.dp_rank) * args.micro_batch_size;
  }

  // The optimizer state this rank holds (ZeRO: its shard), and its slice [begin, end) of the flat buffer.
  OptimState local_state() const { return states->local_state(); }
  std::pair<int64_t, int64_t> state_range() const { return states->state_range(); }

  // The micro-batch that starts at sample `first` of `split`.
  MicroBatch micro_batch(int split, int64_t first) const {
    return task->micro_batch(*data, split, first, args.micro_batch_size);
  }
  // The loss parts summed since the last call (last stage; 0 elsewhere), summed over
  // the pipeline and data-parallel groups and divided by `count` micro-batches.
  std::vector<double> take_parts(double count) {
    std::vector<double> v = task->parts().v;
    v.resize(task->loss_names().size(), 0.0);
    task->parts().v.clear();
    for (double& x : v) x = dp_sum(cp_mean(pp_sum(x))) / std::max(count, 1.0);
    return v;
  }

  // Dropout seed of micro-batch k of an iteration: a pure function of (seed, iteration, k).
  uint64_t dropout_seed(int64_t iteration, int64_t k) const {
    return st.seed * 0x9E3779B97F4A7C15ull + static_cast<uint64_t>(iteration) * 1000003ull + static_cast<uint64_t>(k);
  }

  // Where the LR schedule stands: iterations, or samples for --train-samples runs,
  // counting only applied updates (Megatron steps its scheduler only after a
  // successful step, so fp16 overflow and spike skips do not advance it).
  int64_t schedule_step() const {
    return args.uses_samples() ? st.consumed_train_samples - st.skipped_samples
                               : st.iteration - st.skipped_iterations;
  }

  std::string lr_json() const {
    const LRScheduleConfig& c = lr->config();
    return nlohmann::json{{"lr", c.lr}, {"min_lr", c.min_lr}, {"style", c.style}, {"warmup_steps", c.warmup_steps},
                          {"decay_steps", c.decay_steps}, {"unit", args.uses_samples() ? "samples" : "iterations"},
                          {"step", schedule_step()}}
        .dump();
  }

  // One evaluation micro-batch through the model (the pipeline's stages, or the one
  // chunk): its loss on the last stage, 0 elsewhere.
  double eval_forward(Tape& tape, const MicroBatch& mb) {
    if (pipelined()) return pipeline_eval(mb);
    ForwardOptions o;
    o.train = false;
    states->add_forward_hooks(o);  // (--overlap-param-gather, ZeRO-3) parameters as they are read
    return task->chunk_forward(tape, 0, mb, Var(), o).value().item();
  }

  // The mean loss over `iters` global batches of `split`: the trained loss, then its
  // parts (BERT: lm, sop).
  std::vector<double> evaluate(int split, int64_t iters, int64_t* consumed) {
    Tape tape;
    NoGradGuard guard(tape);
    double sum = 0;
    int64_t count = 0;
    const int64_t gbs = args.global_batch_size, mbs = args.micro_batch_size;
    task->parts().v.clear();
    for (int64_t it = 0; it < iters; ++it) {
      for (int64_t k = 0; k < gbs / (mbs * par.dp_size); ++k) {
        sum += eval_forward(tape, micro_batch(split, micro_first(*consumed, k)));
        ++count;
      }
      *consumed += gbs;
    }
    const double n = dp_sum(static_cast<double>(count));
    std::vector<double> out{n > 0 ? dp_sum(cp_mean(pp_sum(sum))) / n : 0.0};
    for (double p : take_parts(n)) out.push_back(p);
    return out;
  }

  // eval_sets() sources (finetune): accuracy over every sample of each set, the sets'
  // micro-batches dealt to the dp ranks in turn (every rank runs every round: ZeRO-3
  // gathers are collective; samples past a set's end are run but not counted), with
  // Megatron's tasks/eval_utils.py lines. Returns correct / total over all sets.
  double evaluate_accuracy(int64_t epoch) {
    Tape tape;
    NoGradGuard guard(tape);
    const int64_t mbs = args.micro_batch_size, dp = par.dp_size;
    double all_correct = 0, all_total = 0;
    for (const SampleSource::EvalSet& set : data->eval_sets()) {
      Timer t;
      task->accuracy() = {};
      for (int64_t round = 0; round * mbs * dp < set.count; ++round) {
        const int64_t at = (round * dp + par.dp_rank) * mbs;
        eval_forward(tape, task->micro_batch(*data, 1, set.first + at, mbs, std::clamp<int64_t>(set.count - at, 0, mbs)));
      }
      task->parts().v.clear();
      const double correct = dp_sum(pp_sum(static_cast<double>(task->accuracy().correct)));
      const double total = dp_sum(pp_sum(static_cast<double>(task->accuracy().total)));
      all_correct += correct, all_total += total;
      char line[512];
      std::snprintf(line, sizeof line,
                    " > |epoch: %lld| metrics for %s: correct / total = %.0f / %.0f = %.4f %%, elapsed time (sec): %.3f",
                    static_cast<long long>(epoch), set.name.c_str(), correct, total,
                    total > 0 ? 100.0 * correct / total : 0.0, t.seconds());
      log_info(line);
    }
    const double acc = all_total > 0 ? all_correct / all_total : 0.0;
    char line[256];
    std::snprintf(line, sizeof line, " >> |epoch: %lld| overall: correct / total = %.0f / %.0f = %.4f %%",
                  static_cast<long long>(epoch), all_correct, all_total, 100.0 * acc);
    log_info(line);
    tb_scalar("lm-loss-validation", "accuracy validation", acc);
    if (metrics) metrics->log_json(st.iteration, {{"epoch", epoch}, {"valid_accuracy", acc}});
    return acc;
  }

  // A TensorBoard scalar under Megatron-LM's tag ("lm loss"), or with --deepspeed
  // under Megatron-DeepSpeed's ("lm-loss-training/lm loss"); `vs_samples` also
  // writes "<tag> vs samples" against the consumed samples, as both do.
  void tb_scalar(const char* group, const std::string& name, double v, bool vs_samples = true) {
    if (!tb) return;
    const std::string tag = args.deepspeed ? str(group, "/", name) : name;
    tb->add_scalar(tag, v, st.iteration);
    if (vs_samples) tb->add_scalar(tag + " vs samples", v, st.consumed_train_samples);
  }

  // ev: evaluate()'s result. GPT: "lm loss value | lm loss PPL"; BERT: each part's value
  // and PPL, as Megatron's evaluate_and_print_results prints every loss key.
  void report_eval(const char* what, const std::vector<double>& ev) {
    const double loss = ev[0];
    const double ppl = std::exp(std::min(loss, 20.0));
    std::string line = str(" ", what, " |");
    const std::vector<std::string>& names = task->loss_names();
    for (size_t i = 0; i < names.size(); ++i) {
      const double v = task->is_bert() ? ev[i + 1] : loss;
      line += str(" ", names[i], " value: ", sci(v), " | ", names[i], " PPL: ", sci(std::exp(std::min(v, 20.0))), " |");
    }
    log_info("-----------------------------------------------------------------------------------------------");
    log_info(line);
    log_info("-----------------------------------------------------------------------------------------------");
    if (task->is_bert()) {
      for (size_t i = 0; i < names.size(); ++i) {
        tb_scalar("lm-loss-validation", names[i] + " validation", ev[i + 1]);
        tb_scalar("lm-loss-validation", names[i] + " validation ppl", std::exp(std::min(ev[i + 1], 20.0)));
      }
    } else {
      tb_scalar("lm-loss-validation", "lm loss validation", loss);
      tb_scalar("lm-loss-validation", "lm loss validation ppl", ppl);
    }
    if (metrics) metrics->log_json(st.iteration, {{"valid_loss", loss}, {"valid_ppl", ppl}});
  }

  // ---- pipeline parallelism ----------------------------------------------------------
  // This rank's model chunks for the pipeline executor: one tape per (micro-batch, chunk).
  struct GPTStageRunner final : parallel::StageRunner {
    Impl& m;
    int64_t consumed;
    float loss_seed;  // loss_scale / micro-batches
    double loss_sum = 0;
    struct Live {
      std::unique_ptr<Tape> tape;
      Var input, output;
    };
    std::map<std::pair<int, int>, Live> live;
    std::map<int, MicroBatch> batches;  // micro-batch → its samples
    std::map<int, int> last_backward;  // chunk → the micro-batch of its last B in the schedule

    GPTStageRunner(Impl& impl, int64_t consumed_samples, float seed)
        : m(impl), consumed(consumed_samples), loss_seed(seed) {}
    const MicroBatch& batch(int mb) {
      auto it = batches.find(mb);
      if (it == batches.end()) it = batches.emplace(mb, m.micro_batch(0, m.micro_first(consumed, mb))).first;
      return it->second;
    }
    Tensor forward(int mb, int chunk, const Tensor& input) override {
      Live& l = live[{mb, chunk}];
      l.tape = std::make_unique<Tape>();
      const ChunkInfo& ch = m.model->chunk(chunk);
      if (!ch.first_stage) l.input = Var(input, true);
      ForwardOptions o;
      o.recompute = m.args.recompute_activations;
      o.recompute_num_layers = m.args.recompute_num_layers;
      o.dropout_seed = m.dropout_seed(m.st.iteration, mb * m.par.dp_size + m.par.dp_rank);
      o.moe = m.moe();
      // The chunk's last backward makes its blocks' gradients final: the data-parallel
      // buckets start reducing them while the schedule goes on.
      m.states->add_hooks(o, last_backward.at(chunk) == mb);
      l.output = m.task->chunk_forward(*l.tape, chunk, batch(mb), l.input, o);
      if (!ch.last_stage) return l.output.value();
      loss_sum += l.output.value().item();
      return Tensor();
    }
    Tensor backward(int mb, int chunk, const Tensor& grad_output) override {
      return run_backward(mb, chunk, grad_output, nullptr);
    }
    // The tape of (mb, chunk) backwards; defer: where the blocks put their weight
    // gradients (a split backward's W runs them), null to compute them now.
    Tensor run_backward(int mb, int chunk, const Tensor& grad_output, WeightGradWork* defer) {
      auto it = live.find({mb, chunk});
      MPT_CHECK(it != live.end(), str("pipeline backward of micro-batch ", mb, " chunk ", chunk, " before its forward"),
                "");
      Live l = std::move(it->second);
      live.erase(it);
      l.tape->set_defer_weight_grads(defer);
      if (m.model->chunk(chunk).last_stage) l.tape->backward(l.output, loss_seed);
      else l.tape->backward(l.output, grad_output);
      if (m.model->chunk(chunk).first_stage) return Tensor();
      return l.input.grad();
    }
    // Split backward (schedules with W actions): B runs the tape with the blocks'
    // weight gradients deferred into this (micro-batch, chunk)'s work list; W runs it.
    std::map<std::pair<int, int>, WeightGradWork> deferred;
    bool can_split_backward() const override { return true; }
    bool supports_placement(const parallel::Schedule& s) const override {
      for (int c = 0; c < m.model->num_chunks(); ++c)
        if (m.model->chunk(c).stage != s.stage(m.par.pp_rank, c)) return false;
      return true;
    }
    Tensor backward_input(int mb, int chunk, const Tensor& grad_output) override {
      return run_backward(mb, chunk, grad_output, &deferred[{mb, chunk}]);
    }
    void backward_weight(int mb, int chunk) override {
      auto it = deferred.find({mb, chunk});
      MPT_CHECK(it != deferred.end(), str("pipeline W of micro-batch ", mb, " chunk ", chunk, " before its B"), "");
      it->second.run();
      deferred.erase(it);
    }
    Tensor make_recv_buffer(int, int) override {
      return Tensor::empty(m.model->activation_shape(m.args.micro_batch_size), m.args.model.compute_dtype, m.device);
    }
  };

  // One training step's forward/backward over the schedule; the summed loss of
  // its micro-batches on the last stage (0 elsewhere).
  // Data-parallel reduction: each chunk's buckets launch during its last
  // backward; the tied embedding's copies are summed over the embedding group
  // first and reduced with what is left when the schedule ends.
  std::unique_ptr<parallel::PipelineProfile> profile;  // --profile-pipeline
  std::vector<double> schedule_ms;                      // wall time of each profiled step's schedule
  // Writes the measured per-stage costs (collective over the pipeline group).
  void write_pipeline_profile() {
    if (!profile) return;
    const parallel::Costs c = parallel::gather_pipeline_costs(*profile, *par.pp);
    if (par.pp_rank == 0 && par.dp_rank == 0 && par.tp_rank == 0) {
      // What schedule_sim predicts is the schedule alone (no optimizer step, no
      // gradient reduction after it): its measured wall time, median over the steps.
      std::vector<double> t = schedule_ms;
      std::sort(t.begin(), t.end());
      if (!t.empty())
        log_info("pipeline schedule time per step (median of ", t.size(), " profiled steps, pipeline rank 0): ",
                 sci(t[t.size() / 2], 4), " ms");
      parallel::write_costs_file(c, args.profile_pipeline);
      log_info("wrote the measured pipeline costs of ", profile->compute.size(), " actions on rank 0 to ",
               args.profile_pipeline, " (schedule_sim --costs)");
    }
  }

  double pipeline_step(int64_t n_micro, float loss_seed) {
    const parallel::Schedule& sched = schedule_for(n_micro);
    GPTStageRunner runner(*this, st.consumed_train_samples, loss_seed);
    // A chunk's gradients are final at its last W (its last B without W actions).
    const parallel::Op final_op = parallel::has_weight_actions(sched) ? parallel::Op::Weight : parallel::Op::Backward;
    for (const parallel::Action& a : sched.ranks[static_cast<size_t>(par.pp_rank)])
      if (a.op == final_op) runner.last_backward[a.chunk] = a.mb;
    states->begin_backward(true);
    // --profile-pipeline: every step but the first (allocator and caches warming up).
    parallel::PipelineProfile* prof = profile && st.iteration > 0 ? profile.get() : nullptr;
    if (prof && prof->sync) prof->sync();
    Timer schedule_timer;
    parallel::run_pipeline_schedule(sched, par.pp_rank, *par.pp, runner, prof);
    if (prof) {
      if (prof->sync) prof->sync();
      schedule_ms.push_back(schedule_timer.seconds() * 1e3);
    }
    reduce_embedding_grads();
    states->end_backward();
    return runner.loss_sum;
  }

  // Forward only, stage after stage (evaluation): the loss on the last stage, 0 elsewhere.
  // Stages follow the schedule's placement (round-robin, or V for zbv): a
  // neighbour stage on this same rank is handed on without a message.
  double pipeline_eval(const MicroBatch& mb) {
    const parallel::Schedule& sched = schedules.begin()->second;
    const int stages = sched.stages(), me = par.pp_rank;
    double loss = 0;
    Var carried;  // the previous stage's output when that stage is on this rank
    for (int s = 0; s < stages; ++s) {
      if (sched.rank_of_stage(s) != me) continue;
      Tape tape;
      NoGradGuard guard(tape);
      Var input;
      if (s > 0) {
        if (sched.rank_of_stage(s - 1) == me) {
          input = carried;
        } else {
          Tensor buf = Tensor::empty(model->activation_shape(args.micro_batch_size), args.model.compute_dtype, device);
          par.pp->recv(buf, sched.rank_of_stage(s - 1));
          input = Var(buf);
        }
      }
      ForwardOptions o;
      o.train = false;
      states->add_forward_hooks(o);
      Var out = task->chunk_forward(tape, sched.chunk_of_stage(s), mb, input, o);
      if (s == stages - 1) loss = out.value().item();
      else if (sched.rank_of_stage(s + 1) == me) carried = out;
      else par.pp->send(out.value(), sched.rank_of_stage(s + 1));
    }
    return loss;
  }

  // After the last backward of a step: the tied word embedding's two copies
  // (first and last pipeline stage) get the sum of their gradients (an untied
  // output layer has a single copy).
  void reduce_embedding_grads() {
    if (!par.embedding || !model->config().tied_output()) return;
    const parallel::Schedule& sched = schedules.begin()->second;
    if (sched.rank_of_stage(0) == sched.rank_of_stage(sched.stages() - 1)) return;  // V: both ends on one rank, one copy
    const ParamSet& ps = model->params();
    // Each parameter's own gradient (ZeRO-3 keeps them outside the flat buffer).
    for (size_t i = 0; i < ps.infos().size(); ++i)
      if (ps.infos()[i].role == ParamRole::WordEmbedding) {
        Tensor g = ps.var(i).grad().view({ps.infos()[i].numel()});
        par.embedding->all_reduce(g, ReduceOp::Sum);
      }
  }

  std::unique_ptr<AsyncSaver> async;  // --async-save

  // final: the save at exit, waited for also with --async-save.
  SaveInfo save(bool final = false) {
    check_state_finite();  // a save reads only this rank's optimizer state
    if (async) {
      SaveInfo s;
      s.dir = async->start(args.save, *model, local_state(), scaler, st, args.flags_json, lr_json(),
                           static_cast<int>(args.keep_last), states->sharded() || writes_replicas());
      if (final) async->wait();
      return s;
    }
    // Every rank writes its own hyperslabs; data-parallel replicas (no ZeRO) write nothing twice.
    const SaveInfo s = save_checkpoint(args.save, *model, local_state(), scaler, st, args.flags_json, lr_json(),
                                       static_cast<int>(args.keep_last), world_comm(), states->sharded() || writes_replicas());
    log_info("saved checkpoint at iteration ", st.iteration, " to ", s.dir, " (", sci(s.bytes / 1e9, 3), " GB in ",
             sci(s.seconds, 3), " s, ", sci(s.bytes / 1e9 / std::max(s.seconds, 1e-9), 3), " GB/s)");
    return s;
  }
};

Trainer::Trainer(const TrainArgs& args, std::shared_ptr<SampleSource> data, ParallelContext par,
                 const std::function<void(GPT&)>& after_init)
    : impl_(std::make_unique<Impl>()) {
  Impl& m = *impl_;
  m.args = args;
  m.par = par;
  MPT_CHECK(par.dp_size == args.data_parallel_size,
            str("the trainer runs on ", par.dp_size, " data-parallel ranks but the flags were checked for ",
                args.data_parallel_size), "this is a bug in the caller of Trainer");
  MPT_CHECK(par.dp_size == 1 || par.dp, "data parallelism needs a dp communicator", "");
  m.data = std::move(data);
  if (args.device == "cuda" || (args.device == "auto" && cuda_available())) {
    MPT_CHECK(cuda_available(), "--device cuda: no usable GPU", cuda_unavailable_reason());
    m.device = Device::cuda(std::max(0, cuda_current_device()));  // the grid bound this rank's GPU
  } else {
    m.device = Device::cpu();
  }
  const TrainArgs& a = m.args;
  m.st.seed = a.seed;
  m.st.tokenizer = a.tokenizer_identity;
  m.st.run_id = new_run_id(m.world_comm());
  m.st.owned_runs = {m.st.run_id};
  m.make_host_comm(m.world_comm(), "world (host scalars)");
  m.make_host_comm(par.dp_comm, "dp (host scalars)");
  m.make_host_comm(par.pp_comm, "pp (host scalars)");
  m.make_host_comm(par.cp_comm, "cp (host scalars)");  // the loss's mean over the cp ranks
  MPT_CHECK(par.tp_size == a.tensor_model_parallel_size && par.pp_size == a.pipeline_model_parallel_size,
            str("the trainer runs on tp ", par.tp_size, " x pp ", par.pp_size, " but the flags say tp ",
                a.tensor_model_parallel_size, " x pp ", a.pipeline_model_parallel_size),
            "this is a bug in the caller of Trainer");
  MPT_CHECK(par.tp_size == 1 || par.tp, "tensor parallelism needs a tp communicator", "");
  MPT_CHECK(par.pp_size == 1 || (par.pp && par.pp_comm != MPI_COMM_NULL), "pipeline parallelism needs a pp communicator",
            "");
  MPT_CHECK(par.cp_size == a.context_parallel_size,
            str("the trainer runs on cp ", par.cp_size, " but the flags say --context-parallel-size ",
                a.context_parallel_size), "this is a bug in the caller of Trainer");
  MPT_CHECK(par.cp_size == 1 || (par.cp && par.dp_cp && par.cp_comm != MPI_COMM_NULL),
            "context parallelism needs the cp and dp x cp communicators", "");
  ModelParallel mp;
  mp.cp = ContextParallel{par.cp, par.cp_size, par.cp_rank, parse_cp_comm_type(a.cp_comm_type)};
  mp.tp.comm = par.tp;
  mp.tp.size = par.tp_size;
  mp.tp.rank = par.tp_rank;
  mp.tp.sequence_parallel = a.sequence_parallel;
  MPT_CHECK(par.ep_size == a.expert_model_parallel_size && (par.ep_size == 1 || (par.ep && par.edp && par.mp_ep)),
            str("the trainer runs on ep ", par.ep_size, " but the flags say --expert-model-parallel-size ",
                a.expert_model_parallel_size),
            "this is a bug in the caller of Trainer");
  mp.ep = ExpertParallel{par.ep, par.ep_size, par.ep_rank, parse_moe_dispatcher(a.moe_token_dispatcher_type)};
  mp.pp_size = par.pp_size;
  mp.pp_rank = par.pp_rank;
  mp.virtual_stages = static_cast<int>(a.virtual_pipeline_stages());
  if (m.pipelined()) {  // the chunks sit where the schedule's placement puts them (V for zbv)
    const parallel::Schedule& s = m.schedule_for(m.first_micro_batches());
    for (int c = 0; c < mp.virtual_stages; ++c) mp.chunk_stages.push_back(s.stage(par.pp_rank, c));
  }
  // Refuse what cannot fit before allocating any of it.
  check_fits_memory(a.model, a.micro_batch_size, par.tp_size, par.pp_size, m.shard_ranks(), static_cast<int>(a.zero_stage),
                    m.capacity(), m.capacity_name(), par.cp_size, par.ep_size);
  m.task = std::make_unique<TrainModel>(a.model, m.device, mp);
  m.model = &m.task->core();
  m.model->init_weights(a.seed);
  if (a.moe.expert_bias_update_rate > 0) m.model->enable_expert_bias();
  if (after_init) after_init(*m.model);  // before the model states shard the parameters
  StatesConfig sc;
  sc.stage = static_cast<int>(a.zero_stage);
  sc.optim = a.optim;
  sc.ddp.bucket_size = a.ddp_bucket_size;
  sc.ddp.overlap_grad_reduce = a.overlap_grad_reduce;
  sc.overlap_param_gather = a.overlap_param_gather;
  sc.zero3 = a.zero3;
  sc.experts = ExpertGroups{par.ep, par.edp};
  m.states = make_model_states(sc, *m.model, m.grad_comm(), par.ep_size > 1 ? par.mp_ep : par.mp);
  if (a.fp16) m.scaler = LossScaler(a.scaler);
  m.guard = std::make_unique<StepGuard>(a.spike_zscore, a.spike_window);
  m.total_iters = a.uses_samples() ? (a.train_samples + a.global_batch_size - 1) / a.global_batch_size : a.train_iters;
  LRScheduleConfig lc;
  lc.lr = a.lr;
  lc.min_lr = a.min_lr;
  lc.style = a.lr_decay_style;
  const int64_t total = a.uses_samples() ? a.train_samples : a.train_iters;
  lc.decay_steps = a.uses_samples() ? (a.lr_decay_samples ? a.lr_decay_samples : total)
                                    : (a.lr_decay_iters ? a.lr_decay_iters : total);
  if (a.lr_warmup_fraction >= 0) lc.warmup_steps = static_cast<int64_t>(a.lr_warmup_fraction * lc.decay_steps);
  else lc.warmup_steps = a.uses_samples() ? a.lr_warmup_samples : a.lr_warmup_iters;
  MPT_CHECK(lc.warmup_steps <= lc.decay_steps,
            str("warmup (", lc.warmup_steps, ") is longer than the decay (", lc.decay_steps, ")"),
            "shorten --lr-warmup-* or lengthen --lr-decay-*");
  m.lr = std::make_unique<LRSchedule>(lc);
  if (a.rampup_batch_size.size() == 3)
    m.rampup = std::make_unique<BatchRampup>(a.rampup_batch_size[0], a.rampup_batch_size[1], a.rampup_batch_size[2],
                                             a.global_batch_size, a.micro_batch_size, a.data_parallel_size);
  else
    m.rampup = std::make_unique<BatchRampup>(a.global_batch_size, a.micro_batch_size, a.data_parallel_size);
  if (!a.tensorboard_dir.empty()) m.tb = std::make_unique<io::TensorBoardWriter>(a.tensorboard_dir);
  std::string mf = a.metrics_file;
  if (mf.empty() && !a.tensorboard_dir.empty()) mf = a.tensorboard_dir + "/metrics.jsonl";
  if (!mf.empty()) m.metrics = std::make_unique<io::MetricsJsonl>(mf);
  m.peak = peak_flops(m.device, a.model.compute_dtype, m.peak_what);
  // A read-only or missing --save is an error now, not after the first save_interval of training.
  if (!a.save.empty()) io::check_save_dir_writable(a.save, m.world_comm());
  if (!a.profile_pipeline.empty()) {
    m.profile = std::make_unique<parallel::PipelineProfile>();
    if (m.device.is_cuda()) m.profile->sync = [] { device_synchronize(); };
  }
  if (a.async_save) m.async = std::make_unique<AsyncSaver>(m.world_comm());
}

Trainer::~Trainer() = default;
GPT& Trainer::model() { return *impl_->model; }

TrainSummary Trainer::run() {
  Impl& m = *impl_;
  const TrainArgs& a = m.args;
  TrainSummary sum;
  const GPTConfig& c = a.model;
  log_info(m.task->is_classifier() ? "mpitron finetune: " : str("mpitron ", c.tool(), ": "),
           c.t5 ? str(c.encoder_num_layers, " encoder + ", c.decoder_num_layers(), " decoder layers") : str(c.num_layers, " layers"),
           ", hidden ", c.hidden_size, ", heads ", c.num_attention_heads,
           c.t5 ? str(", seq ", c.seq_length, " (decoder ", c.decoder_seq_length, ")") : str(", seq ", c.seq_length), ", vocab ", c.padded_vocab_size, " (padded from ", c.vocab_size, "), ",
           c.num_parameters(), " parameters, ", dtype_name(c.compute_dtype), " on ", m.device.name(),
           a.recompute_activations
               ? (a.recompute_num_layers > 0 ? str(", recompute of the first ", a.recompute_num_layers, " blocks per chunk")
                                             : std::string(", recompute"))
               : std::string());
  for (const std::string& note : a.startup_notes) log_info(note);
  if (c.moe()) {
    int64_t moe_layers = 0;
    for (int64_t l = 0; l < c.num_layers; ++l) moe_layers += c.is_moe_layer(l);
    log_info("Mixture of Experts: ", moe_layers, " of ", c.num_layers, " layers, ", c.num_experts, " experts of width ",
             c.moe_ffn(), ", top-", c.moe_router_topk, " ", to_string(c.moe_router_score_function),
             c.moe_router_pre_softmax ? " (pre-softmax)" : "",
             c.moe_shared_expert_intermediate_size > 0 ? str(", shared experts of width ", c.moe_shared_expert_intermediate_size) : "",
             "; ", c.num_active_parameters(), " active of ", c.num_parameters(), " parameters per token; ",
             a.moe.capacity_factor > 0 ? str("capacity factor ", a.moe.capacity_factor, " (drop by ",
                                             a.moe.drop_by_probs ? "probs" : "position", ")")
                                       : std::string("dropless"),
             a.moe.aux_loss_coeff > 0 ? str(", aux loss ", a.moe.aux_loss_coeff) : "",
             a.moe.z_loss_coeff > 0 ? str(", z-loss ", a.moe.z_loss_coeff) : "",
             a.moe.expert_bias_update_rate > 0 ? str(", expert bias (update rate ", a.moe.expert_bias_update_rate, ")") : "",
             m.par.ep_size > 1 ? str("; expert parallelism ", m.par.ep_size, ": ", c.num_experts / m.par.ep_size,
                                   " experts per rank, ", a.moe_token_dispatcher_type, " dispatcher")
                             : std::string());
  }
  if (m.par.cp_size > 1)  // never silently off (Megatron-Bridge #2667): the layout and the comm type
    log_info("context parallelism: each ", c.seq_length, "-token sequence over ", m.par.cp_size, " ranks, ",
             m.model->parallel().cp.local_seq(c.seq_length), " tokens each; ", m.model->parallel().cp.describe(c.seq_length),
             "; gradients reduced over dp x cp = ", m.grad_ranks(), " ranks");
  log_info("FLOPs per token ", sci(c.flops_per_token(), 3), " (6·matmul params + 12·L·NH·HD·K, K the keys a query attends; docs/flops.md); MFU vs ",
           m.peak_what);

  RankShard shard;
  shard.params = m.model->params().numel();
  shard.tp = m.par.tp_size;
  shard.cp = m.par.cp_size;
  shard.cp_comm = m.model->parallel().cp.type;
  shard.sequence_parallel = a.sequence_parallel;
  shard.layers_per_chunk = m.model->chunk(0).end_layer - m.model->chunk(0).first_layer;
  shard.num_chunks = m.model->num_chunks();
  // MPI's staging buffers are host memory: on the device's only when the device is the CPU.
  shard.mpi_zero_staging = m.states->sharded() && m.grad_comm() && std::string(m.grad_comm()->backend()) == "mpi" &&
                           m.device.is_cpu();
  shard.recompute_layers = a.recompute_num_layers;
  shard.first_stage = m.model->chunk(0).first_stage;
  shard.last_stage = m.model->chunk(m.model->num_chunks() - 1).last_stage;
  if (m.pipelined()) {
    const int64_t n_micro = m.rampup->global_batch(m.st.consumed_train_samples) / (a.micro_batch_size * a.data_parallel_size);
    const parallel::Schedule& sched = m.schedule_for(n_micro);
    for (const parallel::Action& act : sched.ranks[static_cast<size_t>(m.par.pp_rank)])
      if (parallel::is_compute(act.op))
        shard.compute_order.push_back(
            {act.chunk, act.op == parallel::Op::Forward ? 'F' : act.op == parallel::Op::Backward ? 'B' : 'W'});
  }
  shard.optimizer_offload = a.optim.cpu_offload && !m.device.is_cpu();
  if (a.optim.cpu_offload && m.device.is_cpu())
    log_info("--optimizer-cpu-offload on the CPU: the optimizer state is in host memory already (nothing moves)");
  m.states->account(shard);  // the strategy's own terms (ZeRO-3: its unit buffers)
  MemoryEstimate est = estimate_memory(c, a.micro_batch_size, m.shard_ranks(), m.states->memory_stage(),
                                       a.recompute_activations, shard);
  log_info("model states: ", m.states->describe());
  if (m.device.is_cuda()) est.device_workspace = int64_t{32} << 20;  // cuBLASLt's, tensor/cuda/common.cu
  log_info("memory per rank (estimate): ", est.to_string());
  check_estimate_fits(est, m.capacity(), m.capacity_name());

  if (!a.load.empty()) {
    LoadOptions lo;
    lo.load_optim = !a.no_load_optim;
    lo.load_rng = !a.no_load_rng;
    lo.finetune = a.finetune;
    lo.tokenizer = a.tokenizer_identity;
    lo.allow_tokenizer_change = a.allow_tokenizer_change;
    SaveInfo li;
    OptimState loaded;
    const auto [sb, se] = m.state_range();
    m.states->whole();  // the load writes every value
    const bool found = load_checkpoint(a.load, *m.model, loaded, sb, se, m.scaler, m.st, lo, &li, m.world_comm());
    if (found) m.states->install(loaded, lo.load_optim && !lo.finetune);
    if (found && !a.finetune) {  // a resume continues the lineage it loaded (the one keep_last may prune)
      const std::string loaded_run = io::CheckpointReader::run_of(a.load, m.st.iteration);
      if (!loaded_run.empty()) m.st.run_id = loaded_run;
      m.st.owned_runs = {m.st.run_id};
      // Checkpoints from before runs were recorded belong to the run that resumes them in place.
      if (loaded_run.empty() && same_path(a.load, a.save)) m.st.owned_runs.push_back("");
    }
    if (found)
      log_info("loaded checkpoint ", li.dir, " at iteration ", m.st.iteration, " (", sci(li.bytes / 1e9, 3), " GB in ",
               sci(li.seconds, 3), " s, ", sci(li.bytes / 1e9 / std::max(li.seconds, 1e-9), 3), " GB/s)");
    else
      log_warn("--load ", a.load, ": no checkpoint there, starting from scratch");
    MPT_CHECK(std::isfinite(m.scaler.scale()) && m.scaler.scale() > 0,
              str("--load ", a.load, ": the checkpoint's loss scale is ", m.scaler.scale()),
              "the checkpoint is damaged; load an earlier one");
    if (m.st.iteration >= m.total_iters)
      log_warn("--load ", a.load, ": the checkpoint is at iteration ", m.st.iteration, ", already at or past the end of ",
               "this run (", m.total_iters, a.uses_samples() ? " iterations from --train-samples" : " = --train-iters",
               "): nothing to train; raise --train-iters / --train-samples to go on");
  }

  // Nothing this run did not write is replaced: a --save directory holding
  // another run's checkpoints (not the lineage it resumed) is refused.
  if (!a.save.empty()) {
    const std::vector<int64_t> foreign = io::CheckpointReader::foreign_iterations(a.save, m.st.owned_runs);
    if (!foreign.empty()) {
      std::string list;
      for (size_t k = 0; k < foreign.size() && k < 4; ++k) list += str(k ? ", " : "", io::iteration_dir_name(foreign[k]));
      if (foreign.size() > 4) list += str(", ... (", foreign.size(), " in all)");
      MPT_CHECK(a.overwrite_save,
                str("--save ", a.save, " holds checkpoints of another run (", list,
                    "): saving here would repoint its latest_checkpointed_iteration.txt and could replace them"),
                "save to another directory, resume that run with --load " + a.save +
                    ", or pass --overwrite-save (--keep-last still deletes only this run's checkpoints)");
      log_warn("--overwrite-save: --save ", a.save, " holds checkpoints of another run (", list, ")");
    }
  }

  if (a.exit_signal_handler) {
    std::signal(SIGTERM, on_exit_signal);
    std::signal(SIGUSR1, on_exit_signal);
  }
  Timer run_timer;
  reset_peak_memory(m.device);
  Timer interval_timer;
  int64_t interval_iters = 0, interval_tokens = 0, interval_skipped = 0, interval_nan = 0;
  double interval_loss = 0;
  std::vector<double> interval_parts;  // BERT: lm and sop loss sums over the interval
  Impl::MoeStep interval_moe;          // MoE: the auxiliary losses' sums, the routing counts over the interval
  m.moe_run = a.moe;
  m.moe_run.stats = &m.moe_stats;
  int64_t interval_loss_n = 0;
  bool first_logged = false;
  double interval_fwd_bwd_s = 0, interval_optim_s = 0;  // --log-timers-to-tensorboard
  int64_t consecutive_spikes = 0, consecutive_overflows_at_min = 0;
  int64_t saved_at = -1;  // the iteration of this run's newest save
  const bool by_accuracy = !m.data->eval_sets().empty();  // finetune: evaluation is accuracy
  constexpr int64_t kMaxOverflowsAtMinimum = 10;
  while (m.st.iteration < m.total_iters) {
    if (m.async) m.async->poll();  // a background save that failed stops the run here, on every rank
    const int64_t gbs = m.rampup->global_batch(m.st.consumed_train_samples);
    const int64_t n_micro = gbs / (a.micro_batch_size * a.data_parallel_size);
    const float lr = m.lr->lr_at(m.schedule_step());
    const float scale = m.scaler.scale();
    // Phase timers for --log-timers-to-tensorboard (the device is synchronised only then).
    auto phase_mark = [&] {
      if (a.log_timers_to_tensorboard) device_synchronize();
    };
    Timer phase;
    m.states->zero_grad();
    double loss_sum = 0;
    m.task->parts().v.clear();
    m.moe_run.loss_scale = scale / static_cast<float>(n_micro);  // the auxiliary losses' gradients, as the loss's
    m.moe_stats.clear();
    if (m.pipelined()) {
      loss_sum = m.pp_sum(m.pipeline_step(n_micro, scale / static_cast<float>(n_micro)));
    }
    for (int64_t k = 0; k < (m.pipelined() ? 0 : n_micro); ++k) {
      const bool last = k == n_micro - 1;
      const MicroBatch mb = m.micro_batch(0, m.micro_first(m.st.consumed_train_samples, k));
      Tape tape;
      ForwardOptions o;
      o.recompute = a.recompute_activations;
      o.recompute_num_layers = a.recompute_num_layers;
      // Each dp rank's masks differ (different samples), as Megatron's per-rank seeds.
      o.dropout_seed = m.dropout_seed(m.st.iteration, k * m.par.dp_size + m.par.dp_rank);
      o.moe = m.moe();
      m.states->begin_backward(last);
      m.states->add_hooks(o, true);
      Var loss = m.task->chunk_forward(tape, 0, mb, Var(), o);
      loss_sum += loss.value().item();
      tape.backward(loss, scale / static_cast<float>(n_micro));
      m.states->end_backward();
    }
    // BERT's two losses, averaged like the loss (GPT's one part is the loss itself).
    const std::vector<double> step_parts =
        m.task->is_bert() ? m.take_parts(static_cast<double>(m.par.dp_size * n_micro)) : std::vector<double>{};
    const Impl::MoeStep moe_step = c.moe() ? m.take_moe_stats(n_micro) : Impl::MoeStep();
    // The loss and grad norm are judged between the norm and the update (the
    // optimizer's veto), and the verdict is OR-ed over every rank.
    StepVerdict verdict;
    double loss = NAN;
    bool judged = false;
    auto veto = [&](double grad_norm) {
      loss = m.dp_sum(m.cp_mean(loss_sum)) / static_cast<double>(m.par.dp_size) / static_cast<double>(n_micro);
      verdict.bits = m.world_or(m.guard->judge(loss, grad_norm).bits);
      judged = true;
      if (verdict.nonfinite()) return a.check_for_nan || a.fp16;
      return verdict.spike();
    };
    phase_mark();
    interval_fwd_bwd_s += phase.seconds();
    phase.reset();
    const StepResult r = m.states->step(lr, scale, veto);
    MPT_CHECK(judged, "the optimizer step did not judge the loss and grad norm", "this is a bug in the optimizer");
    phase_mark();
    interval_optim_s += phase.seconds();
    const int64_t this_iter = m.st.iteration + 1;
    if (verdict.nonfinite()) {
      const std::string what = verdict.describe(loss, r.grad_norm);
      if (a.fp16) {
        // An overflow: skipped, and the dynamic scale backs off. At the minimum
        // (or a static) scale scaling cannot cure it: after a few the run stops.
        consecutive_overflows_at_min = m.scaler.at_minimum() ? consecutive_overflows_at_min + 1 : 0;
        MPT_CHECK(consecutive_overflows_at_min < kMaxOverflowsAtMinimum,
                  str("iteration ", this_iter, ": ", what, what.find(" and ") == std::string::npos ? " was" : " were",
                      " not finite in ", consecutive_overflows_at_min,
                      " steps in a row at the ", a.scaler.constant > 0 ? "static" : "minimum", " loss scale ",
                      m.scaler.scale(), "; the run diverged (nothing was applied or saved from these steps)"),
                  "lower --lr or --init-method-std, or raise --min-loss-scale / --loss-scale");
      } else if (a.check_for_nan) {
        MPT_THROW(str("iteration ", this_iter, ": ", what, what.find(" and ") == std::string::npos ? " is" : " are",
                      " not finite; the update was not applied and the run "
                      "stops without saving"),
                  "lower --lr or --init-method-std, check the data, or resume from the last checkpoint; "
                  "--no-check-for-nan-in-loss-and-grad skips such steps instead");
      }
    } else {
      consecutive_overflows_at_min = 0;
    }
    if (verdict.spike()) {
      ++consecutive_spikes;
      ++sum.spike_skips;
      log_warn("iteration ", this_iter, ": skipped the update: ", verdict.describe(loss, r.grad_norm),
               " is a spike (z-score loss ", m.guard->loss.z(loss), ", grad norm ", m.guard->grad.z(r.grad_norm),
               " > ", a.spike_zscore, " over the last ", a.spike_window, " steps)");
      MPT_CHECK(consecutive_spikes < a.spike_max_skips,
                str("iteration ", this_iter, ": ", consecutive_spikes, " spikes in a row (--spike-max-consecutive-skips ",
                    a.spike_max_skips, "): the loss has left its window for good"),
                "raise --skip-spike-zscore or --spike-window, or lower --lr");
      if (a.spike_rerun) {
        m.st.consumed_train_samples += gbs;  // the replay goes on with the batch after the spike's
        m.rerun_from_checkpoint();
        ++sum.spike_reruns;
        continue;
      }
    } else if (!r.skipped) {
      consecutive_spikes = 0;
      m.guard->accept(loss, r.grad_norm);
    }
    if (!verdict.spike()) m.scaler.update(r.skipped);
    const bool nan_loss = !std::isfinite(loss);
    m.st.iteration += 1;
    ++sum.steps_run;
    m.st.consumed_train_samples += gbs;
    if (r.skipped) {
      m.st.skipped_iterations += 1;
      m.st.skipped_samples += gbs;
    }
    interval_skipped += r.skipped;
    interval_nan += nan_loss;
    if (!r.skipped && !nan_loss) {
      interval_loss += loss;
      interval_parts.resize(step_parts.size(), 0.0);
      for (size_t i = 0; i < step_parts.size(); ++i) interval_parts[i] += step_parts[i];
      interval_moe.aux += moe_step.aux;
      interval_moe.z += moe_step.z;
      ++interval_loss_n;
    }
    ++interval_iters;
    interval_tokens += gbs * c.seq_length;
    interval_moe.dropped += moe_step.dropped;
    interval_moe.tokens.resize(moe_step.tokens.size(), 0.0);
    for (size_t e = 0; e < moe_step.tokens.size(); ++e) interval_moe.tokens[e] += moe_step.tokens[e];
    sum.losses.push_back(loss);
    if (m.task->is_bert()) {
      sum.lm_losses.push_back(step_parts[0]);
      sum.sop_losses.push_back(step_parts.size() > 1 ? step_parts[1] : 0.0);
    }
    sum.grad_norms.push_back(r.grad_norm);
    if (c.moe()) sum.moe_aux_losses.push_back(moe_step.aux);

    if (m.st.iteration % a.log_interval == 0 || m.st.iteration == m.total_iters) {
      const double secs = interval_timer.seconds();
      const double ms = 1e3 * secs / static_cast<double>(interval_iters);
      const double tps = static_cast<double>(interval_tokens) / secs;
      const double flops = tps * c.flops_per_token();
      const double avg = interval_loss_n ? interval_loss / static_cast<double>(interval_loss_n) : NAN;
      // Megatron's convention: the learning rate after this step's scheduler update
      // (what the next step uses).
      const float logged_lr = m.lr->lr_at(m.schedule_step());
      // Live tensor peak, and what is reserved for it: CUDA the caching allocator's
      // segments (live + cached); the CPU has no cache of ours (malloc's is not seen).
      const MemoryStats mem = memory_stats(m.device);
      const double reserved = m.device.is_cuda()
                                  ? static_cast<double>(cuda_caching_allocator(m.device.index).stats().reserved_bytes)
                                  : static_cast<double>(mem.current_bytes);
      // GPT: "lm loss: X"; BERT: "lm loss: X | sop loss: Y" (Megatron prints each loss key).
      std::vector<double> part_avg;
      for (double p : interval_parts) part_avg.push_back(interval_loss_n ? p / static_cast<double>(interval_loss_n) : NAN);
      part_avg.resize(m.task->is_bert() ? m.task->loss_names().size() : 0, NAN);
      std::string loss_text;
      char num[32];
      if (part_avg.empty()) {
        std::snprintf(num, sizeof num, "%.6E", avg);
        loss_text = str("lm loss: ", num);
      }
      for (size_t i = 0; i < part_avg.size(); ++i) {
        std::snprintf(num, sizeof num, "%.6E", part_avg[i]);
        loss_text += str(i ? " | " : "", m.task->loss_names()[i], ": ", num);
      }
      char line[896];
      std::snprintf(line, sizeof line,
                    " iteration %8lld/%8lld | consumed samples: %12lld | elapsed time per iteration (ms): %.1f | "
                    "learning rate: %.6E | global batch size: %5lld | %s | loss scale: %.1f | "
                    "grad norm: %.3f | number of skipped iterations: %3lld | number of nan iterations: %3lld | "
                    "tokens/s: %.0f | TFLOP/s: %.4f | MFU: %.2f%% | peak memory (MB): %.1f | "
                    "reserved memory (MB): %.1f |",
                    static_cast<long long>(m.st.iteration), static_cast<long long>(m.total_iters),
                    static_cast<long long>(m.st.consumed_train_samples), ms, logged_lr, static_cast<long long>(gbs),
                    loss_text.c_str(),
                    scale, r.grad_norm, static_cast<long long>(interval_skipped), static_cast<long long>(interval_nan),
                    tps, flops / 1e12, 100.0 * flops / m.peak,
                    static_cast<double>(mem.peak_bytes) / 1e6, reserved / 1e6);
      std::string extra;
      double params_norm = NAN;
      int64_t zeros = -1;
      if (a.log_params_norm) {
        m.states->whole();
        params_norm = params_l2_norm(m.model->params(), m.par.mp);
        char buf[64];
        std::snprintf(buf, sizeof buf, " params norm: %.3f |", params_norm);
        extra += buf;
      }
      // MoE (Megatron's names): the auxiliary losses averaged like the loss, and how evenly the
      // experts were loaded (the busiest expert's choices over the mean) with the choices dropped.
      const double moe_aux = interval_loss_n ? interval_moe.aux / static_cast<double>(interval_loss_n) : NAN;
      const double moe_z = interval_loss_n ? interval_moe.z / static_cast<double>(interval_loss_n) : NAN;
      double moe_load = NAN;
      if (c.moe()) {
        double most = 0, all = 0;
        for (const double t : interval_moe.tokens) most = std::max(most, t), all += t;
        moe_load = all > 0 ? most / (all / static_cast<double>(interval_moe.tokens.size())) : NAN;
        char buf[160];
        if (a.moe.aux_loss_coeff > 0) {
          std::snprintf(buf, sizeof buf, " load_balancing_loss: %.6E |", moe_aux);
          extra += buf;
        }
        if (a.moe.z_loss_coeff > 0) {
          std::snprintf(buf, sizeof buf, " z_loss: %.6E |", moe_z);
          extra += buf;
        }
        std::snprintf(buf, sizeof buf, " expert load max/mean: %.3f | dropped tokens: %.0f |", moe_load,
                      interval_moe.dropped);
        extra += buf;
      }
      if (a.log_num_zeros_in_grad) {
        const auto [zb, ze] = m.state_range();
        zeros = count_zero_grads(m.model->params(), m.states->grad_slice(), zb, ze, m.par.mp,
                                 m.states->sharded() ? m.grad_mpi_comm() : MPI_COMM_NULL);
        extra += str(" number of zeros in grad: ", zeros, " |");
      }
      log_info(line, extra);
      if (m.tb) {  // Megatron-LM's tags, or Megatron-DeepSpeed's with --deepspeed (docs/training.md)
        if (part_avg.empty()) m.tb_scalar("lm-loss-training", "lm loss", avg);
        for (size_t i = 0; i < part_avg.size(); ++i) m.tb_scalar("lm-loss-training", m.task->loss_names()[i], part_avg[i]);
        m.tb_scalar("learning-rate", "learning-rate", logged_lr);
        m.tb_scalar("batch-size", "batch-size", static_cast<double>(gbs));
        m.tb_scalar("loss-scale", "loss-scale", scale);
        m.tb_scalar("grad-norm", "grad-norm", r.grad_norm);
        if (a.log_params_norm) m.tb_scalar("params-norm", "params-norm", params_norm);
        if (a.log_num_zeros_in_grad) m.tb_scalar("num-zeros", "num-zeros", static_cast<double>(zeros));
        if (c.moe() && a.moe.aux_loss_coeff > 0) m.tb_scalar("load_balancing_loss", "load_balancing_loss", moe_aux);
        if (c.moe() && a.moe.z_loss_coeff > 0) m.tb_scalar("z_loss", "z_loss", moe_z);
        int ranks = 1;
        if (m.world_comm() != MPI_COMM_NULL) MPI_Comm_size(m.world_comm(), &ranks);
        m.tb_scalar("throughput", "throughput", flops / 1e12 / ranks, false);  // Megatron's: TFLOP/s per rank
        m.tb_scalar("throughput", "tokens-per-second", tps, false);
        if (a.log_timers_to_tensorboard) {
          const double n_it = static_cast<double>(interval_iters);
          m.tb->add_scalar("iteration-time", secs / n_it, m.st.iteration);
          m.tb->add_scalar("forward-backward-time", 1e3 * interval_fwd_bwd_s / n_it, m.st.iteration);
          m.tb->add_scalar("optimizer-time", 1e3 * interval_optim_s / n_it, m.st.iteration);
        }
        m.tb->flush();
      }
      if (m.metrics) {
        nlohmann::json row{{"consumed_samples", m.st.consumed_train_samples},
                           {"lm_loss", part_avg.empty() ? avg : part_avg[0]}, {"lr", logged_lr}, {"global_batch_size", gbs},
                           {"loss_scale", scale}, {"grad_norm", r.grad_norm},
                           {"skipped_iterations", interval_skipped}, {"nan_iterations", interval_nan},
                           {"ms_per_iteration", ms}, {"tokens_per_second", tps},
                           {"tflops", flops / 1e12}, {"mfu", flops / m.peak}};
        if (part_avg.size() > 1) row["sop_loss"] = part_avg[1];
        if (c.moe()) {
          if (a.moe.aux_loss_coeff > 0) row["load_balancing_loss"] = moe_aux;
          if (a.moe.z_loss_coeff > 0) row["z_loss"] = moe_z;
          row["moe_tokens_per_expert"] = interval_moe.tokens;
          row["moe_dropped_tokens"] = interval_moe.dropped;
          row["moe_load_max_over_mean"] = moe_load;
        }
        if (!part_avg.empty()) row["loss"] = avg;  // BERT: the trained sum
        m.metrics->log_json(m.st.iteration, row);
      }
      sum.peak_memory_bytes = memory_stats(m.device).peak_bytes;
      sum.estimated_memory_bytes = est.total();
      if (!first_logged) sum.first_loss = avg;
      first_logged = true;
      sum.last_loss = avg;
      sum.tokens_per_second = tps;
      interval_iters = interval_tokens = interval_skipped = interval_nan = interval_loss_n = 0;
      interval_loss = 0;
      interval_parts.clear();
      interval_moe = Impl::MoeStep();
      interval_fwd_bwd_s = interval_optim_s = 0;
      interval_timer.reset();
    }
    // The epoch this iteration belongs to (finetune; 0 without epochs).
    const int64_t epoch = a.epoch_iters > 0 ? (m.st.iteration - 1) / a.epoch_iters : 0;
    if (by_accuracy && a.eval_interval > 0 && m.st.iteration % a.eval_interval == 0) {
      m.evaluate_accuracy(epoch);
      interval_timer.reset();
    } else if (!by_accuracy && a.eval_iters > 0 && m.st.iteration % a.eval_interval == 0 &&
               m.st.iteration != m.total_iters) {
      m.report_eval(str("validation loss at iteration ", m.st.iteration).c_str(),
                    m.evaluate(1, a.eval_iters, &m.st.consumed_valid_samples));
      interval_timer.reset();
    }
    if (a.save_interval > 0 && m.st.iteration % a.save_interval == 0) {
      sum.checkpoint_dir = m.save().dir;
      saved_at = m.st.iteration;
      interval_timer.reset();
    }
    if (a.epoch_iters > 0 && m.st.iteration % a.epoch_iters == 0) {  // an epoch's end: evaluated and saved
      if (by_accuracy) sum.accuracies.push_back(m.evaluate_accuracy(epoch));
      if (!a.save.empty() && saved_at != m.st.iteration) {
        sum.checkpoint_dir = m.save().dir;
        saved_at = m.st.iteration;
      }
      interval_timer.reset();
    }
    if (a.exit_interval > 0 && m.st.iteration % a.exit_interval == 0) {
      log_info("exiting at iteration ", m.st.iteration, " (--exit-interval ", a.exit_interval, ")");
      break;
    }
    // Every rank must agree to stop (a signal may reach only some ranks).
    const bool stop_signal = m.world_sum(g_exit_signal ? 1.0 : 0.0) > 0;
    const bool stop_time = a.exit_duration_in_mins > 0 &&
                           m.world_sum(run_timer.seconds() / 60.0 > a.exit_duration_in_mins ? 1.0 : 0.0) > 0;
    if (stop_signal) {
      log_info("exiting at iteration ", m.st.iteration, " on signal ", static_cast<int>(g_exit_signal ? g_exit_signal : SIGTERM),
               a.save.empty() ? " (no --save: nothing saved)" : ", after saving");
      sum.signalled = true;
      break;
    }
    if (stop_time) {
      log_info("exiting at iteration ", m.st.iteration, " after ", run_timer.seconds() / 60.0,
               " minutes (--exit-duration-in-mins ", a.exit_duration_in_mins, ")");
      break;
    }
  }
  if (!a.save.empty() && sum.steps_run > 0 && saved_at != m.st.iteration)
    sum.checkpoint_dir = m.save(/*final=*/true).dir;
  if (m.async) m.async->wait();  // the last interval's save, when it was also the last step
  m.write_pipeline_profile();
  if (a.eval_iters > 0 && !sum.signalled) {
    const std::vector<double> ev = m.evaluate(1, a.eval_iters, &m.st.consumed_valid_samples);
    const double vl = ev[0];
    m.report_eval(str("validation loss at the end of training (iteration ", m.st.iteration, ")").c_str(), ev);
    sum.valid_loss = vl;
    sum.valid_ppl = std::exp(std::min(vl, 20.0));
  }
  m.states->whole();  // the model's values are whole when run() returns
  sum.iterations = m.st.iteration;
  return sum;
}

}  // namespace mpitron
