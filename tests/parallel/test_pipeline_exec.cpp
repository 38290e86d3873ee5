// tests/parallel/test_pipeline_exec.cpp — the pipeline executor on real ranks.
//
// A toy model: global stage s maps x -> y = tanh(W_s x) (W_s 5x5, fixed),
// micro-batch mb feeds x_mb (fixed) and its loss is sum(y) of the last stage.
// Every schedule (gpipe, 1f1b, interleaved with 2 chunks, zb-h1 and zbv with
// split backward — B the input gradient, W the weight gradient — parsed text) run on
// pp = world size ranks must give each stage's dW and each micro-batch's loss of
// a sequential single-process computation (to 1e-6), and the run statistics the
// checker predicts. Schedules that are impossible at run time (B before its F, a
// send of an output never produced, work left at the end) throw an Error naming
// rank, position and action instead of hanging.
//
// Without mpirun only the pp = 1 cases run (no communicator is needed there).
// mpitron-test: np=2,4
// mpitron-test: timeout=300
#include <doctest/doctest.h>
#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <tuple>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/error.h"
#include "parallel/communicator.h"
#include "parallel/pipeline_exec.h"
#include "parallel/schedule.h"
#include "parallel/schedule_check.h"
#include "parallel/schedule_sim.h"

using namespace mpitron;
using namespace mpitron::parallel;

