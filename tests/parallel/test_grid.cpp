// tests/parallel/test_grid.cpp — rank grid layouts (tp fastest, then dp, then
// pp) and their MPI groups, checked on real ranks: every group's members are
// gathered over the group itself and compared with the layout arithmetic.
// mpitron-test: np=2,4
// mpitron-test: timeout=120
#include <doctest/doctest.h>

#include <mpi.h>

#include <memory>

#include "core/device.h"
#include "core/error.h"
#include "parallel/grid.h"

using namespace mpitron;

namespace {
int wsize() {
  int n = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  return n;
}
// World ranks of comm's members in comm-rank order, gathered over comm.
std::vector<int> members(MPI_Comm comm) {
  int n = 0, me = 0;
  MPI_Comm_size(comm, &n);
  MPI_Comm_rank(MPI_COMM_WORLD, &me);
  std::vector<int> v(static_cast<size_t>(n));
  MPI_Allgather(&me, 1, MPI_INT, v.data(), 1, MPI_INT, comm);
  return v;
}
int rank_in(MPI_Comm comm) {
  int r = 0;
  MPI_Comm_rank(comm, &r);
  return r;
}
}  // namespace

TEST_CASE("grid: groups for (tp, pp) in {(1,1), (2,1), (1,2), (2,2)}") {
  int up = 0;
  MPI_Initialized(&up);
  REQUIRE(up);
  const int n = wsize();
  for (auto [tp, pp] : {std::pair{1, 1}, std::pair{2, 1}, std::pair{1, 2}, std::pair{2, 2}}) {
    if (n % (tp * pp) != 0) continue;  // np=2: (2,2) is the rejection case below
    GridConfig cfg;
    cfg.tp = tp;
    cfg.pp = pp;
    Grid g(MPI_COMM_WORLD, cfg);
    const int w = g.world_rank();
    const int dp = n / (tp * pp);
    INFO("tp ", tp, " pp ", pp, ": ", g.describe());
    CHECK(g.dp_size() == dp);
    // Megatron's order: tp fastest, then dp, then pp.
    CHECK(g.tp_rank() == w % tp);
    CHECK(g.dp_rank() == (w / tp) % dp);
    CHECK(g.pp_rank() == w / (tp * dp));
    CHECK(g.rank_of(g.coord()) == w);
    for (int q = 0; q < n; ++q) CHECK(g.rank_of(g.coord_of(q)) == q);

    // Groups: members as MPI sees them == the layout arithmetic; group rank == coordinate.
    CHECK(members(g.tp_comm()) == g.tp_group_ranks());
    CHECK(members(g.dp_comm()) == g.dp_group_ranks());
    CHECK(members(g.pp_comm()) == g.pp_group_ranks());
    CHECK(rank_in(g.tp_comm()) == g.tp_rank());
    CHECK(rank_in(g.dp_comm()) == g.dp_rank());
    CHECK(rank_in(g.pp_comm()) == g.pp_rank());
    // Explicit expectations at np=4.
    if (n == 4) {
      if (tp == 2 && pp == 2) {
        const std::vector<int> tpg[] = {{0, 1}, {0, 1}, {2, 3}, {2, 3}};
        const std::vector<int> ppg[] = {{0, 2}, {1, 3}, {0, 2}, {1, 3}};
        CHECK(g.tp_group_ranks() == tpg[w]);
        CHECK(g.pp_group_ranks() == ppg[w]);
        CHECK(g.dp_group_ranks() == std::vector<int>{w});
      } else if (tp == 2) {
        const std::vector<int> dpg[] = {{0, 2}, {1, 3}, {0, 2}, {1, 3}};
        CHECK(g.dp_group_ranks() == dpg[w]);
      } else if (pp == 2) {
        const std::vector<int> dpg[] = {{0, 1}, {0, 1}, {2, 3}, {2, 3}};
        const std::vector<int> ppg[] = {{0, 2}, {1, 3}, {0, 2}, {1, 3}};
        CHECK(g.dp_group_ranks() == dpg[w]);
        CHECK(g.pp_group_ranks() == ppg[w]);
      } else {
        CHECK(g.dp_group_ranks() == std::vector<int>{0, 1, 2, 3});
      }
    }
    // Model-parallel group: same dp coordinate, tp × pp ranks.
    std::vector<int> mp = members(g.mp_comm());
    CHECK(static_cast<int>(mp.size()) == tp * pp);
    for (int q : mp) CHECK(g.coord_of(q).dp == g.dp_rank());
    // Embedding group: first and last stage (every rank is one of them with pp <= 2).
    REQUIRE(g.in_embedding_group());
    CHECK(members(g.embedding_comm()) == g.embedding_group_ranks());
    CHECK(static_cast<int>(g.embedding_group_ranks().size()) == (pp > 1 ? 2 : 1));
    CHECK(g.is_first_stage() == (g.pp_rank() == 0));
    CHECK(g.is_last_stage() == (g.pp_rank() == pp - 1));
    // Node-local rank: all ranks of a test run on one host.
    CHECK(g.local_size() == n);
    CHECK(g.local_rank() == w);
    CHECK(g.device_index() == (cuda_available() ? w % cuda_device_count() : -1));
  }
}

