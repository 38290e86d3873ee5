// parallel/grid.h — the rank grid: tensor × context × data × pipeline parallel groups.
//
// world = tp · cp · dp · pp. Ranks are laid out tp fastest, then cp, then dp, then
// pp (Megatron's order), so a tensor-parallel group is tp consecutive ranks
// (one node's GPUs, NVLink), a context-parallel group the next axis, and pipeline
// stages are the slowest axis:
//
//   world rank = tp_rank + tp · (cp_rank + cp · (dp_rank + dp · pp_rank))
//
//   e.g. world 8, tp 2, pp 2 → dp 2:
//     pp stage 0: dp 0 = ranks {0,1}, dp 1 = {2,3};  stage 1: dp 0 = {4,5}, dp 1 = {6,7}
//     tp groups {0,1} {2,3} {4,5} {6,7}; dp groups {0,2} {1,3} {4,6} {5,7};
//     pp groups {0,4} {1,5} {2,6} {3,7}; embedding groups = pp groups' first+last stage.
//   e.g. world 8, tp 2, cp 2 → dp 2: cp groups {0,2} {1,3} {4,6} {5,7};
//     dp groups {0,4} {1,5} {2,6} {3,7}; dp×cp groups {0,2,4,6} {1,3,5,7}.
// Expert parallelism (ep, dividing dp): the dp group's ranks split into dp/ep groups of ep
// consecutive dp ranks, dp_rank = edp_rank · ep + ep_rank. The ep ranks of a group hold
// different experts (parallel/expert_parallel.h), the edp ranks (same ep_rank) the same ones:
//   e.g. world 4, dp 4, ep 2: ep groups {0,1} {2,3}; edp groups {0,2} {1,3}.
// Context-parallel ranks hold the same parameters (each trains on its part of every
// sequence), so gradients are reduced over dp × cp (dp_cp_comm, Megatron's
// data-parallel group with context parallelism), and ZeRO shards over it.
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
  int cp = 1;                 // --context-parallel-size
  int ep = 1;                 // --expert-model-parallel-size (divides dp)
  bool bind_device = true;    // cuda_set_device(local_rank % device_count) when a GPU is usable
};

struct GridCoord {
  int tp = 0, dp = 0, pp = 0, cp = 0;  // (cp last so {tp, dp, pp} still reads as before)
  bool operator==(const GridCoord& o) const { return tp == o.tp && dp == o.dp && pp == o.pp && cp == o.cp; }
};

class Grid {
 public:
  // Collective over `world` (not freed by the Grid). Throws when the world size
  // is not divisible by tp·cp·pp, naming the numbers.
  Grid(MPI_Comm world, const GridConfig& cfg);
  ~Grid();
  Grid(const Grid&) = delete;
  Grid& operator=(const Grid&) = delete;

  int world_size() const { return world_size_; }
  int world_rank() const { return world_rank_; }
  int tp_size() const { return tp_; }
  int dp_size() const { return dp_; }
  int pp_size() const { return pp_; }
  int cp_size() const { return cp_; }
  int tp_rank() const { return me_.tp; }
  int cp_rank() const { return me_.cp; }
  int ep_size() const { return ep_; }
  int ep_rank() const { return me_.dp % ep_; }
  int edp_rank() const { return me_.dp / ep_; }  // rank in the expert-data-parallel group
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
  std::vector<int> cp_group_ranks() const;
  std::vector<int> dp_cp_group_ranks() const;  // group rank = cp_rank + cp · dp_rank
  std::vector<int> embedding_group_ranks() const;  // first and last stage (one rank when pp == 1)

  // The groups (owned by the Grid). Group rank = the coordinate along that axis.
  MPI_Comm world() const { return world_; }
  MPI_Comm tp_comm() const { return tp_comm_; }
  MPI_Comm dp_comm() const { return dp_comm_; }
  MPI_Comm pp_comm() const { return pp_comm_; }
  MPI_Comm cp_comm() const { return cp_comm_; }
  // dp × cp ranks of the same (tp, pp): where gradients are reduced (and ZeRO shards);
  // the dp group itself when cp == 1.
  MPI_Comm dp_cp_comm() const { return dp_cp_comm_; }
  // Ranks with the same dp and cp coordinates (tp × pp): the model-parallel group, over
  // which e.g. the global gradient norm of one model replica is summed.
  MPI_Comm mp_comm() const { return mp_comm_; }
  // Expert parallelism (MPI_COMM_NULL when ep == 1): the ep group (ep consecutive dp ranks),
  // the expert-data-parallel group (the dp ranks of the same ep_rank: the experts' gradients
  // are reduced and, under ZeRO, every state sharded over it), and tp × pp × ep (the ranks
  // of one edp coordinate: one whole model, over which the grad norm is summed).
  MPI_Comm ep_comm() const { return ep_comm_; }
  MPI_Comm edp_comm() const { return edp_comm_; }
  MPI_Comm mp_ep_comm() const { return mp_ep_comm_; }
  // MPI_COMM_NULL on ranks that are in no embedding group (middle stages).
  MPI_Comm embedding_comm() const { return emb_comm_; }
  bool in_embedding_group() const { return emb_comm_ != MPI_COMM_NULL; }

  // Node-local rank and size (MPI_Comm_split_type SHARED) and the CUDA device
  // chosen for this rank (-1 when no GPU is usable or bind_device is off).
  int local_rank() const { return local_rank_; }
  int local_size() const { return local_size_; }
  int device_index() const { return device_; }

  // "world 8 = tp 2 x dp 2 x pp 2; rank 5 = (tp 1, dp 0, pp 1), local 5/8, cuda:1"
  // (with cp > 1: "world 8 = tp 2 x cp 2 x dp 2 x pp 1; rank 5 = (tp 1, cp 0, dp 1, pp 0), …")
  std::string describe() const;

 private:
  MPI_Comm world_;
  int world_size_ = 1, world_rank_ = 0;
  int tp_ = 1, dp_ = 1, pp_ = 1, cp_ = 1, ep_ = 1;
  GridCoord me_;
  MPI_Comm tp_comm_ = MPI_COMM_NULL, dp_comm_ = MPI_COMM_NULL, pp_comm_ = MPI_COMM_NULL, mp_comm_ = MPI_COMM_NULL,
           emb_comm_ = MPI_COMM_NULL, local_comm_ = MPI_COMM_NULL, cp_comm_ = MPI_COMM_NULL,
           dp_cp_comm_ = MPI_COMM_NULL, ep_comm_ = MPI_COMM_NULL, edp_comm_ = MPI_COMM_NULL,
           mp_ep_comm_ = MPI_COMM_NULL;
  int local_rank_ = 0, local_size_ = 1, device_ = -1;
};

}  // namespace mpitron