namespace {

constexpr int kDim = 5;
using Vec = std::vector<float>;
using Mat = std::vector<float>;  // kDim x kDim, row major

bool mpi_up() {
  int up = 0, fin = 0;
  MPI_Initialized(&up);
  MPI_Finalized(&fin);
  return up && !fin;
}
int wrank() {
  int r = 0;
  if (mpi_up()) MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}
int wsize() {
  int n = 1;
  if (mpi_up()) MPI_Comm_size(MPI_COMM_WORLD, &n);
  return n;
}

Mat weight(int stage) {
  Mat w(kDim * kDim);
  for (int i = 0; i < kDim; ++i)
    for (int j = 0; j < kDim; ++j)
      w[i * kDim + j] = static_cast<float>(0.45 * std::sin(1.3 * stage + 0.7 * i + 0.37 * j + 0.1));
  return w;
}
Vec input_of(int mb) {
  Vec x(kDim);
  for (int i = 0; i < kDim; ++i) x[i] = static_cast<float>(std::cos(0.9 * mb + 0.5 * i));
  return x;
}

// The stage math, shared by the runner and the reference.
Vec stage_forward(const Mat& w, const Vec& x) {
  Vec y(kDim);
  for (int i = 0; i < kDim; ++i) {
    double z = 0;
    for (int j = 0; j < kDim; ++j) z += static_cast<double>(w[i * kDim + j]) * x[j];
    y[i] = static_cast<float>(std::tanh(z));
  }
  return y;
}
// Given x, y = f(x) and dL/dy: accumulates dL/dW into dw and returns dL/dx.
Vec stage_backward(const Mat& w, const Vec& x, const Vec& y, const Vec& dy, std::vector<double>& dw) {
  Vec dz(kDim);
  for (int i = 0; i < kDim; ++i) dz[i] = static_cast<float>(static_cast<double>(dy[i]) * (1.0 - double(y[i]) * y[i]));
  Vec dx(kDim, 0.f);
  for (int j = 0; j < kDim; ++j) {
    double s = 0;
    for (int i = 0; i < kDim; ++i) s += static_cast<double>(w[i * kDim + j]) * dz[i];
    dx[j] = static_cast<float>(s);
  }
  for (int i = 0; i < kDim; ++i)
    for (int j = 0; j < kDim; ++j) dw[i * kDim + j] += static_cast<double>(dz[i]) * x[j];
  return dx;
}

struct Reference {
  std::vector<std::vector<double>> dw;  // per global stage
  std::vector<double> loss;             // per micro-batch
};
Reference sequential(int stages, int micro_batches) {
  Reference r;
  r.dw.assign(stages, std::vector<double>(kDim * kDim, 0.0));
  for (int mb = 0; mb < micro_batches; ++mb) {
    std::vector<Vec> xs, ys;
    Vec x = input_of(mb);
    for (int s = 0; s < stages; ++s) {
      xs.push_back(x);
      x = stage_forward(weight(s), x);
      ys.push_back(x);
    }
    double loss = 0;
    for (float v : x) loss += v;
    r.loss.push_back(loss);
    Vec g(kDim, 1.f);
    for (int s = stages - 1; s >= 0; --s) g = stage_backward(weight(s), xs[s], ys[s], g, r.dw[s]);
  }
  return r;
}

Tensor to_tensor(const Vec& v) { return Tensor::from_vector(v, {kDim}); }
Vec from_tensor(const Tensor& t) {
  REQUIRE(t.defined());
  REQUIRE(t.numel() == kDim);
  return t.to_floats();
}

// The runner of pipeline rank `rank`: checks what the executor hands it.
class ToyRunner : public StageRunner {
 public:
  ToyRunner(const Schedule& s, int rank) : s_(s), rank_(rank) {
    for (int c = 0; c < s.virtual_stages; ++c) dw[c].assign(kDim * kDim, 0.0);
  }
  Tensor forward(int mb, int chunk, const Tensor& input) override {
    const int st = s_.stage(rank_, chunk);
    CHECK(saved_.count({mb, chunk}) == 0);
    Vec x;
    if (st == 0) {
      CHECK_FALSE(input.defined());
      x = input_of(mb);
    } else {
      x = from_tensor(input);
    }
    Vec y = stage_forward(weight(st), x);
    saved_[{mb, chunk}] = {x, y};
    if (st == s_.stages() - 1) {
      double l = 0;
      for (float v : y) l += v;
      CHECK(loss.count(mb) == 0);
      loss[mb] = l;
      return Tensor();
    }
    return to_tensor(y);
  }
  Tensor backward(int mb, int chunk, const Tensor& grad_output) override {
    CHECK_FALSE(has_weight_actions(s_));  // a split schedule calls backward_input
    const int st = s_.stage(rank_, chunk);
    auto it = saved_.find({mb, chunk});
    REQUIRE(it != saved_.end());
    Vec dy;
    if (st == s_.stages() - 1) {
      CHECK_FALSE(grad_output.defined());
      dy.assign(kDim, 1.f);  // d sum(y) / dy
    } else {
      dy = from_tensor(grad_output);
    }
    Vec dx = stage_backward(weight(st), it->second.first, it->second.second, dy, dw[chunk]);
    saved_.erase(it);
    return st == 0 ? Tensor() : to_tensor(dx);
  }
  // Split backward: B computes dx only and keeps (x, y, dy) for W, which adds dW.
  Tensor backward_input(int mb, int chunk, const Tensor& grad_output) override {
    CHECK(has_weight_actions(s_));
    const int st = s_.stage(rank_, chunk);
    auto it = saved_.find({mb, chunk});
    REQUIRE(it != saved_.end());
    Vec dy = st == s_.stages() - 1 ? Vec(kDim, 1.f) : from_tensor(grad_output);
    if (st == s_.stages() - 1) CHECK_FALSE(grad_output.defined());
    std::vector<double> scratch(kDim * kDim, 0.0);  // dW is W's job
    Vec dx = stage_backward(weight(st), it->second.first, it->second.second, dy, scratch);
    CHECK(for_w_.count({mb, chunk}) == 0);
    for_w_[{mb, chunk}] = {it->second.first, it->second.second, dy};
    saved_.erase(it);
    return st == 0 ? Tensor() : to_tensor(dx);
  }
  void backward_weight(int mb, int chunk) override {
    auto it = for_w_.find({mb, chunk});
    REQUIRE(it != for_w_.end());
    const auto& [x, y, dy] = it->second;
    stage_backward(weight(s_.stage(rank_, chunk)), x, y, dy, dw[chunk]);
    for_w_.erase(it);
    ++weights;
  }
  Tensor make_recv_buffer(int, int) override { return Tensor::empty({kDim}, DType::F32); }
  bool can_split_backward() const override { return true; }
  bool supports_placement(const Schedule&) const override { return true; }  // chunks follow s.stage()

  bool all_backwards_done() const { return saved_.empty() && for_w_.empty(); }
  int weights = 0;
  std::map<int, std::vector<double>> dw;  // per local chunk
  std::map<int, double> loss;             // per micro-batch (last stage only)

