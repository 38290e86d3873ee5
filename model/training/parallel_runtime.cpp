#include "model/training/parallel_runtime.h"

namespace mpitron {

ParallelRuntime::ParallelRuntime(MPI_Comm world, const TrainArgs& args) {
  GridConfig gc;
  gc.tp = static_cast<int>(args.tensor_model_parallel_size);
  gc.pp = static_cast<int>(args.pipeline_model_parallel_size);
  gc.cp = static_cast<int>(args.context_parallel_size);
  gc.ep = static_cast<int>(args.expert_model_parallel_size);
  grid_ = std::make_unique<Grid>(world, gc);
  const bool gpu = args.device == "cuda" || (args.device == "auto" && cuda_available());
  device_ = gpu ? Device::cuda(std::max(0, grid_->device_index())) : Device::cpu();
  auto make = [&](MPI_Comm c, const char* name) {
    CommOptions co;
    co.name = name;
    co.force_mpi_for_device = args.force_mpi_for_device;
    return make_communicator(c, device_, co);
  };
  // Every rank builds every group it belongs to, in the same order (collective).
  if (grid_->dp_size() > 1) dp_ = make(grid_->dp_comm(), "dp");
  if (grid_->tp_size() > 1) tp_ = make(grid_->tp_comm(), "tp");
  if (grid_->pp_size() > 1) pp_ = make(grid_->pp_comm(), "pp");
  if (grid_->tp_size() * grid_->pp_size() > 1) mp_ = make(grid_->mp_comm(), "mp");
  if (grid_->pp_size() > 1 && grid_->in_embedding_group()) emb_ = make(grid_->embedding_comm(), "embedding");
  if (grid_->cp_size() > 1) {
    cp_ = make(grid_->cp_comm(), "cp");
    dp_cp_ = make(grid_->dp_cp_comm(), "dp_cp");
  }
  if (grid_->ep_size() > 1) {
    ep_ = make(grid_->ep_comm(), "ep");
    edp_ = make(grid_->edp_comm(), "edp");
    mp_ep_ = make(grid_->mp_ep_comm(), "mp_ep");
  }
}

ParallelContext ParallelRuntime::context() const {
  ParallelContext c;
  const Grid& g = *grid_;
  c.world = g.world();
  if (g.dp_size() > 1) c.dp_comm = g.dp_comm();
  c.dp = dp_.get();
  c.dp_rank = g.dp_rank();
  c.dp_size = g.dp_size();
  c.tp = tp_.get();
  c.tp_rank = g.tp_rank();
  c.tp_size = g.tp_size();
  c.pp = pp_.get();
  c.pp_rank = g.pp_rank();
  c.pp_size = g.pp_size();
  if (g.pp_size() > 1) c.pp_comm = g.pp_comm();
  c.mp = mp_.get();
  c.embedding = emb_.get();
  c.cp_rank = g.cp_rank();
  c.cp_size = g.cp_size();
  if (g.cp_size() > 1) {
    c.cp = cp_.get();
    c.cp_comm = g.cp_comm();
    c.dp_cp = dp_cp_.get();
    c.dp_cp_comm = g.dp_cp_comm();
  }
  if (g.ep_size() > 1) {
    c.ep_rank = g.ep_rank();
    c.ep_size = g.ep_size();
    c.ep = ep_.get();
    c.edp = edp_.get();
    c.mp_ep = mp_ep_.get();
    c.edp_comm = g.edp_comm();
  }
  return c;
}

std::string ParallelRuntime::describe() const { return grid_->describe(); }

}  // namespace mpitron
