// model/inference/model_runner.h — one rank's part of a model for inference, under any
// tensor × pipeline parallel layout, and the forward passes the tools run on it.
//
// Layout: world = tp · pp ranks (Megatron's grid, parallel/grid.h: tp fastest;
// no data parallelism here). Each rank builds the GPT's part it holds (its TP
// slices of its pipeline stage's layers) and reads exactly that from the
// checkpoint (load_checkpoint's hyperslabs), so a checkpoint saved under any
// layout loads into any inference layout. World rank 0 (tp 0 of stage 0) is the
// DRIVER: it owns the requests and the scheduler and receives every result;
// the other ranks are workers.
//
// Two forwards:
//  * step (serving, generation): a StepPlan of rows — prompt chunks and decode
//    tokens of many sequences, each row (token, position, sequence) — over the
//    paged KV cache (paged_kv_cache.h). The driver calls step(plan): the plan is
//    broadcast to every rank (workers wait in serve()), stage 0 embeds, each
//    stage runs its layers and sends the activations (n, C) to the next, the
//    last stage computes the logits of the rows asked for (vocab-parallel
//    (n, V/t) gathered over TP) and the driver receives them (n × vocab_size).
//    Batch invariance: the rows are cut into tiles of kRowTile rows (the last
//    tile padded) and every matmul runs on one tile, so a row's numbers are
//    those of a tile-sized GEMM whatever the batch (BLAS and cuBLAS choose their
//    kernels by shape, and a row's result depends on the kernel); attention is
//    per row (PagedAttentionCore). A request's tokens therefore never depend on
//    what else is in the step.
//  * score (evaluate): windows (B, T) through the training block (causal
//    attention, no cache); the last stage reduces its vocabulary slice of each
//    row to (max, Σexp, target logit, argmax), the TP group combines them, and
//    the driver receives every token's loss and argmax over the first
//    vocab_size logits. Collective: every rank calls it with the same windows.
//
// Control plane (host, an MPI Communicator on a duplicate of the world communicator,
// so every wait has MPITRON_COMM_TIMEOUT_S): a step is a header broadcast (polled by
// idle workers, so an idle server does not spin) and the plan; serving, an idle
// driver's heartbeat is a header and an all-reduce every rank answers; logits travel
// from the last stage's TP rank 0 to the driver by MPI send (bounded by a JobDeadline).
// Activations and TP reductions use the Communicators (NCCL on GPUs).
#pragma once
#include <mpi.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "model/gpt.h"
#include "model/inference/paged_kv_cache.h"
#include "parallel/communicator.h"
#include "parallel/grid.h"

namespace mpitron {

// Rows per GEMM in a step: kRowTile and kHeadRowTile (model/inference/paged_kv_cache.h).

struct RunnerOptions {
  int tp = 1, pp = 1;          // --tensor-model-parallel-size, --pipeline-model-parallel-size
  DType dtype = DType::F32;    // compute dtype (--fp16 / --bf16 round the f32 checkpoint)
  std::string device = "auto"; // --device: auto (a GPU when there is one) | cpu | cuda
  bool force_ops_attention = false;  // tests: the tensor-ops paged attention on the CPU too
  bool force_mpi_for_device = false; // --force-mpi-for-device: MPI (host-staged) for GPU tensors (ranks sharing a GPU)
  // --num-speculative-tokens k: draft k tokens per step with the model's MTP layers (k <= mtp_num_layers;
  // k = 1 is built); the last stage keeps an MTP layer's KV cache beside its own and each step's
  // final-normed hidden states for the draft step.
  int64_t num_speculative_tokens = 0;
  // text_generation_server: the ranks end the job when one of them stops answering, as training
  // does (docs/training.md "A frozen or failed rank"). The driver, idle, checks every rank answers
  // every heartbeat_s() (MPITRON_COMM_TIMEOUT_S / 4, at most 10 s); a worker that hears neither a
  // step nor a heartbeat for twice that waits MPITRON_COMM_TIMEOUT_S more, then fails naming the
  // driver. Off (generate_text, evaluate): the workers wait for the driver's next step for ever (a
  // person typing at --interactive).
  bool serving = false;
};

// One step of the dynamic engine: rows = the tokens fed to the model now.
//   kind 0: the model's forward over its layers (the rows' tokens at their positions);
//   kind 1: an MTP draft (speculative decoding): row i is position pos of a sequence whose token pos + 1
//           is tokens[i]; hidden_rows[i] names the row of the LAST kind-0 step whose final-normed hidden
//           state is that position's; the MTP layer (model/gpt_mtp.cpp) runs over its own KV cache and
//           logits_rows get the logits of the token at pos + 2.
struct StepPlan {
  int32_t kind = 0;
  std::vector<int32_t> hidden_rows;  // kind 1: [row] a row of the last kind-0 step
  std::vector<int32_t> tokens;       // [row] token id
  PagedRows rows;                    // [row] position and sequence; per sequence its block table
  std::vector<int32_t> logits_rows;  // rows whose next-token logits are returned, in this order
  void validate(int64_t vocab, int64_t max_positions, int64_t num_blocks, int64_t block_size) const;
  std::vector<int32_t> serialize() const;
  static StepPlan deserialize(const std::vector<int32_t>& v);
};

struct ScoreOutput {
  std::vector<double> loss;     // [B·T] −log softmax(logits)[target] over the first vocab_size logits
  std::vector<int32_t> argmax;  // [B·T] first index of the largest of those logits
};

class ModelRunner {
 public:
  // Collective over `world` (not freed here): grid, model part, checkpoint read.
  ModelRunner(MPI_Comm world, const std::string& load_dir, const RunnerOptions& o);
  ~ModelRunner();
  ModelRunner(const ModelRunner&) = delete;
  ModelRunner& operator=(const ModelRunner&) = delete;

