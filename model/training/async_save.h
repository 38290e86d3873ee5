// model/training/async_save.h — --async-save: checkpoints written by a background thread.
//
// start() copies this rank's optimizer state (master weights, Adam moments;
// its ZeRO shard) and the scalar state to host memory -- the only stall of
// the training loop -- and returns; a background thread then runs the same
// crash-safe save_checkpoint (tmp dir, manifest, fsync, rename, tracker) from
// that copy, over its own duplicate of the world communicator, while training
// continues. At most one save is in flight: start() first waits for the
// previous one. A failure in the background (a full disk) is agreed across
// the ranks inside the writer, and poll(), called by every rank at every
// step, throws it on every rank at the next step. wait() (the final save at
// exit) blocks until the save in flight is committed. The files are the ones
// a synchronous save of the same state writes (only created_unix_time differs).
//
// Needs MPI_THREAD_MULTIPLE when running under MPI (pretrain_gpt asks for it
// when --async-save is given): the background thread makes MPI-IO calls while
// the main thread runs the training collectives.
#pragma once
#include <mpi.h>

#include <atomic>
#include <string>
#include <thread>

#include "model/checkpoint/checkpointing.h"

namespace mpitron {

class AsyncSaver {
 public:
  // Collective over world (MPI_COMM_NULL: one process).
  explicit AsyncSaver(MPI_Comm world);
  ~AsyncSaver();  // waits for a save in flight (its error is logged)
  AsyncSaver(const AsyncSaver&) = delete;
  AsyncSaver& operator=(const AsyncSaver&) = delete;

  // Collective. Waits for (and throws the error of) the previous save, copies
  // the state to host and starts writing it. Returns the iter_N directory it
  // will commit. `model` is used only for its parameter layout and config,
  // which never change during training.
  std::string start(const std::string& save_dir, const GPT& model, const OptimState& opt, const LossScaler& scaler,
                    const TrainState& st, const std::string& flags_json, const std::string& lr_schedule_json,
                    int keep_last, bool writer);
  // Collective, every step: when a save in flight failed on any rank, every
  // rank throws; when it finished everywhere, logs it. Cheap when idle.
  void poll();
  // Collective: blocks until the save in flight is committed (throws its error on every rank).
  void wait();
  bool in_flight() const { return in_flight_; }
  double last_stall_seconds() const { return stall_s_; }

 private:
  void finish();  // join, agree on the outcome, throw on every rank if any failed

  MPI_Comm main_ = MPI_COMM_NULL;  // the caller's communicator (main thread)
  MPI_Comm bg_ = MPI_COMM_NULL;    // duplicate for the background thread's I/O
  std::thread thread_;
  std::atomic<bool> done_{false};
  bool in_flight_ = false;
  std::string error_;  // of the background save on this rank
  SaveInfo info_;
  double stall_s_ = 0;
  // The host copy the background thread writes from.
  OptimState opt_;
  LossScaler scaler_;
  TrainState st_;
  std::string flags_, lr_, save_dir_;
};

}  // namespace mpitron
