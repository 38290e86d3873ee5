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

Grid::Grid(MPI_Comm world, const GridConfig& cfg) : world_(world), tp_(cfg.tp), pp_(cfg.pp), cp_(cfg.cp), ep_(cfg.ep) {
  mpi_ok(MPI_Comm_size(world, &world_size_), "MPI_Comm_size");
  mpi_ok(MPI_Comm_rank(world, &world_rank_), "MPI_Comm_rank");
  MPT_CHECK(tp_ >= 1 && pp_ >= 1 && cp_ >= 1,
            str("tensor-model-parallel-size ", tp_, ", pipeline-model-parallel-size ", pp_, " and context-parallel-size ",
                cp_, " must be >= 1"), "");
  const int mp = tp_ * cp_ * pp_;
  MPT_CHECK(world_size_ % mp == 0,
            str("world size ", world_size_, " is not divisible by tensor-model-parallel-size ", tp_,
                cp_ > 1 ? str(" x context-parallel-size ", cp_) : std::string(), " x pipeline-model-parallel-size ", pp_,
                " = ", mp),
            str("run a multiple of ", mp, " ranks, or change --tensor-model-parallel-size / ",
                cp_ > 1 ? "--context-parallel-size / " : "", "--pipeline-model-parallel-size"));
  dp_ = world_size_ / mp;
  me_ = coord_of(world_rank_);
  MPT_CHECK(ep_ >= 1 && dp_ % ep_ == 0,
            str("--expert-model-parallel-size ", ep_, " does not divide the data-parallel size ", dp_, " (world ",
                world_size_, " / (tp ", tp_, " x cp ", cp_, " x pp ", pp_, "))"),
            "expert-parallel ranks are data-parallel ranks: run a multiple of tp x cp x pp x ep ranks");

  // Color = the coordinates that stay fixed along the group; key = the coordinate
  // that varies, so group rank == that coordinate. (Colors are any injective code
  // of the fixed coordinates.)
  const int w = world_rank_, T = tp_, C = cp_, D = dp_;
  const GridCoord& c = me_;
  mpi_ok(MPI_Comm_split(world, c.cp + C * (c.dp + D * c.pp), c.tp, &tp_comm_), "MPI_Comm_split(tp)");
  mpi_ok(MPI_Comm_split(world, c.tp + T * (c.dp + D * c.pp), c.cp, &cp_comm_), "MPI_Comm_split(cp)");
  mpi_ok(MPI_Comm_split(world, c.tp + T * (c.cp + C * c.pp), c.dp, &dp_comm_), "MPI_Comm_split(dp)");
  mpi_ok(MPI_Comm_split(world, c.tp + T * c.pp, c.cp + C * c.dp, &dp_cp_comm_), "MPI_Comm_split(dp x cp)");
  mpi_ok(MPI_Comm_split(world, c.tp + T * (c.cp + C * c.dp), c.pp, &pp_comm_), "MPI_Comm_split(pp)");
  mpi_ok(MPI_Comm_split(world, c.dp + D * c.cp, c.tp + T * c.pp, &mp_comm_), "MPI_Comm_split(mp)");
  if (ep_ > 1) {  // dp = edp · ep + ep_rank
    const int er = c.dp % ep_, ed = c.dp / ep_, ED = D / ep_;
    mpi_ok(MPI_Comm_split(world, c.tp + T * (c.cp + C * (ed + ED * c.pp)), er, &ep_comm_), "MPI_Comm_split(ep)");
    mpi_ok(MPI_Comm_split(world, c.tp + T * (c.cp + C * (er + ep_ * c.pp)), ed, &edp_comm_), "MPI_Comm_split(edp)");
    mpi_ok(MPI_Comm_split(world, c.cp + C * ed, w, &mp_ep_comm_), "MPI_Comm_split(mp x ep)");
  }
  const bool in_emb = is_first_stage() || is_last_stage();
  mpi_ok(MPI_Comm_split(world, in_emb ? c.tp + T * (c.cp + C * c.dp) : MPI_UNDEFINED, c.pp, &emb_comm_),
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
  for (MPI_Comm* c : {&tp_comm_, &dp_comm_, &pp_comm_, &mp_comm_, &emb_comm_, &local_comm_, &cp_comm_, &dp_cp_comm_, &ep_comm_, &edp_comm_,
                      &mp_ep_comm_})
    if (*c != MPI_COMM_NULL) MPI_Comm_free(c);
}

int Grid::rank_of(const GridCoord& c) const {
  MPT_CHECK(c.tp >= 0 && c.tp < tp_ && c.cp >= 0 && c.cp < cp_ && c.dp >= 0 && c.dp < dp_ && c.pp >= 0 && c.pp < pp_,
            str("grid coordinate (tp ", c.tp, ", cp ", c.cp, ", dp ", c.dp, ", pp ", c.pp, ") outside tp ", tp_, " x cp ",
                cp_, " x dp ", dp_, " x pp ", pp_),
            "");
  return c.tp + tp_ * (c.cp + cp_ * (c.dp + dp_ * c.pp));
}

GridCoord Grid::coord_of(int r) const {
  MPT_CHECK(r >= 0 && r < world_size_, str("world rank ", r, " outside world size ", world_size_), "");
  GridCoord c;
  c.tp = r % tp_;
  c.cp = (r / tp_) % cp_;
  c.dp = (r / (tp_ * cp_)) % dp_;
  c.pp = r / (tp_ * cp_ * dp_);
  return c;
}

std::vector<int> Grid::tp_group_ranks() const {
  std::vector<int> v;
  for (int t = 0; t < tp_; ++t) v.push_back(rank_of({t, me_.dp, me_.pp, me_.cp}));
  return v;
}
std::vector<int> Grid::dp_group_ranks() const {
  std::vector<int> v;
  for (int d = 0; d < dp_; ++d) v.push_back(rank_of({me_.tp, d, me_.pp, me_.cp}));
  return v;
}
std::vector<int> Grid::pp_group_ranks() const {
  std::vector<int> v;
  for (int p = 0; p < pp_; ++p) v.push_back(rank_of({me_.tp, me_.dp, p, me_.cp}));
  return v;
}
std::vector<int> Grid::cp_group_ranks() const {
  std::vector<int> v;
  for (int k = 0; k < cp_; ++k) v.push_back(rank_of({me_.tp, me_.dp, me_.pp, k}));
  return v;
}
std::vector<int> Grid::dp_cp_group_ranks() const {
  std::vector<int> v;
  for (int d = 0; d < dp_; ++d)
    for (int k = 0; k < cp_; ++k) v.push_back(rank_of({me_.tp, d, me_.pp, k}));
  return v;
}
std::vector<int> Grid::embedding_group_ranks() const {
  std::vector<int> v{rank_of({me_.tp, me_.dp, 0, me_.cp})};
  if (pp_ > 1) v.push_back(rank_of({me_.tp, me_.dp, pp_ - 1, me_.cp}));
  return v;
}

std::string Grid::describe() const {
  const std::string where = device_ >= 0 ? str(", cuda:", device_) : std::string(", cpu");
  if (ep_ > 1)
    return str("world ", world_size_, " = tp ", tp_, " x cp ", cp_, " x dp ", dp_, " (ep ", ep_, " x edp ", dp_ / ep_,
               ") x pp ", pp_, "; rank ", world_rank_, " = (tp ", me_.tp, ", cp ", me_.cp, ", dp ", me_.dp, " = ep ",
               ep_rank(), " + ", ep_, " x edp ", edp_rank(), ", pp ", me_.pp, "), local ", local_rank_, "/", local_size_,
               where);
  if (cp_ == 1)
    return str("world ", world_size_, " = tp ", tp_, " x dp ", dp_, " x pp ", pp_, "; rank ", world_rank_, " = (tp ",
               me_.tp, ", dp ", me_.dp, ", pp ", me_.pp, "), local ", local_rank_, "/", local_size_, where);
  return str("world ", world_size_, " = tp ", tp_, " x cp ", cp_, " x dp ", dp_, " x pp ", pp_, "; rank ", world_rank_,
             " = (tp ", me_.tp, ", cp ", me_.cp, ", dp ", me_.dp, ", pp ", me_.pp, "), local ", local_rank_, "/",
             local_size_, where);
}

}  // namespace mpitron
