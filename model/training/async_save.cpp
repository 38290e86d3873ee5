// model/training/async_save.cpp — AsyncSaver (see the header).
#include "model/training/async_save.h"

#include <filesystem>

#include "core/log.h"
#include "core/timer.h"
#include "io/checkpoint.h"
#include "parallel/job_exit.h"

namespace mpitron {

namespace {
bool mpi_running() {
  int init = 0, fin = 0;
  MPI_Initialized(&init);
  MPI_Finalized(&fin);
  return init && !fin;
}
Tensor host_copy(const Tensor& t) {
  if (!t.defined()) return Tensor();
  return t.device().is_cpu() ? t.clone() : t.to(Device::cpu());
}
int max_over(MPI_Comm c, int v) {
  if (c == MPI_COMM_NULL) return v;
  allreduce_bounded(&v, 1, MPI_INT, MPI_MAX, c, "async save state");
  return v;
}
}  // namespace

AsyncSaver::AsyncSaver(MPI_Comm world) {
  if (world == MPI_COMM_NULL || !mpi_running()) return;
  int level = 0;
  MPI_Query_thread(&level);
  MPT_CHECK(level >= MPI_THREAD_MULTIPLE,
            "--async-save needs MPI_THREAD_MULTIPLE (a background thread writes the checkpoint with MPI-IO while "
            "training runs), and this MPI library was initialised without it",
            "run without --async-save, or use an MPI built with thread support");
  main_ = world;
  MPI_Comm_dup(world, &bg_);
}

AsyncSaver::~AsyncSaver() {
  if (thread_.joinable()) thread_.join();
  if (in_flight_ && !error_.empty()) log_error("background checkpoint save failed: ", error_);
  if (bg_ != MPI_COMM_NULL && mpi_running()) MPI_Comm_free(&bg_);
}

std::string AsyncSaver::start(const std::string& save_dir, const GPT& model, const OptimState& opt,
                              const LossScaler& scaler, const TrainState& st, const std::string& flags_json,
                              const std::string& lr_schedule_json, int keep_last, bool writer) {
  wait();  // at most one in flight
  Timer t;
  opt_ = OptimState{host_copy(opt.master), host_copy(opt.exp_avg), host_copy(opt.exp_avg_sq), opt.begin, opt.steps,
                    opt.optimizer};
  scaler_ = scaler;
  st_ = st;
  flags_ = flags_json;
  lr_ = lr_schedule_json;
  save_dir_ = save_dir;
  error_.clear();
  done_ = false;
  in_flight_ = true;
  const GPT* m = &model;
  thread_ = std::thread([this, m, keep_last, writer] {
    try {
      info_ = save_checkpoint(save_dir_, *m, opt_, scaler_, st_, flags_, lr_, keep_last, bg_, writer);
    } catch (const Error& e) {
      error_ = e.hint().empty() ? e.message() : str(e.message(), " (hint: ", e.hint(), ")");
    } catch (const std::exception& e) {
      error_ = e.what();
    }
    done_ = true;
  });
  stall_s_ = t.seconds();
  return (std::filesystem::path(save_dir) / io::iteration_dir_name(st.iteration)).string();
}

void AsyncSaver::finish() {
  if (thread_.joinable()) thread_.join();
  in_flight_ = false;
  opt_ = OptimState{};  // give the host copy back
  const int failed = max_over(main_, error_.empty() ? 0 : 1);
  if (failed)
    MPT_THROW(str("background checkpoint save of iteration ", st_.iteration, " failed: ",
                  error_.empty() ? std::string("on another rank (see its log)") : error_),
              "the previous checkpoint is intact; free space on (or fix) the --save file system and resume from it");
  log_info("saved checkpoint at iteration ", st_.iteration, " to ", info_.dir, " in the background (",
           info_.bytes / 1e9, " GB in ", info_.seconds, " s; training stalled ", stall_s_, " s for the host copy)");
}

void AsyncSaver::poll() {
  if (!in_flight_) return;  // the same on every rank: saves start at the same step everywhere
  // Finished everywhere, or failed somewhere: settle it now (every rank joins
  // its thread; a failed save failed on every rank, agreed inside the writer).
  int v[2] = {done_ && !error_.empty() ? 1 : 0, done_ ? 0 : 1};  // failed here, still running here
  if (main_ != MPI_COMM_NULL) allreduce_bounded(v, 2, MPI_INT, MPI_MAX, main_, "async save state");
  if (v[0] || !v[1]) finish();
}

void AsyncSaver::wait() {
  if (in_flight_) finish();
}

}  // namespace mpitron
