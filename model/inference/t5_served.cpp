// The T5 kind of ServedModel (model/inference/served_model.h): one process, T5Engine.
#include "core/device.h"
#include "core/error.h"
#include "model/inference/served_model.h"
#include "model/inference/t5_engine.h"

namespace mpitron {

namespace {

class T5Served final : public ServedModel {
 public:
  T5Served(const std::string& load_dir, const ServingSetup& setup) {
    const InferenceFlags& f = setup.flags;
    MPT_CHECK(f.device != "cuda" || cuda_available(), str("--device cuda: ", cuda_unavailable_reason()),
              "run on a machine with a GPU, or use --device cpu");
    device_ = f.device == "cuda" || (f.device == "auto" && cuda_available()) ? Device::cuda(0) : Device::cpu();
    model_ = load_t5_for_inference(load_dir, device_, f.dtype(), &dir_);
    tokens_ = t5_tokens(setup.tok, setup.vocab_extra_ids, -1, -1, model_->config().vocab_size);
    engine_ = std::make_unique<T5Engine>(*model_, tokens_);
  }
  const GPTConfig& config() const override { return model_->config(); }
  bool is_driver() const override { return true; }
  void serve() override {}
  std::shared_ptr<RequestState> submit(GenRequest r) override { return engine_->submit(std::move(r)); }
  bool step() override { return engine_->step(); }
  void wait_for_work(double timeout_s) override { engine_->wait_for_work(timeout_s); }
  bool has_work() const override { return engine_->has_work(); }
  void heartbeat() override {}  // one process: no other rank to hear from
  void stop_workers() override {}
  int64_t steps() const override { return engine_->stats().steps; }
  std::string stats_line() const override {
    const EngineStats s = engine_->stats();
    return str("T5 engine: ", s.steps, " decoder steps, ", s.prefill_tokens, " encoder tokens, ", s.generated,
               " tokens generated, ", s.requests_done, " requests done (", s.cancelled, " cancelled)");
  }
  std::string checkpoint_dir() const override { return dir_; }
  std::string describe() const override {
    const GPTConfig& c = model_->config();
    return str("T5 (", c.encoder_num_layers, " encoder + ", c.decoder_num_layers(), " decoder layers) on one process, ",
               device_.is_cuda() ? "cuda" : "cpu", "; one request at a time, the prompt the encoder's input, the answer "
               "the decoder's tokens from ", tokens_.start, " to ", tokens_.eos, "; cached decoder (encoder output, "
               "cross-attention keys and values, self-attention keys and values per request)");
  }

 private:
  Device device_ = Device::cpu();
  std::string dir_;
  std::unique_ptr<T5> model_;
  T5Tokens tokens_;
  std::unique_ptr<T5Engine> engine_;
};

}  // namespace

std::unique_ptr<ServedModel> open_t5_served(MPI_Comm comm, const std::string& load_dir, const ServingSetup& setup) {
  const InferenceFlags& f = setup.flags;
  MPT_CHECK(!f.batching.enabled,
            str("--inference-dynamic-batching with the T5 checkpoint ", load_dir,
                ": the dynamic engine batches decoder language models over the paged KV cache; a T5 is served one "
                "request at a time"),
            "drop --inference-dynamic-batching (and its --inference-dynamic-batching-* settings)");
  int world = 1;
  MPI_Comm_size(comm, &world);
  MPT_CHECK(world == 1 && f.tp == 1 && f.pp == 1,
            str("text_generation_server with the T5 checkpoint ", load_dir, " runs on one process; it was started on ",
                world, " ranks (--tensor-model-parallel-size ", f.tp, ", --pipeline-model-parallel-size ", f.pp, ")"),
            "run it without mpirun and without the parallel sizes");
  return std::make_unique<T5Served>(load_dir, setup);
}

}  // namespace mpitron
