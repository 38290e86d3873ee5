#include "parallel/grid.h"

#include "core/device.h"
#include "core/error.h"
#include "core/log.h"

namespace mpitron {

namespace {
void mpi_ok(int rc, const char* what) {
  if (rc == MPI_SUCCESS) return;
  char buf[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, buf, &len);
  MPT_THROW(str("grid: ", what, ": ", std::string(buf, static_cast<size_t>(len))), "");
}
}  // namespace

Grid::Grid(MPI_Comm world, const GridConfig& cfg) : world_(world), tp_(cfg.tp), pp_(cfg.pp) {
  mpi_ok(MPI_Comm_size(world, &world_size_), "MPI_Comm_size");
  mpi_ok(MPI_Comm_rank(world, &world_rank_), "MPI_Comm_rank");
  MPT_CHECK(tp_ >= 1 && pp_ >= 1,
            str("tensor-model-parallel-size ", tp_, " and pipeline-model-parallel-size ", pp_, " must be >= 1"), "");
  MPT_CHECK(world_size_ % (tp_ * pp_) == 0,
            str("world size ", world_size_, " is not divisible by tensor-model-parallel-size ", tp_,
                " x pipeline-model-parallel-size ", pp_, " = ", tp_ * pp_),
            str("run a multiple of ", tp_ * pp_, " ranks, or change --tensor-model-parallel-size / "
                "--pipeline-model-parallel-size"));
  dp_ = world_size_ / (tp_ * pp_);
  me_ = coord_of(world_rank_);

  // Color = the coordinates that stay fixed along the group; key = the coordinate
  // that varies, so group rank == that coordinate.
  const int w = world_rank_;
  mpi_ok(MPI_Comm_split(world, me_.dp + dp_ * me_.pp, me_.tp, &tp_comm_), "MPI_Comm_split(tp)");
  mpi_ok(MPI_Comm_split(world, me_.tp + tp_ * me_.pp, me_.dp, &dp_comm_), "MPI_Comm_split(dp)");
  mpi_ok(MPI_Comm_split(world, me_.tp + tp_ * me_.dp, me_.pp, &pp_comm_), "MPI_Comm_split(pp)");
  mpi_ok(MPI_Comm_split(world, me_.dp, me_.tp + tp_ * me_.pp, &mp_comm_), "MPI_Comm_split(mp)");
  const bool in_emb = is_first_stage() || is_last_stage();
  mpi_ok(MPI_Comm_split(world, in_emb ? me_.tp + tp_ * me_.dp : MPI_UNDEFINED, me_.pp, &emb_comm_),
         "MPI_Comm_split(embedding)");
  mpi_ok(MPI_Comm_split_type(world, MPI_COMM_TYPE_SHARED, w, MPI_INFO_NULL, &local_comm_),
         "MPI_Comm_split_type(shared)");
  MPI_Comm_rank(local_comm_, &local_rank_);
  MPI_Comm_size(local_comm_, &local_size_);
  if (cfg.bind_device && cuda_available()) {
    device_ = local_rank_ % cuda_device_count();
    cuda_set_device(device_);
    if (local_size_ > cuda_device_count() && local_rank_ == 0)
      log_warn("grid: ", local_size_, " ranks on this node share ", cuda_device_count(),
               " GPU(s); NCCL needs one GPU per rank of a group (use --force-mpi-for-device to share)");
  }
}

Grid::~Grid() {
  for (MPI_Comm* c : {&tp_comm_, &dp_comm_, &pp_comm_, &mp_comm_, &emb_comm_, &local_comm_})
    if (*c != MPI_COMM_NULL) MPI_Comm_free(c);
}

int Grid::rank_of(const GridCoord& c) const {
  MPT_CHECK(c.tp >= 0 && c.tp < tp_ && c.dp >= 0 && c.dp < dp_ && c.pp >= 0 && c.pp < pp_,
            str("grid coordinate (tp ", c.tp, ", dp ", c.dp, ", pp ", c.pp, ") outside tp ", tp_, " x dp ", dp_, " x pp ",
                pp_),
            "");
  return c.tp + tp_ * (c.dp + dp_ * c.pp);
}

GridCoord Grid::coord_of(int r) const {
  MPT_CHECK(r >= 0 && r < world_size_, str("world rank ", r, " outside world size ", world_size_), "");
  GridCoord c;
  c.tp = r % tp_;
  c.dp = (r / tp_) % dp_;
  c.pp = r / (tp_ * dp_);
  return c;
}

std::vector<int> Grid::tp_group_ranks() const {
  std::vector<int> v;
  for (int t = 0; t < tp_; ++t) v.push_back(rank_of({t, me_.dp, me_.pp}));
  return v;
}
std::vector<int> Grid::dp_group_ranks() const {
  std::vector<int> v;
  for (int d = 0; d < dp_; ++d) v.push_back(rank_of({me_.tp, d, me_.pp}));
  return v;
}
std::vector<int> Grid::pp_group_ranks() const {
  std::vector<int> v;
  for (int p = 0; p < pp_; ++p) v.push_back(rank_of({me_.tp, me_.dp, p}));
  return v;
}
std::vector<int> Grid::embedding_group_ranks() const {
  std::vector<int> v{rank_of({me_.tp, me_.dp, 0})};
  if (pp_ > 1) v.push_back(rank_of({me_.tp, me_.dp, pp_ - 1}));
  return v;
}

std::string Grid::describe() const {
  return str("world ", world_size_, " = tp ", tp_, " x dp ", dp_, " x pp ", pp_, "; rank ", world_rank_, " = (tp ",
             me_.tp, ", dp ", me_.dp, ", pp ", me_.pp, "), local ", local_rank_, "/", local_size_,
             device_ >= 0 ? str(", cuda:", device_) : std::string(", cpu"));
}

}  // namespace mpitron