 private:
  const Schedule& s_;
  int rank_;
  std::map<std::pair<int, int>, std::pair<Vec, Vec>> saved_;
  std::map<std::pair<int, int>, std::tuple<Vec, Vec, Vec>> for_w_;  // what B kept for W
};

// Compares the runner's dW and losses with the sequential reference.
void check_against_reference(const Schedule& s, int rank, const ToyRunner& run) {
  const Reference ref = sequential(s.stages(), s.micro_batches);
  CHECK(run.all_backwards_done());
  for (int c = 0; c < s.virtual_stages; ++c) {
    const int st = s.stage(rank, c);
    double err = 0;
    for (int k = 0; k < kDim * kDim; ++k) err = std::max(err, std::fabs(run.dw.at(c)[k] - ref.dw[st][k]));
    INFO("stage ", st, " (rank ", rank, " chunk ", c, ")");
    CHECK(err < 1e-6);
  }
  const bool last = s.rank_of_stage(s.stages() - 1) == rank;
  if (last) {
    REQUIRE(static_cast<int>(run.loss.size()) == s.micro_batches);
    for (int mb = 0; mb < s.micro_batches; ++mb) CHECK(std::fabs(run.loss.at(mb) - ref.loss[mb]) < 1e-6);
  } else {
    CHECK(run.loss.empty());
  }
}

// Sends/recvs and F/B of rank r, counted from the schedule itself.
void check_stats(const Schedule& s, int rank, const PipelineStats& st) {
  int64_t sends = 0, recvs = 0, f = 0, b = 0, w = 0, batches = 0;
  const auto& acts = s.ranks[rank];
  for (size_t i = 0; i < acts.size(); ++i) {
    const Action& a = acts[i];
    sends += is_send(a.op);
    recvs += is_recv(a.op);
    f += a.op == Op::Forward;
    b += a.op == Op::Backward;
    w += a.op == Op::Weight;
    batches += !is_compute(a.op) && !a.batched;
  }
  CHECK(st.sends == sends);
  CHECK(st.recvs == recvs);
  CHECK(st.forwards == f);
  CHECK(st.backwards == b);
  CHECK(st.weights == w);
  CHECK(st.batches == batches);
  CHECK(st.forwards == int64_t(s.micro_batches) * s.virtual_stages);
  const CheckResult cr = check_schedule(s);
  REQUIRE(cr.ok);
  CHECK(st.peak_live_activations == cr.peak_in_flight[rank]);
  if (s.pp > 1) CHECK(st.peak_live_buffers >= 1);
}

// Runs s on this rank's pipeline group and checks everything.
void run_and_check(const Schedule& s, int pp_rank, Communicator* comm) {
  INFO("schedule ", s.name, " pp ", s.pp, " v ", s.virtual_stages, " m ", s.micro_batches, " rank ", pp_rank);
  validate_schedule(s);
  ToyRunner runner(s, pp_rank);
  PipelineStats st = comm ? run_pipeline_schedule(s, pp_rank, *comm, runner) : run_pipeline_schedule(s, runner);
  check_stats(s, pp_rank, st);
  check_against_reference(s, pp_rank, runner);
  if (has_weight_actions(s)) CHECK(runner.weights == s.micro_batches * s.virtual_stages);
}

// A runner that cannot split backward (StageRunner's defaults for B and W).
class PlainRunner : public StageRunner {
 public:
  PlainRunner(const Schedule& s, int rank) : toy_(s, rank) {}
  Tensor forward(int mb, int chunk, const Tensor& input) override { return toy_.forward(mb, chunk, input); }
  Tensor backward(int mb, int chunk, const Tensor& g) override { return toy_.backward(mb, chunk, g); }
  Tensor make_recv_buffer(int mb, int chunk) override { return toy_.make_recv_buffer(mb, chunk); }

 private:
  ToyRunner toy_;
};

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.message();
  }
  return "";
}

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

}  // namespace

