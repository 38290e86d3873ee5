// Pipeline parallelism in the trainer (model/training/trainer_impl.h): the schedule of a
// step (built, or read from --pipeline-schedule FILE), this rank's model chunks as the
// executor's stage runner (parallel/pipeline_exec.h), forward-only evaluation stage after
// stage, the tied embedding's gradient sum, and --profile-pipeline's measured costs.
#include <algorithm>

#include "core/device_memory.h"
#include "core/log.h"
#include "parallel/schedule_check.h"
#include "model/training/trainer_impl.h"

namespace mpitron {

const parallel::Schedule& Trainer::Impl::schedule_for(int64_t n_micro) {
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

// This rank's model chunks for the pipeline executor: one tape per (micro-batch, chunk).
struct Trainer::Impl::StageRunner final : parallel::StageRunner {
  Impl& m;
  int64_t consumed;
  float loss_seed;  // loss_scale / micro-batches
  double loss_sum = 0;
  struct Live {
    std::unique_ptr<Tape> tape;
    Var input, output;
  };
  std::map<std::pair<int, int>, Live> live;
  std::map<int, std::unique_ptr<MicroBatch>> batches;  // micro-batch → its samples
  std::map<int, int> last_backward;                    // chunk → the micro-batch of its last B in the schedule
  // Split backward (schedules with W actions): B runs the tape with the blocks' weight
  // gradients deferred into this (micro-batch, chunk)'s work list; W runs it.
  std::map<std::pair<int, int>, WeightGradWork> deferred;

  StageRunner(Impl& impl, int64_t consumed_samples, float seed) : m(impl), consumed(consumed_samples), loss_seed(seed) {}

  const MicroBatch& batch(int mb) {
    auto it = batches.find(mb);
    if (it == batches.end()) it = batches.emplace(mb, m.micro_batch(0, m.micro_first(consumed, mb))).first;
    return *it->second;
  }
  Tensor forward(int mb, int chunk, const Tensor& input) override {
    Live& l = live[{mb, chunk}];
    l.tape = std::make_unique<Tape>();
    const ChunkInfo& ch = m.model->chunk(chunk);
    if (!ch.first_stage) l.input = Var(input, true);
    ForwardOptions o = m.training_options(mb);
    // The chunk's last backward makes its blocks' gradients final: the data-parallel
    // buckets start reducing them while the schedule goes on.
    m.states->add_hooks(o, last_backward.at(chunk) == mb);
    l.output = m.kind->chunk_forward(*l.tape, chunk, batch(mb), l.input, o);
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
    MPT_CHECK(it != live.end(), str("pipeline backward of micro-batch ", mb, " chunk ", chunk, " before its forward"), "");
    Live l = std::move(it->second);
    live.erase(it);
    l.tape->set_defer_weight_grads(defer);
    if (m.model->chunk(chunk).last_stage) l.tape->backward(l.output, loss_seed);
    else l.tape->backward(l.output, grad_output);
    if (m.model->chunk(chunk).first_stage) return Tensor();
    return l.input.grad();
  }
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

// One training step's forward/backward over the schedule; the summed loss of its
// micro-batches on the last stage (0 elsewhere). Data-parallel reduction: each chunk's
// buckets launch during its last backward; the tied embedding's copies are summed over
// the embedding group first and reduced with what is left when the schedule ends.
double Trainer::Impl::pipeline_step(int64_t n_micro, float loss_seed) {
  const parallel::Schedule& sched = schedule_for(n_micro);
  StageRunner runner(*this, st.consumed_train_samples, loss_seed);
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
// Stages follow the schedule's placement (round-robin, or V for zbv): a neighbour stage
// on this same rank is handed on without a message.
double Trainer::Impl::pipeline_eval(const MicroBatch& mb) {
  const parallel::Schedule& sched = schedules.begin()->second;
  const int stages = sched.stages(), me = par.pp_rank;
  double loss = 0;
  Var carried;  // the previous stage's output when that stage is on this rank
  for (int s = 0; s < stages; ++s) {
    if (sched.rank_of_stage(s) != me) continue;
    Tape tape;
    NoGradGuard no_grad(tape);
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
    Var out = kind->chunk_forward(tape, sched.chunk_of_stage(s), mb, input, o);
    if (s == stages - 1) loss = out.value().item();
    else if (sched.rank_of_stage(s + 1) == me) carried = out;
    else par.pp->send(out.value(), sched.rank_of_stage(s + 1));
  }
  return loss;
}

// After the last backward of a step: the word embedding's two copies (first and last
// pipeline stage: the tied head's, or multi-token prediction's shared embedding) get the
// sum of their gradients (an untied output layer without MTP has a single copy).
void Trainer::Impl::reduce_embedding_grads() {
  if (!par.embedding || !model->config().embedding_on_last_stage()) return;
  const parallel::Schedule& sched = schedules.begin()->second;
  if (sched.rank_of_stage(0) == sched.rank_of_stage(sched.stages() - 1)) return;  // V: both ends on one rank, one copy
  const ParamSet& ps = model->params();
  // Each parameter's own gradient (ZeRO-3 keeps them outside the flat buffer, or sharded).
  for (size_t i = 0; i < ps.infos().size(); ++i)
    if (ps.infos()[i].role == ParamRole::WordEmbedding) states->sum_grad_over(ps.var(i), i, *par.embedding);
}

// Writes the measured per-stage costs (collective over the pipeline group).
void Trainer::Impl::write_pipeline_profile() {
  if (!profile) return;
  const parallel::Costs c = parallel::gather_pipeline_costs(*profile, *par.pp);
  if (par.pp_rank == 0 && par.dp_rank == 0 && par.tp_rank == 0) {
    // What schedule_sim predicts is the schedule alone (no optimizer step, no gradient
    // reduction after it): its measured wall time, median over the steps.
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

}  // namespace mpitron