  bool is_driver() const { return grid_->world_rank() == 0; }
  const Grid& grid() const { return *grid_; }
  const GPTConfig& config() const { return model_->config(); }
  Device device() const { return model_->device(); }
  const std::string& checkpoint_dir() const { return dir_; }
  int64_t iteration() const { return iteration_; }
  std::string describe() const;  // "tp 2 x pp 2 (world 4), cpu"

  // ---- paged KV cache (every rank, the same arguments) ----
  // Bytes of one block on this rank (its layers and key/value heads); equal on every rank.
  int64_t kv_bytes_per_block(int64_t block_size) const;
  void init_kv_cache(int64_t num_blocks, int64_t block_size);
  bool has_kv_cache() const { return kv_ != nullptr; }
  const PagedKVCache& kv_cache() const { return *kv_; }

  // ---- serving: the driver drives, the workers serve ----
  // Driver: one forward of `plan` on every rank; returns logits_rows.size() × vocab_size (host, f32).
  std::vector<float> step(const StepPlan& plan);
  // Driver: ends the workers' serve() (call once, after the last step).
  void stop_workers();
  // Workers: run the driver's steps until stop_workers(). Returns at once on the driver.
  // Serving: throws (naming the silent rank) when the driver stops answering.
  void serve();
  // Driver, serving, between steps: at most every heartbeat_s(), every rank answers a heartbeat
  // within MPITRON_COMM_TIMEOUT_S or this throws naming the ranks that did not (the collective
  // timeout of parallel/communicator.h). Does nothing when not serving or on one rank.
  void heartbeat();
  double heartbeat_s() const { return heartbeat_s_; }

  // ---- evaluation: collective, every rank with the same arguments ----
  // tokens, targets: B·T ids, row-major windows. Filled on the driver only.
  ScoreOutput score(const std::vector<int32_t>& tokens, const std::vector<int32_t>& targets, int64_t B, int64_t T);

 private:
  std::vector<float> run_step(const StepPlan& plan);
  // Driver: the header of what comes next (kind 0: stop, 1: a step of `size` plan ints, 2: a heartbeat).
  void send_header(int64_t kind, int64_t size);
  void answer_heartbeat();  // every rank: the heartbeat's all-reduce (the driver learns every rank answered)
  // The last stage: the logits (nl × vocab_size, on TP rank 0 of it; empty elsewhere) of rows of h
  // (final-normed, (≥ nl, C)) through the output layer.
  std::vector<float> head_logits(const Tensor& h, int64_t nl);
  // The last stage, a kind-1 plan: the MTP layer's final-normed output (npad, C) for the rows.
  Tensor mtp_draft_hidden(const StepPlan& plan, const PagedRows& rows, int64_t npad);
  // Logits of the last stage's TP rank 0 to the driver (the driver returns them).
  std::vector<float> deliver(std::vector<float> out, int64_t nl);
  Tensor embed(const std::vector<int32_t>& ids, const std::vector<int64_t>& pos);  // (n, C) on stage 0
  Tensor final_norm(const Tensor& x);                                              // (n, C) row-wise
  Tensor recv_activation(int64_t rows);
  void send_activation(const Tensor& x);
  bool first_stage() const { return grid_->is_first_stage(); }
  bool last_stage() const { return grid_->is_last_stage(); }
  int last_stage_world_rank() const;
  TensorParallel tp() const;

  std::unique_ptr<Grid> grid_;
  std::unique_ptr<Communicator> tp_comm_, pp_comm_;
  MPI_Comm control_ = MPI_COMM_NULL;  // duplicate of world: step headers, plans, logits to the driver
  std::unique_ptr<Communicator> ctl_;  // over control_ (MPI, host): headers, plans, heartbeats, with its timeout
  double heartbeat_s_ = 0;             // serving: the driver's heartbeat period (0: none)
  double last_control_s_ = 0;          // driver: when the last header went out (steady clock, s)
  std::unique_ptr<GPT> model_;
  std::unique_ptr<PagedKVCache> kv_;
  Tensor last_hidden_;  // speculative decoding, last stage: the last kind-0 step's final-normed rows (npad, C)
  RunnerOptions opts_;
  std::string dir_;
  int64_t iteration_ = -1;
  bool stopped_ = false;
};

}  // namespace mpitron
