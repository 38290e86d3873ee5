#include "model/inference/t5_engine.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <numeric>

#include "core/error.h"
#include "model/inference/generate.h"
#include "model/checkpoint/checkpointing.h"
#include "model/inference/inference_load.h"

namespace mpitron {

T5Tokens t5_tokens(const data::TextTokenizer* tok, int64_t vocab_extra_ids, int64_t start, int64_t eos, int64_t vocab) {
  const bool megatron_ids = tok && vocab_extra_ids > 0;  // Megatron's T5: [BOS] starts, [EOS] ends
  T5Tokens t;
  t.start = start >= 0 ? start : megatron_ids ? tok->bos() : 0;
  t.eos = eos >= 0 ? eos : megatron_ids ? tok->eod() : 1;
  MPT_CHECK(t.start >= 0 && t.start < vocab,
            str("--decoder-start-token-id ", t.start, " is outside the vocabulary [0, ", vocab, ")"), "");
  MPT_CHECK(t.eos >= 0 && t.eos < vocab, str("--eos-token-id ", t.eos, " is outside the vocabulary [0, ", vocab, ")"), "");
  return t;
}

std::unique_ptr<T5> load_t5_for_inference(const std::string& load_dir, Device device, DType dtype,
                                          std::string* loaded_dir, const TensorParallel& tp, MPI_Comm world) {
  if (tp.active()) {  // this rank's slices, read collectively (as the model runner loads a decoder)
    MPT_CHECK(!tp.sequence_parallel, "a T5 for inference is split without sequence parallelism", "");
    GPTConfig cfg = read_checkpoint_config(load_dir);
    MPT_CHECK(cfg.t5, str("checkpoint ", load_dir, " holds a ", cfg.kind(), ", not a T5"), "");
    cfg.compute_dtype = dtype;
    cfg.hidden_dropout = cfg.attention_dropout = 0.0f;
    ModelParallel mp;
    mp.tp = tp;
    auto model = std::make_unique<T5>(cfg, device, mp);
    SaveInfo info;
    MPT_CHECK(load_weights(load_dir, model->core(), {}, nullptr, &info, world),
              str("no checkpoint in ", load_dir), "pass the directory given to pretrain_t5 --save");
    if (loaded_dir) *loaded_dir = info.dir;
    return model;
  }
  InferenceModel m = load_model_for_inference(load_dir, device, dtype);
  MPT_CHECK(m.model->config().t5, str("checkpoint ", load_dir, " holds a ", m.model->config().kind(), ", not a T5"), "");
  auto model = std::make_unique<T5>(m.model->config(), device);
  model->params().values().copy_from(m.model->params().values());
  if (loaded_dir) *loaded_dir = m.dir;
  return model;
}

T5Engine::T5Engine(T5& model, T5Tokens tokens, Announce announce)
    : model_(model), tokens_(tokens), announce_(std::move(announce)) {}

std::shared_ptr<RequestState> T5Engine::submit(GenRequest r) {
  const GPTConfig& c = model_.config();
  const int64_t V = c.vocab_size, T = static_cast<int64_t>(r.prompt.size());
  MPT_CHECK(T >= 1, "the prompt is empty: a T5's encoder needs an input", "give the request some text");
  for (int32_t t : r.prompt)
    MPT_CHECK(t >= 0 && t < V, str("the prompt holds token id ", t, " outside the vocabulary [0, ", V, ")"), "");
  MPT_CHECK(r.max_new_tokens >= 0, str("max_new_tokens must be >= 0, got ", r.max_new_tokens), "");
  MPT_CHECK(r.top_logprobs >= 0 && r.top_logprobs <= V, str("top_logprobs must be in [0, ", V, "], got ", r.top_logprobs),
            "");
  if (c.learned_positions()) {  // a learned table bounds both stacks; relative positions bound neither
    const int64_t P = c.max_position_embeddings;
    MPT_CHECK(T <= P, str("the prompt has ", T, " tokens; the T5's max_position_embeddings is ", P), "shorten the prompt");
    MPT_CHECK(r.max_new_tokens <= P, str("max_new_tokens ", r.max_new_tokens, " exceeds the T5 decoder's ", P, " positions"),
              "");
  }
  r.sampling.validate();
  auto a = std::make_unique<Active>();
  a->state = std::make_shared<RequestState>();
  a->out.context = r.prompt;
  a->req = std::move(r);
  auto state = a->state;
  if (a->req.max_new_tokens == 0) {
    a->out.finish_reason = "length";
    state->finish(a->out);
    return state;
  }
  {
    std::lock_guard<std::mutex> lk(mu_);
    queue_.push_back(std::move(a));
  }
  cv_.notify_all();
  return state;
}


bool T5Engine::step() {
  if (!cur_) {
    {
      std::lock_guard<std::mutex> lk(mu_);
      if (queue_.empty()) return false;
      cur_ = std::move(queue_.front());
      queue_.pop_front();
    }
    if (cur_->state->cancelled()) {
      finish("cancelled");
      return true;
    }
    const std::vector<int32_t>& p = cur_->req.prompt;
    const int64_t T = static_cast<int64_t>(p.size());
    const Tensor enc = Tensor::from_ints(std::vector<int64_t>(p.begin(), p.end()), {1, T}, DType::I32);
    if (announce_) {
      std::vector<int64_t> call{1, cur_->req.max_new_tokens};
      call.insert(call.end(), p.begin(), p.end());
      announce_(call);
    }
    cur_->dec = std::make_unique<T5DecodeState>(model_, enc, T, cur_->req.max_new_tokens);
    stats_.prefill_tokens += T;
    stats_.max_running = 1;
  }
  Active& a = *cur_;
  if (a.state->cancelled()) {
    finish("cancelled");
    return true;
  }
  const int64_t V = model_.config().vocab_size;
  const int64_t last = a.out.generated.empty() ? tokens_.start : a.out.generated.back();
  if (announce_) announce_({2, last});
  std::vector<float> row = a.dec->step({last});
  row.resize(static_cast<size_t>(V));  // the padded vocabulary's rows are never sampled
  ++stats_.steps, ++stats_.rows, ++stats_.decode_tokens;
  TokenEvent e;
  e.token = sample_token(row.data(), V, a.req.sampling, a.req.stream, a.out.generated.size(), &e.logprob);
  if (a.req.top_logprobs > 0) e.top = top_logprobs(row.data(), V, a.req.top_logprobs);
  a.out.generated.push_back(e.token);
  a.out.logprobs.push_back(e.logprob);
  if (a.req.top_logprobs > 0) a.out.top.push_back(e.top);
  ++stats_.generated;
  a.state->push(e);
  if (a.req.stop_at_eod && e.token == tokens_.eos) finish("stop");
  else if (static_cast<int64_t>(a.out.generated.size()) >= a.req.max_new_tokens) finish("length");
  return true;
}

void T5Engine::finish(const std::string& reason) {
  cur_->out.finish_reason = reason;
  cur_->state->finish(cur_->out);
  ++stats_.requests_done;
  if (reason == "cancelled") ++stats_.cancelled;
  cur_.reset();
  std::lock_guard<std::mutex> lk(mu_);
  done_stats_ = stats_;
}

void T5Engine::wait_for_work(double timeout_s) {
  if (cur_) return;
  std::unique_lock<std::mutex> lk(mu_);
  cv_.wait_for(lk, std::chrono::duration<double>(timeout_s), [&] { return !queue_.empty(); });
}

bool T5Engine::has_work() const {
  if (cur_) return true;
  std::lock_guard<std::mutex> lk(mu_);
  return !queue_.empty();
}

EngineStats T5Engine::stats() const {
  std::lock_guard<std::mutex> lk(mu_);
  return done_stats_;
}

}  // namespace mpitron
