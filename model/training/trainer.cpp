#include "model/training/trainer.h"

#include <cblas.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <csignal>
#include <random>

#include "core/device_memory.h"
#include "core/log.h"
#include "io/checkpoint.h"
#include "model/memory.h"
#include "model/training/trainer_impl.h"

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

Device choose_device(const std::string& flag) {
  if (flag == "cuda" || (flag == "auto" && cuda_available())) {
    MPT_CHECK(cuda_available(), "--device cuda: no usable GPU", cuda_unavailable_reason());
    return Device::cuda(std::max(0, cuda_current_device()));  // the grid bound this rank's GPU
  }
  return Device::cpu();
}

}  // namespace

std::vector<int64_t> samples_per_split(const TrainArgs& a) {
  const int64_t iters = a.uses_samples() ? (a.train_samples + a.global_batch_size - 1) / a.global_batch_size
                                         : a.train_iters;
  const int64_t train = a.uses_samples() ? a.train_samples : a.train_iters * a.global_batch_size;
  const int64_t evals = iters / a.eval_interval + 1;
  return {train, evals * a.eval_iters * a.global_batch_size, a.eval_iters * a.global_batch_size};
}

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
  m.device = choose_device(args.device);
  m.st.seed = args.seed;
  m.st.tokenizer = args.tokenizer_identity;
  m.st.run_id = new_run_id(par.world != MPI_COMM_NULL ? par.world : par.dp_comm);
  m.st.owned_runs = {m.st.run_id};
  m.groups = std::make_unique<HostGroups>(par);
  m.check_layout();
  const ModelParallel mp = m.model_parallel();
  // Refuse what cannot fit before allocating any of it.
  check_fits_memory(args.model, args.micro_batch_size, par.tp_size, par.pp_size, m.shard_ranks(),
                    static_cast<int>(args.zero_stage), m.capacity(), m.capacity_name(), par.cp_size, par.ep_size);
  m.kind = make_model_kind(args, m.device, mp);
  m.model = &m.kind->core();
  m.kind->init_weights(args.seed);
  if (after_init) after_init(*m.model);  // before the model states shard the parameters
  m.make_states();
  if (args.fp16) m.scaler = LossScaler(args.scaler);
  m.guard = std::make_unique<StepGuard>(args.spike_zscore, args.spike_window);
  m.rerun = std::make_unique<RerunMachine>(parse_rerun_mode(args.rerun_mode), args.fp16, *m.groups);
  m.straggler = std::make_unique<StragglerDetector>(args.log_straggler, args.straggler_minmax_count, *m.groups);
  m.make_lr_schedule();
  m.open_outputs();
}

// The flags' layout against the communicators the caller built.
void Trainer::Impl::check_layout() const {
  const TrainArgs& a = args;
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
}

ModelParallel Trainer::Impl::model_parallel() {
  const TrainArgs& a = args;
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
  if (pipelined()) {  // the chunks sit where the schedule's placement puts them (V for zbv)
    const parallel::Schedule& s = schedule_for(first_micro_batches());
    for (int c = 0; c < mp.virtual_stages; ++c) mp.chunk_stages.push_back(s.stage(par.pp_rank, c));
  }
  return mp;
}

void Trainer::Impl::make_states() {
  const TrainArgs& a = args;
  StatesConfig sc;
  sc.stage = static_cast<int>(a.zero_stage);
  sc.optim = a.optim;
  sc.optim.tp = par.tp;  // muon's duplicated mode gathers tensor-parallel weights over it
  sc.ddp.bucket_size = a.ddp_bucket_size;
  sc.ddp.overlap_grad_reduce = a.overlap_grad_reduce;
  sc.overlap_param_gather = a.overlap_param_gather;
  sc.zero3 = a.zero3;
  sc.experts = ExpertGroups{par.ep, par.edp};
  states = make_model_states(sc, *model, grad_comm(), par.ep_size > 1 ? par.mp_ep : par.mp);
}

void Trainer::Impl::make_lr_schedule() {
  const TrainArgs& a = args;
  total_iters = a.uses_samples() ? (a.train_samples + a.global_batch_size - 1) / a.global_batch_size : a.train_iters;
  const LRScheduleConfig lc = lr_schedule_config(a);  // in samples, as Megatron counts
  MPT_CHECK(lc.warmup_steps <= static_cast<double>(lc.decay_steps),
            str("warmup (", lc.warmup_steps, " samples) is longer than the decay (", lc.decay_steps, " samples)"),
            "shorten --lr-warmup-* or lengthen --lr-decay-*");
  lr = std::make_unique<LRSchedule>(lc);
  if (a.rampup_batch_size.size() == 3)
    rampup = std::make_unique<BatchRampup>(a.rampup_batch_size[0], a.rampup_batch_size[1], a.rampup_batch_size[2],
                                           a.global_batch_size, a.micro_batch_size, a.data_parallel_size);
  else
    rampup = std::make_unique<BatchRampup>(a.global_batch_size, a.micro_batch_size, a.data_parallel_size);
}