TEST_CASE("grid: a world size that tp x pp does not divide is rejected with the numbers") {
  const int n = wsize();
  GridConfig cfg;
  cfg.tp = n + 1;
  cfg.pp = 1;
  const std::string want = str("world size ", n, " is not divisible by tensor-model-parallel-size ", n + 1,
                               " x pipeline-model-parallel-size 1 = ", n + 1);
  CHECK_THROWS_WITH_AS(Grid(MPI_COMM_WORLD, cfg), doctest::Contains(want.c_str()), Error);
  cfg.tp = 2;
  cfg.pp = n;  // 2n does not divide n
  CHECK_THROWS_AS(Grid(MPI_COMM_WORLD, cfg), Error);
  cfg.tp = 0;
  CHECK_THROWS_AS(Grid(MPI_COMM_WORLD, cfg), Error);
}

TEST_CASE("grid: middle pipeline stages are in no embedding group (pp = world)") {
  const int n = wsize();
  GridConfig cfg;
  cfg.pp = n;
  Grid g(MPI_COMM_WORLD, cfg);
  const bool ends = g.pp_rank() == 0 || g.pp_rank() == n - 1;
  CHECK(g.in_embedding_group() == ends);
  if (ends) CHECK(members(g.embedding_comm()) == std::vector<int>{0, n - 1});
  // Several grids at once, destroyed in any order: no globals.
  auto g2 = std::make_unique<Grid>(MPI_COMM_WORLD, GridConfig{});
  CHECK(g2->dp_size() == n);
  g2.reset();
  CHECK(g.pp_size() == n);
}

TEST_CASE("grid: context parallelism, tp fastest, then cp, then dp, then pp; dp x cp groups") {
  const int n = wsize();
  struct L {
    int tp, cp, pp;
  };
  for (const L l : {L{1, 2, 1}, L{2, 2, 1}, L{1, 2, 2}, L{1, 4, 1}}) {
    if (n % (l.tp * l.cp * l.pp) != 0) continue;
    GridConfig cfg;
    cfg.tp = l.tp;
    cfg.cp = l.cp;
    cfg.pp = l.pp;
    Grid g(MPI_COMM_WORLD, cfg);
    const int w = g.world_rank(), dp = n / (l.tp * l.cp * l.pp);
    INFO("tp ", l.tp, " cp ", l.cp, " pp ", l.pp, ": ", g.describe());
    CHECK(g.cp_size() == l.cp);
    CHECK(g.dp_size() == dp);
    CHECK(g.tp_rank() == w % l.tp);
    CHECK(g.cp_rank() == (w / l.tp) % l.cp);
    CHECK(g.dp_rank() == (w / (l.tp * l.cp)) % dp);
    CHECK(g.pp_rank() == w / (l.tp * l.cp * dp));
    for (int q = 0; q < n; ++q) CHECK(g.rank_of(g.coord_of(q)) == q);
    CHECK(members(g.tp_comm()) == g.tp_group_ranks());
    CHECK(members(g.cp_comm()) == g.cp_group_ranks());
    CHECK(members(g.dp_comm()) == g.dp_group_ranks());
    CHECK(members(g.pp_comm()) == g.pp_group_ranks());
    CHECK(members(g.dp_cp_comm()) == g.dp_cp_group_ranks());
    CHECK(rank_in(g.cp_comm()) == g.cp_rank());
    CHECK(rank_in(g.dp_cp_comm()) == g.cp_rank() + l.cp * g.dp_rank());
    // The model-parallel group is one replica's tp x pp ranks: same dp and cp.
    const std::vector<int> mp = members(g.mp_comm());
    CHECK(static_cast<int>(mp.size()) == l.tp * l.pp);
    for (int q : mp) CHECK((g.coord_of(q).dp == g.dp_rank() && g.coord_of(q).cp == g.cp_rank()));
    if (g.in_embedding_group()) CHECK(members(g.embedding_comm()) == g.embedding_group_ranks());
    CHECK(g.describe().find(str("cp ", l.cp)) != std::string::npos);
    if (n == 4 && l.tp == 2) {  // world 4 = tp 2 x cp 2: cp groups {0,2} {1,3}
      const std::vector<int> cpg[] = {{0, 2}, {1, 3}, {0, 2}, {1, 3}};
      CHECK(g.cp_group_ranks() == cpg[w]);
      CHECK(g.dp_group_ranks() == std::vector<int>{w});
    }
    if (n == 4 && l.tp == 1 && l.cp == 2 && l.pp == 1) {  // cp 2 x dp 2: cp {0,1} {2,3}, dp {0,2} {1,3}
      const std::vector<int> cpg[] = {{0, 1}, {0, 1}, {2, 3}, {2, 3}};
      const std::vector<int> dpg[] = {{0, 2}, {1, 3}, {0, 2}, {1, 3}};
      CHECK(g.cp_group_ranks() == cpg[w]);
      CHECK(g.dp_group_ranks() == dpg[w]);
      CHECK(g.dp_cp_group_ranks() == std::vector<int>{0, 1, 2, 3});
    }
  }
  GridConfig bad;
  bad.cp = n + 1;
  CHECK_THROWS_WITH_AS(Grid(MPI_COMM_WORLD, bad), doctest::Contains("context-parallel-size"), Error);
}
