// parallel/grid.h — the rank grid: tensor × data × pipeline parallel groups.
//
// world = tp · dp · pp. Ranks are laid out tp fastest, then dp, then pp
// (Megatron's order), so a tensor-parallel group is tp consecutive ranks
// (one node's GPUs, NVLink), and pipeline stages are the slowest axis:
//
//   world rank = tp_rank + tp · (dp_rank + dp · pp_rank)
//
//   e.g. world 8, tp 2, pp 2 → dp 2:
//     pp stage 0: dp 0 = ranks {0,1}, dp 1 = {2,3};  stage 1: dp 0 = {4,5}, dp 1 = {6,7}
//     tp groups {0,1} {2,3} {4,5} {6,7}; dp groups {0,2} {1,3} {4,6} {5,7};
//     pp groups {0,4} {1,5} {2,6} {3,7}; embedding groups = pp groups' first+last stage.
//
// Every group is an MPI communicator made with MPI_Comm_split (collective over
// the world communicator given to the constructor; every rank constructs the
// Grid with the same tp, pp). The Grid owns them and frees them in its
// destructor; it is an object, never a global, so tests can build several.
#pragma once
#include <mpi.h>

#include <string>
#include <vector>

namespace mpitron {

struct GridConfig {
  int tp = 1;                 // --tensor-model-parallel-size
  int pp = 1;                 // --pipeline-model-parallel-size
  bool bind_device = true;    // cuda_set_device(local_rank % device_count) when a GPU is usable
};

struct GridCoord {
  int tp = 0, dp = 0, pp = 0;
  bool operator==(const GridCoord& o) const { return tp == o.tp && dp == o.dp && pp == o.pp; }
};

class Grid {
 public:
  // Collective over `world` (not freed by the Grid). Throws when the world size
  // is not divisible by tp·pp, naming the numbers.
  Grid(MPI_Comm world, const GridConfig& cfg);
  ~Grid();
  Grid(const Grid&) = delete;
  Grid& operator=(const Grid&) = delete;

  int world_size() const { return world_size_; }
  int world_rank() const { return world_rank_; }
  int tp_size() const { return tp_; }
  int dp_size() const { return dp_; }
  int pp_size() const { return pp_; }
  int tp_rank() const { return me_.tp; }
  int dp_rank() const { return me_.dp; }
  int pp_rank() const { return me_.pp; }
  GridCoord coord() const { return me_; }
  bool is_first_stage() const { return me_.pp == 0; }
  bool is_last_stage() const { return me_.pp == pp_ - 1; }

  // Pure layout arithmetic (no MPI).
  int rank_of(const GridCoord& c) const;
  GridCoord coord_of(int world_rank) const;
  // World ranks of this rank's groups, in group-rank order.
  std::vector<int> tp_group_ranks() const;
  std::vector<int> dp_group_ranks() const;
  std::vector<int> pp_group_ranks() const;
  std::vector<int> embedding_group_ranks() const;  // first and last stage (one rank when pp == 1)

  // The groups (owned by the Grid). Group rank = the coordinate along that axis.
  MPI_Comm world() const { return world_; }
  MPI_Comm tp_comm() const { return tp_comm_; }
  MPI_Comm dp_comm() const { return dp_comm_; }
  MPI_Comm pp_comm() const { return pp_comm_; }
  // Ranks with the same dp coordinate (tp × pp): the model-parallel group, over
  // which e.g. the global gradient norm of one model replica is summed.
  MPI_Comm mp_comm() const { return mp_comm_; }
  // MPI_COMM_NULL on ranks that are in no embedding group (middle stages).
  MPI_Comm embedding_comm() const { return emb_comm_; }
  bool in_embedding_group() const { return emb_comm_ != MPI_COMM_NULL; }

  // Node-local rank and size (MPI_Comm_split_type SHARED) and the CUDA device
  // chosen for this rank (-1 when no GPU is usable or bind_device is off).
  int local_rank() const { return local_rank_; }
  int local_size() const { return local_size_; }
  int device_index() const { return device_; }

  // "world 8 = tp 2 x dp 2 x pp 2; rank 5 = (tp 1, dp 0, pp 1), local 5/8, cuda:1"
  std::string describe() const;

 private:
  MPI_Comm world_;
  int world_size_ = 1, world_rank_ = 0;
  int tp_ = 1, dp_ = 1, pp_ = 1;
  GridCoord me_;
  MPI_Comm tp_comm_ = MPI_COMM_NULL, dp_comm_ = MPI_COMM_NULL, pp_comm_ = MPI_COMM_NULL, mp_comm_ = MPI_COMM_NULL,
           emb_comm_ = MPI_COMM_NULL, local_comm_ = MPI_COMM_NULL;
  int local_rank_ = 0, local_size_ = 1, device_ = -1;
};

}  // namespace mpitron
