// model/inference/t5_engine.h — serving a T5 (model/t5.h): each request's prompt is the encoder's
// input, its answer the decoder's tokens, decoded on the cached decoder (model/t5_decode.h).
//
// T5Engine takes requests as the dynamic engine does (GenRequest in, RequestState out: the text
// APIs of model/inference/text_api.h drive either) and runs ONE request at a time: the encoder once
// when it starts, then one decoder token per step() (streamed as it comes, cancellable between
// steps), sampled with the request's SamplingParams (sample_token: greedy, temperature, top-k,
// top-p; philox(seed, stream, step) as the decoder engine draws). The decoder starts from the
// model's start token; a request ends at the model's end token (`eos` here, not GenRequest::eod:
// a text API sets that from the tokenizer) when stop_at_eod, or after max_new_tokens ("length").
// GenResult::context is the prompt (the encoder's input), `generated` the decoder's tokens
// without the start token. The process holds the whole model (one rank, as T5::greedy).
#pragma once
#include <mpi.h>

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>

#include "data/text_tokenizer.h"
#include "model/inference/dynamic_engine.h"
#include "model/t5.h"
#include "model/t5_decode.h"

namespace mpitron {

// The decoder's first token and the token that ends an answer.
struct T5Tokens {
  int64_t start = 0, eos = 1;
};
// Hugging Face's T5 starts from 0 (pad) and ends at 1 (</s>); Megatron's T5 (a tokenizer with
// --vocab-extra-ids sentinels) from [BOS] to [EOS]. start / eos >= 0: given by flags (checked against
// the vocabulary); tok may be null (token ids without a tokenizer).
T5Tokens t5_tokens(const data::TextTokenizer* tok, int64_t vocab_extra_ids, int64_t start, int64_t eos, int64_t vocab);

// A T5 checkpoint (pretrain_t5 --save, convert_checkpoint hf-to-mpitron) loaded on `device` in `dtype`
// (the compute dtype): whole, or with tp.size > 1 this rank's tensor-parallel slices (no sequence
// parallelism; collective over world, whose ranks are the tp group); loaded_dir: the iter_N directory
// read (may be null).
std::unique_ptr<T5> load_t5_for_inference(const std::string& load_dir, Device device, DType dtype,
                                          std::string* loaded_dir = nullptr, const TensorParallel& tp = {},
                                          MPI_Comm world = MPI_COMM_NULL);

class T5Engine {
 public:
  // The engine's model calls as messages, for ranks that repeat them (tensor parallelism: every rank
  // of the group makes each collective call; model/inference/t5_served.cpp broadcasts them):
  //   {1, max_len, prompt ids…}  a request starts: T5DecodeState(model, prompt, |prompt|, max_len)
  //   {2, token}                 the current request's next decoder input: state.step({token})
  using Announce = std::function<void(const std::vector<int64_t>& call)>;
  // announce (may be empty): called before each model call.
  T5Engine(T5& model, T5Tokens tokens, Announce announce = {});
  // Any thread. Throws Error naming the problem (an empty prompt, an id outside the vocabulary, a
  // length over a learned-position table); never blocks on the model.
  std::shared_ptr<RequestState> submit(GenRequest r);
  // Engine thread: starts the next request (its encoder) or decodes one token of the current one.
  // False when there was nothing to do.
  bool step();
  void wait_for_work(double timeout_s);
  bool has_work() const;
  EngineStats stats() const;

 private:
  struct Active {
    GenRequest req;
    std::shared_ptr<RequestState> state;
    std::unique_ptr<T5DecodeState> dec;
    GenResult out;
  };
  void finish(const std::string& reason);

  T5& model_;
  T5Tokens tokens_;
  Announce announce_;
  std::unique_ptr<Active> cur_;  // the request being decoded (engine thread only)
  EngineStats stats_;            // engine thread
  mutable std::mutex mu_;        // guards queue_ and done_stats_
  std::condition_variable cv_;
  std::deque<std::unique_ptr<Active>> queue_;
  EngineStats done_stats_;  // a copy for stats() from other threads
};

}  // namespace mpitron
