// model/training/parallel_runtime.h — the communicators of one training run, from a Grid.
//
// Built once per process after the flags are parsed: the Grid (tp fastest, then
// cp, then dp, then pp) and one Communicator per group the trainer uses, on the device's
// backend (NCCL for GPU tensors unless --force-mpi-for-device). The
// ParallelContext it hands to the Trainer points into it, so it must outlive
// the Trainer.
#pragma once
#include <mpi.h>

#include <memory>

#include "model/training/arguments.h"
#include "model/training/trainer.h"
#include "parallel/grid.h"

namespace mpitron {

class ParallelRuntime {
 public:
  // Collective over `world`. args.tensor/pipeline sizes decide the grid.
  ParallelRuntime(MPI_Comm world, const TrainArgs& args);
  const Grid& grid() const { return *grid_; }
  // The device this rank trains on (--device, the grid's node-local GPU).
  Device device() const { return device_; }
  ParallelContext context() const;
  // "world 8 = tp 2 x dp 2 x pp 2; ..."
  std::string describe() const;

 private:
  std::unique_ptr<Grid> grid_;
  Device device_;
  std::unique_ptr<Communicator> dp_, tp_, pp_, mp_, emb_, cp_, dp_cp_, ep_, edp_, mp_ep_;
};

}  // namespace mpitron
