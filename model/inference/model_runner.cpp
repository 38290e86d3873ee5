#include "model/inference/model_runner.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <thread>
#include <unordered_map>

#include "core/error.h"
#include "core/log.h"
#include "model/inference/inference_load.h"
#include "model/layers/model_ends.h"
#include "model/checkpoint/checkpointing.h"
#include "parallel/job_exit.h"
#include "tensor/ops.h"

namespace mpitron {

namespace {

const GemmArgs kLinear{false, true, 1.0f, 0.0f};  // y = x · Wᵀ
constexpr int kLogitsTag = 3071, kScoreTag = 3072;

int64_t round_up(int64_t n, int64_t m) { return (n + m - 1) / m * m; }

double now_s() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

// A raw MPI call of a step (the logits' gather and send) bounded as every collective is: a rank
// that does not arrive within MPITRON_COMM_TIMEOUT_S ends the job (parallel/job_exit.h).
// A raw MPI call of the step, bounded; the message names the world ranks it waits on (one of
// them is the frozen, hung or dead one: a raw call cannot tell which, the Communicator's can).
JobDeadline step_deadline(const char* what, const std::vector<int>& peers, int self) {
  std::string who;
  for (int r : peers)
    if (r != self) who += str(who.empty() ? "" : ", ", "world rank ", r);
  return JobDeadline(str(what, " of a serving step (on world rank ", self, ", waiting for ", who, ")"),
                     "a rank is frozen, hung or dead; MPITRON_COMM_TIMEOUT_S sets the timeout", comm_timeout_from_env());
}

Tensor ids_tensor(const std::vector<int64_t>& v, Device d) {
  return Tensor::from_ints(v, {static_cast<int64_t>(v.size())}, DType::I32).to(d);
}

// Per row of a vocabulary slice: what the TP group combines into the row's loss and argmax.
struct RowStats {
  double max = -INFINITY, sum = 0, target = NAN, best = -INFINITY;
  double best_id = 0;
};

}  // namespace

// ---------------------------------------------------------------------------
// StepPlan

void StepPlan::validate(int64_t vocab, int64_t max_positions, int64_t num_blocks, int64_t block_size) const {
  const size_t n = tokens.size();
  MPT_CHECK(n >= 1 && rows.pos.size() == n && rows.seq.size() == n,
            str("step plan: ", n, " tokens, ", rows.pos.size(), " positions, ", rows.seq.size(), " sequence ids"), "");
  for (size_t i = 0; i < n; ++i) {
    MPT_CHECK(tokens[i] >= 0 && tokens[i] < vocab, str("step plan: token ", tokens[i], " outside [0, ", vocab, ")"), "");
    MPT_CHECK(rows.pos[i] >= 0 && rows.pos[i] < max_positions,
              str("step plan: position ", rows.pos[i], " outside [0, ", max_positions, ")"), "");
    MPT_CHECK(rows.seq[i] >= 0 && static_cast<size_t>(rows.seq[i]) < rows.tables.size(),
              str("step plan: sequence ", rows.seq[i], " has no block table"), "");
    MPT_CHECK(rows.pos[i] / block_size < static_cast<int64_t>(rows.tables[static_cast<size_t>(rows.seq[i])].size()),
              str("step plan: position ", rows.pos[i], " is beyond its sequence's block table"), "");
  }
  for (const auto& t : rows.tables)
    for (int32_t b : t) MPT_CHECK(b >= 0 && b < num_blocks, str("step plan: block ", b, " outside the pool"), "");
  // Prefix caching shares blocks between tables, never one that a row writes: a written block is its sequence's own.
  std::unordered_map<int32_t, int32_t> writer;  // block -> the sequence whose row writes it
  for (size_t i = 0; i < n; ++i)
    writer.emplace(rows.tables[static_cast<size_t>(rows.seq[i])][static_cast<size_t>(rows.pos[i] / block_size)],
                   rows.seq[i]);
  for (size_t q = 0; q < rows.tables.size(); ++q)
    for (int32_t b : rows.tables[q]) {
      const auto w = writer.find(b);
      MPT_CHECK(w == writer.end() || w->second == static_cast<int32_t>(q),
                str("step plan: block ", b, " is written by a row of sequence ", w->second, " and read by sequence ", q),
                "a shared (prefix-cached) block must never be written");
    }
  for (int32_t r : logits_rows)
    MPT_CHECK(r >= 0 && static_cast<size_t>(r) < n, str("step plan: logits of row ", r, " of ", n), "");
  MPT_CHECK(kind == 0 || (kind == 1 && hidden_rows.size() == n), str("step plan: kind ", kind, " with ",
            hidden_rows.size(), " hidden rows for ", n, " rows"), "");
}

std::vector<int32_t> StepPlan::serialize() const {
  std::vector<int32_t> v{static_cast<int32_t>(tokens.size()), static_cast<int32_t>(rows.tables.size()),
                         static_cast<int32_t>(logits_rows.size()), kind, static_cast<int32_t>(hidden_rows.size())};
  v.insert(v.end(), hidden_rows.begin(), hidden_rows.end());
  v.insert(v.end(), tokens.begin(), tokens.end());
  for (int64_t p : rows.pos) v.push_back(static_cast<int32_t>(p));
  v.insert(v.end(), rows.seq.begin(), rows.seq.end());
  v.insert(v.end(), logits_rows.begin(), logits_rows.end());
  for (const auto& t : rows.tables) {
    v.push_back(static_cast<int32_t>(t.size()));
    v.insert(v.end(), t.begin(), t.end());
  }
  return v;
}

StepPlan StepPlan::deserialize(const std::vector<int32_t>& v) {
  MPT_CHECK(v.size() >= 5, "step plan: truncated message", "");
  const size_t n = static_cast<size_t>(v[0]), nseq = static_cast<size_t>(v[1]), nl = static_cast<size_t>(v[2]);
  size_t at = 5;
  const auto take = [&](size_t k) {
    MPT_CHECK(at + k <= v.size(), "step plan: truncated message", "");
    const auto b = v.begin() + static_cast<std::ptrdiff_t>(at);
    at += k;
    return std::vector<int32_t>(b, b + static_cast<std::ptrdiff_t>(k));
  };
  StepPlan p;
  p.kind = v[3];
  p.hidden_rows = take(static_cast<size_t>(v[4]));
  p.tokens = take(n);
  for (int32_t x : take(n)) p.rows.pos.push_back(x);
  p.rows.seq = take(n);
  p.logits_rows = take(nl);
  for (size_t s = 0; s < nseq; ++s) p.rows.tables.push_back(take(static_cast<size_t>(take(1)[0])));
  return p;
}

// ---------------------------------------------------------------------------
// Construction and loading

ModelRunner::ModelRunner(MPI_Comm world, const std::string& load_dir, const RunnerOptions& o) : opts_(o) {
  int world_size = 1;
  MPI_Comm_size(world, &world_size);
  MPT_CHECK(o.tp >= 1 && o.pp >= 1 && world_size == o.tp * o.pp,
            str("inference runs on --tensor-model-parallel-size x --pipeline-model-parallel-size = ", o.tp, " x ", o.pp,
                " = ", o.tp * o.pp, " ranks, but ", world_size, " were started"),
            str("start it with mpirun -np ", std::max(1, o.tp * o.pp), ", or change the parallel sizes"));
  GridConfig gc;
  gc.tp = o.tp;
  gc.pp = o.pp;
  grid_ = std::make_unique<Grid>(world, gc);
  MPT_CHECK(o.device != "cuda" || cuda_available(), str("--device cuda: ", cuda_unavailable_reason()),
            "run on a machine with a GPU, or use --device cpu");
  const bool gpu = o.device == "cuda" || (o.device == "auto" && cuda_available());
  const Device dev = gpu ? Device::cuda(std::max(0, grid_->device_index())) : Device::cpu();
  const auto make = [&](MPI_Comm c, const char* name) {
    CommOptions co;
    co.name = name;
    co.force_mpi_for_device = o.force_mpi_for_device;
    return make_communicator(c, dev, co);
  };
  if (o.tp > 1) tp_comm_ = make(grid_->tp_comm(), "tp");
  if (o.pp > 1) pp_comm_ = make(grid_->pp_comm(), "pp");
  MPI_Comm_dup(world, &control_);
  {
    CommOptions co;
    co.name = "serve";  // the driver's step headers, plans and heartbeats
    ctl_ = make_communicator(control_, Device::cpu(), co);
    const double timeout = ctl_->options().timeout_s;
    heartbeat_s_ = o.serving && timeout > 0 ? std::min(10.0, timeout / 4) : 0;
    last_control_s_ = now_s();
  }

  GPTConfig cfg = read_checkpoint_config(load_dir);
  MPT_CHECK(!cfg.bert && !cfg.t5, str("checkpoint ", load_dir, " holds a ", cfg.kind(), ": the inference tools run decoder models"),
            "");
  cfg.compute_dtype = o.dtype;
  cfg.hidden_dropout = cfg.attention_dropout = 0.0f;
  ModelParallel mp;
  mp.tp = tp();
  mp.pp_size = o.pp;
  mp.pp_rank = grid_->pp_rank();
  model_ = std::make_unique<GPT>(cfg, dev, mp);

  SaveInfo info;
  TrainState st;
  MPT_CHECK(load_weights(load_dir, *model_, {}, &st, &info, world), str("no checkpoint in ", load_dir),
            "pass the directory given to pretrain_gpt --save (it holds latest_checkpointed_iteration.txt)");
  dir_ = info.dir;
  iteration_ = st.iteration;
  // A diverged run's checkpoint holds NaN/Inf: refuse it on every rank (or the
  // rounding to fp16 overflowed), instead of generating from garbage.
  const std::vector<float> w = model_->params().values().to_floats();
  int bad = std::all_of(w.begin(), w.end(), [](float x) { return std::isfinite(x); }) ? 0 : 1;
  MPI_Allreduce(MPI_IN_PLACE, &bad, 1, MPI_INT, MPI_MAX, world);
  MPT_CHECK(!bad, str("checkpoint ", dir_, " holds non-finite values (NaN or Inf) in the ", dtype_name(o.dtype), " weights"),
            "the checkpoint was saved from a diverged run (or --fp16 overflowed its weights): pass --load an earlier "
            "checkpoint, or run without --fp16");
}

ModelRunner::~ModelRunner() {
  ctl_.reset();  // before the communicator it runs over
  if (control_ != MPI_COMM_NULL) MPI_Comm_free(&control_);
}

TensorParallel ModelRunner::tp() const {
  TensorParallel t;
  t.comm = tp_comm_.get();
  t.size = opts_.tp;
  t.rank = grid_->tp_rank();
  return t;
}

std::string ModelRunner::describe() const {
  return str("tp ", opts_.tp, " x pp ", opts_.pp, " (world ", grid_->world_size(), "), ", device().name(), ", ",
             dtype_name(config().compute_dtype));
}

int ModelRunner::last_stage_world_rank() const { return grid_->rank_of(GridCoord{0, 0, opts_.pp - 1}); }

int64_t ModelRunner::kv_bytes_per_block(int64_t block_size) const {
  const ChunkInfo& ch = model_->chunk(0);
  return PagedKVCache::bytes_per_block(ch.end_layer - ch.first_layer, kv_layout(config(), opts_.tp), block_size,
                                       config().compute_dtype);
}

void ModelRunner::init_kv_cache(int64_t num_blocks, int64_t block_size) {
  const ChunkInfo& ch = model_->chunk(0);
  const KvLayout layout = kv_layout(config(), opts_.tp);
  const int64_t mtp = opts_.num_speculative_tokens > 0 && last_stage() ? 1 : 0;  // the MTP layer's cache
  kv_ = std::make_unique<PagedKVCache>(ch.end_layer - ch.first_layer + mtp, layout, block_size, num_blocks,
                                       config().compute_dtype, device());
  if (is_driver()) log_info("KV cache per token per layer on each rank: ", mpitron::describe(layout, config().compute_dtype));
}

// ---------------------------------------------------------------------------
// Pieces of the forward

Tensor ModelRunner::embed(const std::vector<int32_t>& ids, const std::vector<int64_t>& pos) {
  // The model's embedding (model/layers/model_ends.h): vocab-parallel lookup (rows outside this
  // rank's slice give zeros; the TP sum completes it), × √C with --scale-embeddings, positions.
  Tape tape;
  tape.set_recording(false);
  EmbedRows rows;
  rows.ids = ids_tensor(std::vector<int64_t>(ids.begin(), ids.end()), device());
  rows.positions = pos;
  return embed_tokens(tape, config(), tp(), model_->params(), rows, 0.0f, 0).value();
}

Tensor ModelRunner::final_norm(const Tensor& x) {
  Tape tape;
  tape.set_recording(false);
  return mpitron::final_norm(tape, config(), TensorParallel{}, model_->params(), Var(x)).value();
}

Tensor ModelRunner::recv_activation(int64_t rows) {
  Tensor x = Tensor::empty({rows, config().hidden_size}, config().compute_dtype, device());
  pp_comm_->recv(x, grid_->pp_rank() - 1);
  return x;
}

void ModelRunner::send_activation(const Tensor& x) { pp_comm_->send(x.contiguous(), grid_->pp_rank() + 1); }

// ---------------------------------------------------------------------------
// Serving

std::vector<float> ModelRunner::step(const StepPlan& plan) {
  MPT_CHECK(is_driver(), "ModelRunner::step runs on the driver (world rank 0)", "");
  MPT_CHECK(kv_ != nullptr, "ModelRunner::step before init_kv_cache", "");
  MPT_CHECK(!stopped_, "ModelRunner::step after stop_workers", "");
  plan.validate(config().vocab_size, config().max_position_embeddings, kv_->num_blocks(), kv_->block_size());
  const std::vector<int32_t> msg = plan.serialize();
  send_header(1, static_cast<int64_t>(msg.size()));
  if (!msg.empty()) {
    // Owned tensors: a broadcast abandoned by a timeout keeps its buffer alive.
    Tensor t = Tensor::empty({static_cast<int64_t>(msg.size())}, DType::I32);
    std::copy(msg.begin(), msg.end(), t.data<int32_t>());
    ctl_->broadcast(t, 0);
  }
  return run_step(plan);
}

void ModelRunner::send_header(int64_t kind, int64_t size) {
  Tensor hdr = Tensor::empty({2}, DType::I64);
  hdr.data<int64_t>()[0] = kind;
  hdr.data<int64_t>()[1] = size;
  ctl_->broadcast(hdr, 0);
  last_control_s_ = now_s();
}

void ModelRunner::answer_heartbeat() {
  ctl_->all_reduce(Tensor::from_ints({1}, {1}, DType::I32));
}

void ModelRunner::heartbeat() {
  if (!is_driver() || stopped_ || heartbeat_s_ <= 0 || grid_->world_size() == 1) return;
  if (now_s() - last_control_s_ < heartbeat_s_) return;
  send_header(2, 0);
  answer_heartbeat();  // a rank that does not answer within the timeout: an Error naming it
}

void ModelRunner::stop_workers() {
  if (stopped_ || !is_driver()) return;
  stopped_ = true;
  send_header(0, 0);
}

void ModelRunner::serve() {
  if (is_driver()) return;
  MPT_CHECK(kv_ != nullptr, "ModelRunner::serve before init_kv_cache", "");
  for (;;) {
    const Tensor hdr_t = Tensor::zeros({2}, DType::I64);
    const int64_t* hdr = hdr_t.data<int64_t>();
    const WorkPtr w = ctl_->broadcast_async(hdr_t, 0);
    // Idle workers poll with growing sleeps (at most 2 ms), so an idle server leaves the cores alone.
    // Serving, the driver sends a heartbeat every heartbeat_s when idle: after twice that without a
    // word, the wait is the collective's own (MPITRON_COMM_TIMEOUT_S, then an Error naming the driver).
    const double t0 = now_s();
    for (int spins = 0; !w->test(); ++spins) {
      if (heartbeat_s_ > 0 && now_s() - t0 > 2 * heartbeat_s_) {
        w->wait();
        break;
      }
      if (spins > 100) std::this_thread::sleep_for(std::chrono::microseconds(std::min(2000, 20 * (spins - 100))));
    }
    if (hdr[0] == 0) break;
    if (hdr[0] == 2) {
      answer_heartbeat();
      continue;
    }
    std::vector<int32_t> msg(static_cast<size_t>(hdr[1]));
    if (!msg.empty()) {
      const Tensor t = Tensor::empty({hdr[1]}, DType::I32);
      ctl_->broadcast(t, 0);
      std::copy(t.data<int32_t>(), t.data<int32_t>() + hdr[1], msg.begin());
    }
    run_step(StepPlan::deserialize(msg));
  }
  stopped_ = true;
}

std::vector<float> ModelRunner::run_step(const StepPlan& plan) {
  const GPTConfig& c = config();
  const int64_t n = static_cast<int64_t>(plan.tokens.size()), npad = round_up(n, kRowTile);
  PagedRows rows = plan.rows;  // padded to whole tiles with rows that write and read nothing
  rows.pos.resize(static_cast<size_t>(npad), -1);
  rows.seq.resize(static_cast<size_t>(npad), 0);
  const int64_t nl = static_cast<int64_t>(plan.logits_rows.size());
  if (plan.kind == 1) {  // an MTP draft: the last stage alone
    if (!last_stage()) return is_driver() ? deliver({}, nl) : std::vector<float>{};
    const Tensor h = mtp_draft_hidden(plan, rows, npad);
    Tensor sel = Tensor::zeros({round_up(std::max<int64_t>(nl, 1), kHeadRowTile), c.hidden_size}, c.compute_dtype, device());
    for (int64_t i = 0; i < nl; ++i) {
      const int64_t r = plan.logits_rows[static_cast<size_t>(i)];
      sel.slice(0, i, i + 1).copy_from(h.slice(0, r, r + 1));
    }
    return deliver(head_logits(sel, nl), nl);
  }
  Tensor x;
  if (first_stage()) {
    std::vector<int32_t> ids(plan.tokens);
    ids.resize(static_cast<size_t>(npad), 0);
    std::vector<int64_t> pos(static_cast<size_t>(npad));
    for (int64_t i = 0; i < npad; ++i) pos[static_cast<size_t>(i)] = std::max<int64_t>(rows.pos[static_cast<size_t>(i)], 0);
    x = embed(ids, pos);
  } else {
    x = recv_activation(npad);
  }
  const ChunkInfo& ch = model_->chunk(0);
  x = paged_layers(*model_, ch.first_layer, ch.end_layer, x, rows, *kv_, tp(), opts_.force_ops_attention);
  if (!last_stage()) {
    send_activation(x);
    return is_driver() ? deliver({}, nl) : std::vector<float>{};
  }
  if (opts_.num_speculative_tokens > 0) last_hidden_ = final_norm(x);  // every row: the next draft step's h
  if (nl == 0) return {};
  // The head on the rows asked for: their final-normed rows.
  Tensor h = Tensor::zeros({round_up(nl, kHeadRowTile), c.hidden_size}, c.compute_dtype, device());
  for (int64_t i = 0; i < nl; ++i) {
    const int64_t r = plan.logits_rows[static_cast<size_t>(i)];
    h.slice(0, i, i + 1).copy_from(x.slice(0, r, r + 1));
  }
  return deliver(head_logits(final_norm(h), nl), nl);
}

std::vector<float> ModelRunner::head_logits(const Tensor& h, int64_t nl) {
  const GPTConfig& c = config();
  if (nl == 0) return {};
  // One tile at a time: this rank's vocabulary slice (nl, Vl).
  const int64_t nlpad = h.dim(0), Vl = c.padded_vocab_size / opts_.tp, V = c.vocab_size;
  Tensor logits = Tensor::empty({nlpad, Vl}, c.compute_dtype, device());
  for (int64_t t0 = 0; t0 < nlpad; t0 += kHeadRowTile)
    gemm(h.slice(0, t0, t0 + kHeadRowTile), model_->output_weight().value(), logits.slice(0, t0, t0 + kHeadRowTile),
         kLinear);
  cap_logits(c, logits);
  const std::vector<float> mine = logits.slice(0, 0, nl).to_floats();
  std::vector<float> all(grid_->tp_rank() == 0 ? mine.size() * static_cast<size_t>(opts_.tp) : 0);
  if (opts_.tp > 1) {
    const JobDeadline bound = step_deadline("gathering the logits over the tp group", grid_->tp_group_ranks(), grid_->world_rank());
    MPI_Gather(mine.data(), static_cast<int>(mine.size()), MPI_FLOAT, all.data(), static_cast<int>(mine.size()),
               MPI_FLOAT, 0, grid_->tp_comm());
  } else {
    all = mine;
  }
  if (grid_->tp_rank() != 0) return {};
  std::vector<float> out(static_cast<size_t>(nl * V));
  for (int r = 0; r < opts_.tp; ++r)
    for (int64_t i = 0; i < nl; ++i)
      for (int64_t j = 0; j < Vl && r * Vl + j < V; ++j)
        out[static_cast<size_t>(i * V + r * Vl + j)] = all[static_cast<size_t>((r * nl + i) * Vl + j)];
  return out;
}

std::vector<float> ModelRunner::deliver(std::vector<float> out, int64_t nl) {
  if (nl == 0) return {};
  if (last_stage()) {  // TP rank 0 of the last stage holds the logits
    if (grid_->tp_rank() != 0 || is_driver()) return out;
    const JobDeadline bound = step_deadline("sending the logits to the driver", {0}, grid_->world_rank());
    MPI_Send(out.data(), static_cast<int>(out.size()), MPI_FLOAT, 0, kLogitsTag, control_);
    return {};
  }
  if (!is_driver()) return {};
  std::vector<float> got(static_cast<size_t>(nl * config().vocab_size));
  const JobDeadline bound = step_deadline("receiving the logits from the last stage", {last_stage_world_rank()}, grid_->world_rank());
  MPI_Recv(got.data(), static_cast<int>(got.size()), MPI_FLOAT, last_stage_world_rank(), kLogitsTag, control_,
           MPI_STATUS_IGNORE);
  return got;
}

Tensor ModelRunner::mtp_draft_hidden(const StepPlan& plan, const PagedRows& rows, int64_t npad) {
  const GPTConfig& c = config();
  MPT_CHECK(opts_.num_speculative_tokens > 0 && last_hidden_.defined(),
            "an MTP draft step without --num-speculative-tokens or before the model's step", "");
  const int64_t n = static_cast<int64_t>(plan.tokens.size());
  std::vector<int32_t> ids(plan.tokens);
  ids.resize(static_cast<size_t>(npad), 0);
  std::vector<int64_t> pos(static_cast<size_t>(npad), 0);
  Tensor h = Tensor::zeros({npad, c.hidden_size}, c.compute_dtype, device());
  for (int64_t i = 0; i < n; ++i) {
    pos[static_cast<size_t>(i)] = rows.pos[static_cast<size_t>(i)];
    const int64_t r = plan.hidden_rows[static_cast<size_t>(i)];
    MPT_CHECK(r >= 0 && r < last_hidden_.dim(0), str("MTP draft: hidden row ", r, " of a step of ", last_hidden_.dim(0)), "");
    h.slice(0, i, i + 1).copy_from(last_hidden_.slice(0, r, r + 1));
  }
  const ChunkInfo& ch = model_->chunk(0);
  const int64_t L = c.num_layers;
  return mtp_decode_hidden(*model_, embed(ids, pos), h, [&](const Tensor& x) {
    // The MTP block over its cache: the last stage's cache layer after its own (init_kv_cache).
    return paged_layers(*model_, L, L + 1, x, rows, *kv_, tp(), opts_.force_ops_attention, ch.end_layer - ch.first_layer);
  }, kRowTile);
}

// ---------------------------------------------------------------------------
// Scoring

ScoreOutput ModelRunner::score(const std::vector<int32_t>& tokens, const std::vector<int32_t>& targets, int64_t B,
                               int64_t T) {
  const GPTConfig& c = config();
  const int64_t N = B * T, V = c.vocab_size;
  MPT_CHECK(B >= 1 && T >= 1 && static_cast<int64_t>(tokens.size()) == N && static_cast<int64_t>(targets.size()) == N,
            str("score: ", tokens.size(), " tokens and ", targets.size(), " targets for ", B, " windows of ", T), "");
  MPT_CHECK(T <= c.max_position_embeddings,
            str("score: windows of ", T, " tokens exceed max_position_embeddings ", c.max_position_embeddings), "");
  Tensor x;
  if (first_stage()) {
    std::vector<int64_t> pos(static_cast<size_t>(N));
    for (int64_t i = 0; i < N; ++i) pos[static_cast<size_t>(i)] = i % T;
    x = embed(tokens, pos);
  } else {
    x = recv_activation(N);
  }
  Tape tape;
  tape.set_recording(false);
  ForwardOptions fo;
  fo.train = false;
  x = model_->layers(tape, model_->chunk(0), Var(x), B, T, fo).value();
  ScoreOutput out;
  if (!last_stage()) {
    send_activation(x);
    if (is_driver()) {
      out.loss.resize(static_cast<size_t>(N));
      out.argmax.resize(static_cast<size_t>(N));
      MPI_Recv(out.loss.data(), static_cast<int>(N), MPI_DOUBLE, last_stage_world_rank(), kScoreTag, control_,
               MPI_STATUS_IGNORE);
      MPI_Recv(out.argmax.data(), static_cast<int>(N), MPI_INT32_T, last_stage_world_rank(), kScoreTag, control_,
               MPI_STATUS_IGNORE);
    }
    return out;
  }
  const int64_t Vl = c.padded_vocab_size / opts_.tp, v0 = grid_->tp_rank() * Vl, vend = std::min(v0 + Vl, V);
  Tensor logits = Tensor::empty({N, Vl}, c.compute_dtype, device());
  gemm(final_norm(x), model_->output_weight().value(), logits, kLinear);
  cap_logits(c, logits);
  const std::vector<float> lg = logits.to_floats();
  std::vector<RowStats> st(static_cast<size_t>(N));
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < N; ++i) {
    RowStats& s = st[static_cast<size_t>(i)];
    const float* row = lg.data() + i * Vl;
    for (int64_t j = 0; j < vend - v0; ++j)
      if (row[j] > s.best) s.best = row[j], s.best_id = static_cast<double>(v0 + j);
    s.max = s.best;
    for (int64_t j = 0; j < vend - v0; ++j) s.sum += std::exp(static_cast<double>(row[j]) - s.max);
    const int64_t t = targets[static_cast<size_t>(i)];
    if (t >= v0 && t < vend) s.target = row[t - v0];
  }
  static_assert(sizeof(RowStats) == 5 * sizeof(double), "RowStats travels as 5 doubles");
  std::vector<RowStats> all(grid_->tp_rank() == 0 ? st.size() * static_cast<size_t>(opts_.tp) : 0);
  if (opts_.tp > 1)
    MPI_Gather(st.data(), static_cast<int>(5 * N), MPI_DOUBLE, all.data(), static_cast<int>(5 * N), MPI_DOUBLE, 0,
               grid_->tp_comm());
  else
    all = st;
  if (grid_->tp_rank() != 0) return out;
  out.loss.resize(static_cast<size_t>(N));
  out.argmax.resize(static_cast<size_t>(N));
  for (int64_t i = 0; i < N; ++i) {
    double mx = -INFINITY, best = -INFINITY, best_id = 0, target = NAN;
    for (int r = 0; r < opts_.tp; ++r) {
      const RowStats& s = all[static_cast<size_t>(r * N + i)];
      mx = std::max(mx, s.max);
      if (s.best > best) best = s.best, best_id = s.best_id;  // ties: the lower rank, i.e. the lower id
      if (!std::isnan(s.target)) target = s.target;
    }
    double sum = 0;
    for (int r = 0; r < opts_.tp; ++r) {
      const RowStats& s = all[static_cast<size_t>(r * N + i)];
      if (s.sum > 0) sum += s.sum * std::exp(s.max - mx);
    }
    MPT_CHECK(!std::isnan(target), str("score: target ", targets[static_cast<size_t>(i)], " outside the vocabulary"), "");
    out.loss[static_cast<size_t>(i)] = std::log(sum) + mx - target;
    out.argmax[static_cast<size_t>(i)] = static_cast<int32_t>(best_id);
  }
  if (is_driver()) return out;
  MPI_Send(out.loss.data(), static_cast<int>(N), MPI_DOUBLE, 0, kScoreTag, control_);
  MPI_Send(out.argmax.data(), static_cast<int>(N), MPI_INT32_T, 0, kScoreTag, control_);
  return {};
}

}  // namespace mpitron