TEST_CASE("pp = 1: every built-in, no communicator, matches the sequential model") {
  for (int m : {1, 2, 5}) {
    run_and_check(gpipe_schedule(1, m), 0, nullptr);
    run_and_check(one_f_one_b_schedule(1, m), 0, nullptr);
    for (int v : {2, 3}) run_and_check(interleaved_schedule(1, m, v), 0, nullptr);  // chunks hand on locally
  }
  // A user-written pp = 1 schedule with 2 local chunks.
  run_and_check(parse_schedule("pp 1\nvirtual-stages 2\nmicro-batches 2\n"
                               "rank 0: F0.0 F0.1 F1.0 B0.1 F1.1 B0.0 B1.1 B1.0\n",
                               "local.sched"),
                0, nullptr);
  if (mpi_up()) {
    // The same through a communicator of one rank.
    auto self = make_mpi_communicator(MPI_COMM_SELF, CommOptions{"pp-self"});
    run_and_check(one_f_one_b_schedule(1, 3), 0, self.get());
    run_and_check(interleaved_schedule(1, 2, 2), 0, self.get());
  }
}

TEST_CASE("pp = 1: split backward (zb-h1, zbv, a file with W) matches the sequential model") {
  for (int m : {1, 2, 5}) {
    run_and_check(zb_h1_schedule(1, m), 0, nullptr);
    run_and_check(zbv_schedule(1, m), 0, nullptr);  // V on one rank: both chunks local
  }
  run_and_check(parse_schedule("pp 1\nvirtual-stages 2\nmicro-batches 2\n"
                               "rank 0: F0.0 F0.1 F1.0 B0.1 F1.1 B0.0 B1.1 W0.1 B1.0 W1.1 W0.0 W1.0\n",
                               "split.sched"),
                0, nullptr);
  // A runner without backward_input/backward_weight is told so.
  Schedule s = zb_h1_schedule(1, 2);
  PlainRunner plain(s, 0);
  const std::string e = error_of([&] { run_pipeline_schedule(s, plain); });
  INFO(e);
  CHECK(contains(e, "has W actions, but this runner cannot split backward (pipeline rank 0)"));

  // W before its B, and a B whose W never runs.
  Schedule wb = parse_schedule("pp 1\nmicro-batches 1\nrank 0: F0 W0 B0\n", "wb.sched");
  ToyRunner r(wb, 0);
  CHECK(contains(error_of([&] { run_pipeline_schedule(wb, r); }),
                 "action 1 (W0.0, line 3:12): weight gradient before its input gradient"));
  Schedule nw = zb_h1_schedule(1, 2);
  REQUIRE(to_string(nw.ranks[0].back()) == "W1.0");
  nw.ranks[0].pop_back();
  ToyRunner r2(nw, 0);
  CHECK(contains(error_of([&] { run_pipeline_schedule(nw, r2); }), "B1.0 ran but W1.0 never did"));
}

TEST_CASE("profile: every F/B/W and batch is timed; medians per stage make a costs file") {
  Schedule s = zbv_schedule(1, 3);
  ToyRunner runner(s, 0);
  PipelineProfile prof;
  int syncs = 0;
  prof.sync = [&] { ++syncs; };
  run_pipeline_schedule(s, runner, &prof);
  ToyRunner second(s, 0);
  run_pipeline_schedule(s, second, &prof);  // two steps into one profile
  CHECK(prof.compute.size() == 2 * s.ranks[0].size());
  CHECK(syncs == 2 * 2 * static_cast<int>(s.ranks[0].size()));  // before and after each action
  CHECK(prof.split);
  CHECK(prof.stages == 2);
  for (const auto& x : prof.compute) CHECK(x.ms >= 0);
  const Costs c = prof.costs();
  REQUIRE(c.stage_forward.size() == 2);
  REQUIRE(c.stage_weight.size() == 2);
  for (int st = 0; st < 2; ++st) {
    CHECK(c.stage_forward[st] >= 0);
    CHECK(c.stage_backward[st] >= 0);
    CHECK(c.stage_weight[st] >= 0);
  }
  // The medians are the samples' medians.
  std::vector<double> f0;
  for (const auto& x : prof.compute)
    if (x.op == Op::Forward && x.stage == 0) f0.push_back(x.ms);
  REQUIRE(f0.size() == 6);
  std::sort(f0.begin(), f0.end());
  CHECK(c.stage_forward[0] == doctest::Approx((f0[2] + f0[3]) / 2));
  // Through the text format and back.
  const Costs back = parse_costs(write_costs(c), "c.costs");
  CHECK(back.stage_forward.size() == 2);
  CHECK(back.stage_weight.size() == 2);
  CHECK(back.stage_backward[1] == doctest::Approx(c.stage_backward[1]).epsilon(1e-5));
  prof.clear();
  CHECK(prof.compute.empty());
}

