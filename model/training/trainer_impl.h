// model/training/trainer_impl.h — the trainer's state and its parts, one file each
// (private to model/training):
//   trainer.cpp           construction, Trainer::run (the loop), the stop decisions, the end
//   trainer_start.cpp     the start-up lines, the memory estimate, --load, --save's owner
//   trainer_step.cpp      one optimizer step: forward/backward, the verdict, what it adds up
//   trainer_log.cpp       the interval's log line, TensorBoard scalars and metrics row
//   trainer_eval.cpp      evaluation (mean loss, or accuracy over whole sets) and its report
//   trainer_pipeline.cpp  the pipeline schedule's stage runner, pipelined evaluation
//   trainer_save.cpp      checkpoints: save, the finite-state check, --spike-rerun's reload
// The model kind (model/training/model_kind.h) supplies everything that differs between
// models; nothing here asks which model it trains.
#pragma once
#include <cstdint>
#include <cstdio>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/timer.h"
#include "io/metrics_jsonl.h"
#include "io/tensorboard.h"
#include "model/training/async_save.h"
#include "model/training/host_groups.h"
#include "model/training/lr_schedule.h"
#include "model/training/model_kind.h"
#include "model/training/model_states.h"
#include "model/training/rerun.h"
#include "model/training/straggler.h"
#include "model/training/step_guard.h"
#include "model/training/trainer.h"
#include "parallel/pipeline_exec.h"
#include "parallel/schedule.h"

namespace mpitron {

// "%.*E" of v: the log lines' numbers.
inline std::string sci(double v, int prec = 6) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*E", prec, v);
  return buf;
}

struct Trainer::Impl {
  TrainArgs args;
  std::shared_ptr<SampleSource> data;
  Device device;
  ParallelContext par;
  std::unique_ptr<HostGroups> groups;        // host-scalar sums over the run's groups
  std::unique_ptr<ModelKind> kind;           // what is trained (model/training/model_kind.h)
  GPT* model = nullptr;                      // its core: parameters, chunks, blocks
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
  std::unique_ptr<StepGuard> guard;                 // non-finite and spike checks of each step
  std::unique_ptr<RerunMachine> rerun;              // --rerun-mode: a suspicious step run again
  std::unique_ptr<StragglerDetector> straggler;     // --log-straggler: slow ranks named at each log line
  std::unique_ptr<parallel::PipelineProfile> profile;  // --profile-pipeline
  std::vector<double> schedule_ms;                     // wall time of each profiled step's schedule
  std::unique_ptr<AsyncSaver> async;                   // --async-save
  int64_t estimated_memory_bytes = 0;                  // the start-up estimate

  // ---- the run's loop state
  Timer run_timer;  // --exit-duration-in-mins
  // What the log line reports: sums since the last one (its timer is also reset by the
  // evaluations and saves, which it does not time).
  struct Interval {
    Timer timer;
    int64_t iters = 0, tokens = 0, skipped = 0, nan = 0;
    int64_t loss_n = 0;  // steps whose loss counts: applied, and finite
    double loss = 0;
    double fwd_bwd_s = 0, optim_s = 0;  // --log-timers-to-tensorboard
  } interval;
  bool first_logged = false;
  int64_t consecutive_spikes = 0, consecutive_overflows_at_min = 0;
  int64_t saved_at = -1;  // the iteration of this run's newest save

  // One optimizer step as it ended.
  struct Step {
    bool rerun = false;  // a spike sent the run back to a checkpoint: nothing to record
    int64_t gbs = 0;     // its global batch
    float scale = 1;     // the loss scale it ran with
    double loss = 0;     // the loss averaged over the micro-batches and dp ranks
    double lr = 0, wd = 0;  // the learning rate and weight decay it applied (the schedule's)
    StepResult result;   // grad norm, skipped
  };

  // ---- construction (trainer.cpp)
  void check_layout() const;
  ModelParallel model_parallel();
  void make_states();
  void make_lr_schedule();
  void open_outputs();
  bool should_stop(TrainSummary& sum);
  void finish(TrainSummary& sum);