// TensorBoard, metrics, the MFU's peak, --save's writability, --profile-pipeline, --async-save.
void Trainer::Impl::open_outputs() {
  const TrainArgs& a = args;
  // One rank writes them (the values are agreed over every rank): one row per log step.
  const bool writes = process_rank() <= 0;
  if (!a.tensorboard_dir.empty() && writes) tb = std::make_unique<io::TensorBoardWriter>(a.tensorboard_dir);
  std::string mf = a.metrics_file;
  if (mf.empty() && !a.tensorboard_dir.empty()) mf = a.tensorboard_dir + "/metrics.jsonl";
  if (!mf.empty() && writes) metrics = std::make_unique<io::MetricsJsonl>(mf);
  peak = peak_flops(device, a.model.compute_dtype, peak_what);
  // A read-only or missing --save is an error now, not after the first save_interval of training.
  if (!a.save.empty()) io::check_save_dir_writable(a.save, world_comm());
  if (!a.profile_pipeline.empty()) {
    profile = std::make_unique<parallel::PipelineProfile>();
    if (device.is_cuda()) profile->sync = [] { device_synchronize(); };
  }
  if (a.async_save) async = std::make_unique<AsyncSaver>(world_comm());
}

int64_t Trainer::Impl::capacity() const {
  const int64_t dev = device_memory_bytes(device);
  return args.memory_cap_mb > 0 ? std::min(dev, args.memory_cap_mb * int64_t{1000000}) : dev;
}

std::string Trainer::Impl::capacity_name() const {
  return args.memory_cap_mb > 0 && capacity() < device_memory_bytes(device)
             ? str("--memory-cap ", args.memory_cap_mb, " (on ", device.name(), ")")
             : device.name();
}

Trainer::~Trainer() = default;
GPT& Trainer::model() { return *impl_->model; }

// After a step's log line, evaluation and save: --exit-interval, a signal, or the time limit
// (every rank agrees: a signal may reach only some ranks).
bool Trainer::Impl::should_stop(TrainSummary& sum) {
  const TrainArgs& a = args;
  if (a.exit_interval > 0 && st.iteration % a.exit_interval == 0) {
    log_info("exiting at iteration ", st.iteration, " (--exit-interval ", a.exit_interval, ")");
    return true;
  }
  const bool stop_signal = groups->world_sum(g_exit_signal ? 1.0 : 0.0) > 0;
  const bool stop_time = a.exit_duration_in_mins > 0 &&
                         groups->world_sum(run_timer.seconds() / 60.0 > a.exit_duration_in_mins ? 1.0 : 0.0) > 0;
  if (stop_signal) {
    log_info("exiting at iteration ", st.iteration, " on signal ", static_cast<int>(g_exit_signal ? g_exit_signal : SIGTERM),
             a.save.empty() ? " (no --save: nothing saved)" : ", after saving");
    sum.signalled = true;
    return true;
  }
  if (stop_time) {
    log_info("exiting at iteration ", st.iteration, " after ", run_timer.seconds() / 60.0,
             " minutes (--exit-duration-in-mins ", a.exit_duration_in_mins, ")");
    return true;
  }
  return false;
}

// The last save, the pipeline profile and the final evaluation.
void Trainer::Impl::finish(TrainSummary& sum) {
  const TrainArgs& a = args;
  if (!a.save.empty() && sum.steps_run > 0 && saved_at != st.iteration) sum.checkpoint_dir = save(/*final=*/true).dir;
  if (async) async->wait();  // the last interval's save, when it was also the last step
  write_pipeline_profile();
  if (a.eval_iters > 0 && !sum.signalled) {
    const Evaluation ev = evaluate(1, a.eval_iters, &st.consumed_valid_samples);
    report_eval(str("validation loss at the end of training (iteration ", st.iteration, ")"), ev);
    sum.valid_loss = ev.loss;
    sum.valid_ppl = std::exp(std::min(ev.loss, 20.0));
  }
  states->whole();  // the model's values are whole when run() returns
  sum.iterations = st.iteration;
}

TrainSummary Trainer::run() {
  Impl& m = *impl_;
  TrainSummary sum;
  m.start();
  if (m.args.exit_signal_handler) {
    std::signal(SIGTERM, on_exit_signal);
    std::signal(SIGUSR1, on_exit_signal);
  }
  m.run_timer.reset();
  reset_peak_memory(m.device);
  m.interval.timer.reset();
  while (m.st.iteration < m.total_iters) {
    const Impl::Step s = m.step(sum);
    if (s.rerun) continue;
    m.record(s, sum);
    if (m.log_due()) m.log(s, sum);
    m.evaluate_and_save_if_due(sum);
    if (m.should_stop(sum)) break;
  }
  m.finish(sum);
  return sum;
}

}  // namespace mpitron