TEST_CASE("pp = 1: impossible schedules throw with rank, position and action") {
  SUBCASE("B before its F (parsed: the line:column is named)") {
    Schedule s = parse_schedule("pp 1\nmicro-batches 2\nrank 0: F0 B1 F1 B0\n", "bad.sched");
    ToyRunner r(s, 0);
    const std::string e = error_of([&] { run_pipeline_schedule(s, r); });
    INFO(e);
    CHECK(contains(e, "pipeline rank 0, action 1 (B1.0, line 3:12)"));
    CHECK(contains(e, "backward before its forward: F1.0 has not run"));
  }
  SUBCASE("a chunk before the chunk that feeds it") {
    Schedule s = parse_schedule("pp 1\nvirtual-stages 2\nmicro-batches 1\nrank 0: F0.1 F0.0 B0.0 B0.1\n");
    ToyRunner r(s, 0);
    const std::string e = error_of([&] { run_pipeline_schedule(s, r); });
    INFO(e);
    CHECK(contains(e, "action 0 (F0.1"));
    CHECK(contains(e, "output of F0.0, which has not run yet"));
  }
  SUBCASE("work left at the end") {
    Schedule s = parse_schedule("pp 1\nvirtual-stages 2\nmicro-batches 1\nrank 0: F0.0\n");
    ToyRunner r(s, 0);
    const std::string e = error_of([&] { run_pipeline_schedule(s, r); });
    INFO(e);
    CHECK(contains(e, "finished its 1 actions with work left"));
    CHECK(contains(e, "the input received for F0.1 was never used"));
    CHECK(contains(e, "F0.0 ran but B0.0 never did"));
  }
  SUBCASE("a send on one rank, and a pp > 1 schedule without a communicator") {
    Schedule s = gpipe_schedule(1, 1);
    s.ranks[0].insert(s.ranks[0].begin() + 1, Action{Op::SendAct, 0, 0, 0});
    ToyRunner r(s, 0);
    const std::string e = error_of([&] { run_pipeline_schedule(s, r); });
    INFO(e);
    CHECK(contains(e, "action 1 (SA0.0>0)"));
    CHECK(contains(e, "last stage"));
    Schedule two = gpipe_schedule(2, 1);
    ToyRunner r2(two, 0);
    CHECK(contains(error_of([&] { run_pipeline_schedule(two, r2); }), "needs the pipeline communicator"));
  }
}

TEST_CASE("built-in schedules on pp = world ranks match the sequential model") {
  if (!mpi_up()) {
    MESSAGE("not under mpirun: only the pp = 1 cases run");
    return;
  }
  const int p = wsize(), r = wrank();
  CommOptions o;
  o.name = "pp";
  o.timeout_s = 60;
  auto comm = make_mpi_communicator(MPI_COMM_WORLD, o);
  for (int m : {1, p, 2 * p + 1}) {
    run_and_check(gpipe_schedule(p, m), r, comm.get());
    run_and_check(one_f_one_b_schedule(p, m), r, comm.get());
  }
  for (int m : {p, 2 * p, 3 * p}) run_and_check(interleaved_schedule(p, m, 2), r, comm.get());
  run_and_check(interleaved_schedule(p, p, 3), r, comm.get());
  comm->barrier();
}

