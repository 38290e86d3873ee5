// model/inference/served_model.h — what the text generation server serves, as ONE interface: the
// server (apps/text_generation_server.cpp) takes requests, steps the engine, answers heartbeats and
// logs, and never asks which kind of model it holds.
//   decoder LMs (GPT-2, Llama, …): the ModelRunner over the rank layout (TP × PP) and the dynamic
//     engine over its paged KV cache (model/inference/dynamic_engine.h), batching requests with
//     --inference-dynamic-batching, one request at a time without;
//   T5: T5Engine (model/inference/t5_engine.h) on one process, or on rank 0 of a tensor-parallel world
//     whose other ranks repeat its model calls; one request at a time; the prompt is the encoder's
//     input, the answer the decoder's tokens.
// open_served_model reads the checkpoint's kind and builds the one it holds; what a kind cannot do
// (T5: --inference-dynamic-batching, pipeline parallelism) is refused there by flag name.
#pragma once
#include <mpi.h>

#include <cstdint>
#include <memory>
#include <string>

#include "data/text_tokenizer.h"
#include "model/flags/inference_flags.h"
#include "model/inference/dynamic_engine.h"

namespace mpitron {

class ServedModel {
 public:
  virtual ~ServedModel() = default;
  virtual const GPTConfig& config() const = 0;
  virtual bool is_driver() const = 0;  // this rank serves HTTP and steps the engine
  // Workers: compute the driver's steps until stop_workers(). Returns at once on the driver.
  virtual void serve() = 0;
  // Any thread (a text API's Submit). Throws Error naming what is wrong with the request (a 400).
  virtual std::shared_ptr<RequestState> submit(GenRequest r) = 0;
  virtual bool step() = 0;                              // driver: one engine step; false when idle
  virtual void wait_for_work(double timeout_s) = 0;     // driver: sleeps until a request arrives
  virtual bool has_work() const = 0;
  virtual void heartbeat() = 0;                         // driver, idle: every rank still answers
  virtual void stop_workers() = 0;                      // driver: the workers' serve() returns
  virtual int64_t steps() const = 0;                    // engine steps so far (the log's counter)
  virtual EngineStats stats() const = 0;                // the engine's counters (the server's /metrics)
  virtual std::string stats_line() const = 0;           // the engine's counters, one log line
  virtual std::string checkpoint_dir() const = 0;       // the iter_N directory loaded
  // "on tp 1 x pp 1 (world 1), cpu; one request at a time (…); KV cache …": the start-up log's tail.
  virtual std::string describe() const = 0;
};

// What a server needs beyond the checkpoint: the flags, the tokenizer (a T5's start and end tokens
// come from it, model/inference/t5_engine.h t5_tokens), --vocab-extra-ids.
struct ServingSetup {
  InferenceFlags flags;
  const data::TextTokenizer* tok = nullptr;
  int64_t vocab_extra_ids = 0;
  int64_t max_requests = 0;  // --inference-dynamic-batching-max-requests or the server's default
};

// Collective over comm (every rank calls it).
std::unique_ptr<ServedModel> open_served_model(MPI_Comm comm, const std::string& load_dir, const ServingSetup& setup);

// The kinds' builders (open_served_model picks one).
std::unique_ptr<ServedModel> open_decoder_served(MPI_Comm comm, const std::string& load_dir, const ServingSetup& setup);
std::unique_ptr<ServedModel> open_t5_served(MPI_Comm comm, const std::string& load_dir, const ServingSetup& setup);

}  // namespace mpitron
