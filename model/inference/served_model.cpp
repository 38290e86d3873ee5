#include "model/inference/served_model.h"

#include "core/error.h"
#include "model/checkpoint/checkpoint_config.h"
#include "model/inference/model_runner.h"
#include "model/inference/runner_flags.h"

namespace mpitron {

namespace {

// A decoder LM: the runner over the rank layout, the dynamic engine on the driver.
class DecoderServed final : public ServedModel {
 public:
  DecoderServed(MPI_Comm comm, const std::string& load_dir, const ServingSetup& setup) : flags_(setup.flags) {
    RunnerOptions ro = runner_options(flags_);
    ro.serving = true;  // a frozen or dead rank ends the job (heartbeats while idle), as in training
    runner_ = std::make_unique<ModelRunner>(comm, load_dir, ro);
    const DynamicBatchingFlags& b = flags_.batching;
    max_requests_ = setup.max_requests;
    runner_->init_kv_cache(kv_cache_blocks(b, *runner_, max_requests_), b.block_size);
    if (runner_->is_driver())
      engine_ = std::make_unique<DynamicEngine>(*runner_, engine_config(b, max_requests_));
  }
  const GPTConfig& config() const override { return runner_->config(); }
  bool is_driver() const override { return runner_->is_driver(); }
  void serve() override { runner_->serve(); }
  std::shared_ptr<RequestState> submit(GenRequest r) override { return engine_->submit(std::move(r)); }
  bool step() override { return engine_->step(); }
  void wait_for_work(double timeout_s) override { engine_->wait_for_work(timeout_s); }
  bool has_work() const override { return engine_->has_work(); }
  void heartbeat() override { runner_->heartbeat(); }
  void stop_workers() override { runner_->stop_workers(); }
  int64_t steps() const override { return engine_->stats().steps; }
  EngineStats stats() const override { return engine_->stats(); }
  std::string stats_line() const override { return engine_->stats().line(); }
  std::string checkpoint_dir() const override { return runner_->checkpoint_dir(); }
  std::string describe() const override {
    const DynamicBatchingFlags& b = flags_.batching;
    return str(runner_->describe(), "; ",
               b.enabled ? str("dynamic batching: up to ", max_requests_, " requests, ", b.max_tokens, " tokens per step",
                               b.chunked_prefill ? ", chunked prefill" : "")
                         : std::string("one request at a time (--inference-dynamic-batching batches them)"),
               "; KV cache ", runner_->kv_cache().num_blocks(), " blocks of ", b.block_size, " positions (",
               runner_->kv_cache().bytes() >> 20, " MiB per rank)");
  }

 private:
  InferenceFlags flags_;
  int64_t max_requests_ = 0;
  std::unique_ptr<ModelRunner> runner_;
  std::unique_ptr<DynamicEngine> engine_;  // the driver's
};

}  // namespace

std::unique_ptr<ServedModel> open_decoder_served(MPI_Comm comm, const std::string& load_dir, const ServingSetup& setup) {
  return std::make_unique<DecoderServed>(comm, load_dir, setup);
}

std::unique_ptr<ServedModel> open_served_model(MPI_Comm comm, const std::string& load_dir, const ServingSetup& setup) {
  const bool t5 = checkpoint_exists(load_dir) && read_checkpoint_config(load_dir).t5;
  return t5 ? open_t5_served(comm, load_dir, setup) : open_decoder_served(comm, load_dir, setup);
}

}  // namespace mpitron