TEST_CASE("zb-h1 and zbv on pp = world ranks match the sequential model; the profile gathers every stage") {
  if (!mpi_up()) return;
  const int p = wsize(), r = wrank();
  CommOptions o;
  o.name = "pp";
  o.timeout_s = 60;
  auto comm = make_mpi_communicator(MPI_COMM_WORLD, o);
  for (int m : {1, p, 2 * p + 1}) run_and_check(zb_h1_schedule(p, m), r, comm.get());
  for (int m : {1, p, 2 * p, 3 * p}) run_and_check(zbv_schedule(p, m), r, comm.get());
  // An explicit placement (rank order reversed for the second chunk), timed p2p.
  std::string place = "placement";
  for (int st = 0; st < 2 * p; ++st) place += " " + std::to_string(st < p ? st : (st - p + 1) % p);
  std::string text = str("pp ", p, "\nvirtual-stages 2\nmicro-batches 2\n", place, "\np2p timed\n");
  for (int k = 0; k < p; ++k) text += str("rank ", k, ": F0.0 F1.0 F0.1 F1.1 B0.1 B1.1 B0.0 B1.0 W0.1 W1.1 W0.0 W1.0\n");
  run_and_check(parse_schedule(text, "explicit.sched"), r, comm.get());
  // A runner laid out round-robin (the default supports_placement) refuses V up front, on every rank.
  Schedule v_order = compute_only(zbv_schedule(p, 2));
  for (auto& acts : v_order.ranks)
    acts.erase(std::remove_if(acts.begin(), acts.end(), [](const Action& a) { return a.op == Op::Weight; }),
               acts.end());
  const Schedule v_plain = with_timed_p2p(v_order);
  CHECK(check_schedule(v_plain).ok);
  PlainRunner plain(v_plain, r);
  const std::string e = error_of([&] { run_pipeline_schedule(v_plain, r, *comm, plain); });
  CHECK(contains(e, "uses placement v, but this runner's model chunks are laid out for another"));
  // Profile: each rank times its own stages; the gather fills them all in.
  Schedule s = zb_h1_schedule(p, 2 * p);
  ToyRunner runner(s, r);
  PipelineProfile prof;
  run_pipeline_schedule(s, r, *comm, runner, &prof);
  const Costs mine = prof.costs();
  for (int st = 0; st < p; ++st) CHECK((mine.stage_forward[st] >= 0) == (st == r));
  CHECK(prof.p2p_ms.size() > 0);
  const Costs all = gather_pipeline_costs(prof, *comm);
  REQUIRE(all.stage_forward.size() == static_cast<size_t>(p));
  REQUIRE(all.stage_weight.size() == static_cast<size_t>(p));
  for (int st = 0; st < p; ++st) {
    CHECK(all.stage_forward[st] >= 0);
    CHECK(all.stage_backward[st] >= 0);
    CHECK(all.stage_weight[st] >= 0);
  }
  CHECK(all.stage_forward[r] == mine.stage_forward[r]);
  comm->barrier();
}

TEST_CASE("parsed schedules: a user-written gpipe and an explicit 1F1B on pp = 2 groups") {
  if (!mpi_up()) return;
  const int n = wsize(), r = wrank();
  if (n % 2 != 0) return;
  // Pairs of ranks {0,1}, {2,3}, …: each a pipeline group of 2 (group rank = pipeline rank).
  MPI_Comm pair = MPI_COMM_NULL;
  MPI_Comm_split(MPI_COMM_WORLD, r / 2, r % 2, &pair);
  {
    CommOptions o;
    o.name = "pp-pair";
    o.timeout_s = 60;
    auto comm = make_mpi_communicator(pair, o);
    const int pr = comm->rank();
    // GPipe written by hand, p2p auto (the parser inserts sends/recvs).
    Schedule g = parse_schedule(
        "# gpipe, two ranks, three micro-batches\n"
        "schedule my-gpipe\n"
        "pp 2\n"
        "micro-batches 3\n"
        "rank 0: F0 F1 F2 B0 B1 B2\n"
        "rank 1: F0 F1 F2 B0 B1 B2\n",
        "my-gpipe.sched");
    CHECK(has_p2p(g));
    run_and_check(g, pr, comm.get());
    // 1F1B with every send/recv written, batches included (the docs' example).
    Schedule f = parse_schedule(
        "pp 2\nmicro-batches 2\np2p explicit\n"
        "rank 0: F0.0 SA0.0>1 F1.0 [SA1.0>1 RG0.0<1] B0.0 RG1.0<1 B1.0\n"
        "rank 1: RA0.0<0 F0.0 B0.0 [SG0.0>0 RA1.0<0] F1.0 B1.0 SG1.0>0\n",
        "explicit.sched");
    run_and_check(f, pr, comm.get());
    // A written-out interleaved schedule read back.
    run_and_check(parse_schedule(write_schedule(interleaved_schedule(2, 4, 2)), "il.sched"), pr, comm.get());
    comm->barrier();
  }
  MPI_Comm_free(&pair);
}