  // ---- start-up (trainer_start.cpp)
  void start();
  void log_model();
  void check_memory();
  void load_at_start();
  void check_save_owner() const;

  // ---- a step (trainer_step.cpp)
  Step step(TrainSummary& sum);
  Step run_step(StepRun& run, bool hold);
  ForwardOptions training_options(int64_t micro_batch) const;
  double forward_backward(int64_t n_micro, float loss_seed);
  // The nonfinite and spike rules; true: the run went back to a checkpoint.
  bool judge(const StepVerdict& verdict, Step& s, TrainSummary& sum);
  void record(const Step& s, TrainSummary& sum);

  // ---- the log line (trainer_log.cpp)
  bool log_due() const { return st.iteration % args.log_interval == 0 || st.iteration == total_iters; }
  void log(const Step& s, TrainSummary& sum);
  void tb_scalar(const std::string& group, const std::string& name, double v, bool vs_samples = true);

  // ---- evaluation (trainer_eval.cpp)
  struct Evaluation {
    double loss = 0;                // the trained loss's mean
    std::vector<NamedLoss> losses;  // what the kind reports
  };
  void evaluate_and_save_if_due(TrainSummary& sum);
  Evaluation evaluate(int split, int64_t iters, int64_t* consumed);
  void report_eval(const std::string& what, const Evaluation& ev);
  double evaluate_accuracy(int64_t epoch);
  double eval_forward(Tape& tape, const MicroBatch& mb);

  // ---- pipeline parallelism (trainer_pipeline.cpp)
  struct StageRunner;
  const parallel::Schedule& schedule_for(int64_t n_micro);
  double pipeline_step(int64_t n_micro, float loss_seed);
  double pipeline_eval(const MicroBatch& mb);
  void reduce_embedding_grads();
  void write_pipeline_profile();

  // ---- checkpoints (trainer_save.cpp)
  SaveInfo save(bool final = false);
  void check_state_finite();
  void rerun_from_checkpoint();
  std::string lr_json() const;
  // After a --load: the checkpoint's schedule (its lr_schedule JSON) against the flags'
  // (--override-opt_param-scheduler / --use-checkpoint-opt_param-scheduler, trainer_save.cpp).
  void resume_schedule(const std::string& saved_json, const std::string& where);

  // ---- the layout's arithmetic
  MPI_Comm world_comm() const { return groups->world(); }
  bool pipelined() const { return par.pp_size > 1; }
  // Micro-batches of the first step (with --rampup-batch-size, of its first global batch).
  int64_t first_micro_batches() const {
    const int64_t gbs = args.rampup_batch_size.size() == 3 ? args.rampup_batch_size[0] : args.global_batch_size;
    return gbs / (args.micro_batch_size * args.data_parallel_size);
  }
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
  // The micro-batch that starts at sample `first` of `split`.
  std::unique_ptr<MicroBatch> micro_batch(int split, int64_t first) const {
    return kind->micro_batch(*data, split, first, args.micro_batch_size);
  }
  // Dropout seed of micro-batch k of an iteration: a pure function of (seed, iteration, k).
  uint64_t dropout_seed(int64_t iteration, int64_t k) const {
    return st.seed * 0x9E3779B97F4A7C15ull + static_cast<uint64_t>(iteration) * 1000003ull + static_cast<uint64_t>(k);
  }
  // Where the LR schedule stands, in samples (Megatron's num_steps: an iteration run counts
  // iterations × global batch), counting only applied updates (Megatron steps its scheduler
  // only after a successful step, so fp16 overflow and spike skips do not advance it).
  int64_t schedule_step() const {
    return args.uses_samples() ? st.consumed_train_samples - st.skipped_samples
                               : (st.iteration - st.skipped_iterations) * args.global_batch_size;
  }
  // The memory a rank may use: the device's, or --memory-cap below it.
  int64_t capacity() const;
  std::string capacity_name() const;
};

}  // namespace mpitron
