// The T5 kind of ServedModel (model/inference/served_model.h): T5Engine on one process, or under
// mpirun with --tensor-model-parallel-size = the world: rank 0 serves and runs the engine, and
// broadcasts each of its model calls (T5Engine::Announce: a request's start, each decoder input, and
// 0 to stop) over a control communicator; the other ranks repeat them, so every collective of the
// cached decoder (model/t5_decode.h) has all its ranks. No heartbeat: an idle worker waits for the
// driver's next call (the decoder runner's frozen-rank detection is not built for T5).
#include "core/device.h"
#include "core/error.h"
#include "model/inference/served_model.h"
#include "model/inference/t5_engine.h"
#include "parallel/communicator.h"

namespace mpitron {

namespace {

class T5Served final : public ServedModel {
 public:
  T5Served(MPI_Comm comm, const std::string& load_dir, const ServingSetup& setup) {
    const InferenceFlags& f = setup.flags;
    MPT_CHECK(f.device != "cuda" || cuda_available(), str("--device cuda: ", cuda_unavailable_reason()),
              "run on a machine with a GPU, or use --device cpu");
    device_ = f.device == "cuda" || (f.device == "auto" && cuda_available()) ? Device::cuda(0) : Device::cpu();
    MPI_Comm_size(comm, &world_);
    MPI_Comm_rank(comm, &rank_);
    TensorParallel tp;
    if (world_ > 1) {
      CommOptions co;
      co.name = "tp";
      co.force_mpi_for_device = f.force_mpi_for_device;
      tp_comm_ = make_communicator(comm, device_, co);
      tp = TensorParallel{tp_comm_.get(), world_, rank_, false};
      MPI_Comm_dup(comm, &control_);
    }
    model_ = load_t5_for_inference(load_dir, device_, f.dtype(), &dir_, tp, comm);
    tokens_ = t5_tokens(setup.tok, setup.vocab_extra_ids, -1, -1, model_->config().vocab_size);
    T5Engine::Announce announce;
    if (world_ > 1) announce = [this](const std::vector<int64_t>& call) { send(call); };
    if (rank_ == 0) engine_ = std::make_unique<T5Engine>(*model_, tokens_, std::move(announce));
  }
  ~T5Served() override {
    if (control_ != MPI_COMM_NULL) MPI_Comm_free(&control_);
  }
  const GPTConfig& config() const override { return model_->config(); }
  bool is_driver() const override { return rank_ == 0; }
  void serve() override {  // workers: repeat the driver's model calls until it sends 0
    if (rank_ == 0) return;
    std::unique_ptr<T5DecodeState> state;
    for (;;) {
      const std::vector<int64_t> call = receive();
      if (call.at(0) == 0) return;
      if (call.at(0) == 1) {
        const int64_t T = static_cast<int64_t>(call.size()) - 2;
        const Tensor enc = Tensor::from_ints(std::vector<int64_t>(call.begin() + 2, call.end()), {1, T}, DType::I32);
        state = std::make_unique<T5DecodeState>(*model_, enc, T, call.at(1));
      } else {
        MPT_CHECK(call.at(0) == 2 && state, str("T5 serving worker ", rank_, ": unexpected call ", call.at(0)), "");
        state->step({call.at(1)});
      }
    }
  }
  std::shared_ptr<RequestState> submit(GenRequest r) override { return engine_->submit(std::move(r)); }
  bool step() override { return engine_->step(); }
  void wait_for_work(double timeout_s) override { engine_->wait_for_work(timeout_s); }
  bool has_work() const override { return engine_->has_work(); }
  void heartbeat() override {}  // see the top of the file
  void stop_workers() override {
    if (world_ > 1 && rank_ == 0 && !stopped_) send({0});
    stopped_ = true;
  }
  int64_t steps() const override { return engine_->stats().steps; }
  EngineStats stats() const override { return engine_->stats(); }
  std::string stats_line() const override {
    const EngineStats s = engine_->stats();
    return str("T5 engine: ", s.steps, " decoder steps, ", s.prefill_tokens, " encoder tokens, ", s.generated,
               " tokens generated, ", s.requests_done, " requests done (", s.cancelled, " cancelled)");
  }
  std::string checkpoint_dir() const override { return dir_; }
  std::string describe() const override {
    const GPTConfig& c = model_->config();
    return str("T5 (", c.encoder_num_layers, " encoder + ", c.decoder_num_layers(), " decoder layers) ",
               world_ > 1 ? str("on tp ", world_, " ranks") : std::string("on one process"), ", ",
               device_.is_cuda() ? "cuda" : "cpu", "; one request at a time, the prompt the encoder's input, the answer "
               "the decoder's tokens from ", tokens_.start, " to ", tokens_.eos, "; cached decoder (encoder output, "
               "cross-attention keys and values, self-attention keys and values per request)");
  }

 private:
  void send(const std::vector<int64_t>& call) {
    int64_t n = static_cast<int64_t>(call.size());
    MPI_Bcast(&n, 1, MPI_INT64_T, 0, control_);
    MPI_Bcast(const_cast<int64_t*>(call.data()), static_cast<int>(n), MPI_INT64_T, 0, control_);
  }
  std::vector<int64_t> receive() {
    int64_t n = 0;
    MPI_Bcast(&n, 1, MPI_INT64_T, 0, control_);
    std::vector<int64_t> call(static_cast<size_t>(n));
    MPI_Bcast(call.data(), static_cast<int>(n), MPI_INT64_T, 0, control_);
    return call;
  }

  Device device_ = Device::cpu();
  int world_ = 1, rank_ = 0;
  std::unique_ptr<Communicator> tp_comm_;
  MPI_Comm control_ = MPI_COMM_NULL;  // the driver's calls to the workers
  bool stopped_ = false;
  std::string dir_;
  std::unique_ptr<T5> model_;
  T5Tokens tokens_;
  std::unique_ptr<T5Engine> engine_;  // the driver's
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
  MPT_CHECK(world == f.tp && f.pp == 1,
            str("text_generation_server with the T5 checkpoint ", load_dir, " runs on one process, or on "
                "--tensor-model-parallel-size ranks; it was started on ", world, " ranks (--tensor-model-parallel-size ",
                f.tp, ", --pipeline-model-parallel-size ", f.pp, ")"),
            "run it without mpirun, or under mpirun -np N with --tensor-model-parallel-size N (no pipeline parallelism)");
  return std::make_unique<T5Served>(comm, load_dir, setup);
}

}  // namespace mpitron