TEST_CASE("impossible at run time on pp = world ranks: every rank throws, nobody hangs") {
  if (!mpi_up()) return;
  const int p = wsize(), r = wrank();
  if (p < 2) return;
  CommOptions o;
  o.name = "pp";
  o.timeout_s = 60;
  auto comm = make_mpi_communicator(MPI_COMM_WORLD, o);
  // From gpipe, each rank gets an impossible first action (the checker would
  // reject it; the executor must find it alone): rank 0 sends an output never
  // produced, the last rank runs B before its F, middle ranks send an input
  // gradient never produced.
  Schedule s = gpipe_schedule(p, 2);
  s.name = "broken";
  std::string want_action, want_why;
  for (int q = 0; q < p; ++q) {
    Action a;
    if (q == 0) {
      a = Action{Op::SendAct, 1, 0, 1};
    } else if (q == p - 1) {
      a = Action{Op::Backward, 0, 0, -1};
    } else {
      a = Action{Op::SendGrad, 0, 0, q - 1};
    }
    s.ranks[q].insert(s.ranks[q].begin(), a);
    if (q == r) want_action = to_string(a);
  }
  CHECK_FALSE(check_schedule(s).ok);
  ToyRunner runner(s, r);
  const std::string e = error_of([&] { run_pipeline_schedule(s, r, *comm, runner); });
  INFO(e);
  CHECK(contains(e, "schedule 'broken'"));
  CHECK(contains(e, str("pipeline rank ", r, ", action 0 (", want_action, ")")));
  if (r == 0)
    CHECK(contains(e, "sends an output never produced: F1.0 has not run yet"));
  else if (r == p - 1)
    CHECK(contains(e, "backward before its forward: F0.0 has not run"));
  else
    CHECK(contains(e, "sends an input gradient never produced: B0.0 has not run yet"));

  // A receive of a gradient before the forward that makes it: a deadlock the
  // checker finds globally, here caught locally on rank 0 before posting.
  Schedule g = gpipe_schedule(p, 1);
  auto& r0 = g.ranks[0];
  for (size_t i = 0; i < r0.size(); ++i)
    if (r0[i].op == Op::RecvGrad) {
      Action rg = r0[i];
      rg.batched = false;
      r0.erase(r0.begin() + static_cast<long>(i));
      r0.insert(r0.begin(), rg);
      break;
    }
  if (r == 0) {
    ToyRunner r0run(g, 0);
    const std::string e2 = error_of([&] { run_pipeline_schedule(g, 0, *comm, r0run); });
    INFO(e2);
    CHECK(contains(e2, "pipeline rank 0, action 0 (RG0.0<1)"));
    CHECK(contains(e2, "gradient of an output not produced yet"));
  }
  // Nothing was posted: the communicator is still clean and usable.
  comm->barrier();
  Tensor t = Tensor::from_vector({1.f}, {1});
  comm->all_reduce(t);
  CHECK(t.to_floats()[0] == static_cast<float>(p));
}

TEST_CASE("a communicator that does not match the schedule is refused") {
  if (!mpi_up()) return;
  const int p = wsize(), r = wrank();
  auto comm = make_mpi_communicator(MPI_COMM_WORLD, CommOptions{"pp"});
  Schedule s = gpipe_schedule(p + 1, 1);
  ToyRunner runner(s, r);
  CHECK(contains(error_of([&] { run_pipeline_schedule(s, r, *comm, runner); }), "has " + std::to_string(p) + " ranks"));
  Schedule t = gpipe_schedule(p, 1);
  ToyRunner runner2(t, (r + 1) % p);
  if (p > 1)
    CHECK(contains(error_of([&] { run_pipeline_schedule(t, (r + 1) % p, *comm, runner2); }),
                   "asked to run pipeline rank"));
}
