// tests/io/test_ckpt_fail.cpp — reliability: a checkpoint save that fails on
// one rank (injected at every step of the protocol, or a real full tmpfs) is
// one clear error on EVERY rank, never a hang, and loses nothing: the previous
// checkpoint and the tracker file stay loadable. Also: NaN/Inf is never
// committed, and a bad --save directory is found at start-up.
// mpitron-test: np=2
// mpitron-test: timeout=180
// mpitron-test: label=reliability
#include <doctest/doctest.h>
#include <sys/mount.h>

#include <cmath>
#include <cstdlib>
#include <fstream>

#include "io/checkpoint.h"
#include "tests/io/io_test_util.h"
#include "tests/error_of.h"  // error_of

using namespace mpitron;
using mpitron::testing_util::error_of;
using namespace mpitron::io;
using mpitron::test::ScratchDir;
using mpitron::test::world;
using mpitron::test::world_rank;
using mpitron::test::world_size;
namespace fs = std::filesystem;

namespace {

// A hang (the bug this test guards against) aborts the run in 60 s instead of
// waiting for ctest's timeout (io/io_watchdog.h reads it once, at first use).
const int kTimeout = setenv("MPITRON_COMM_TIMEOUT_S", "60", 0);

// Every rank writes its row block of a (rows_per_rank * world, cols) tensor of `seed`.
void save(const std::string& dir, int64_t it, float seed, int64_t rows_per_rank = 4, int64_t cols = 8,
          int nan_rank = -1) {
  const int64_t n = world_size(), r = world_rank();
  std::vector<float> mine(static_cast<size_t>(rows_per_rank * cols));
  for (size_t i = 0; i < mine.size(); ++i) mine[i] = seed + static_cast<float>(r) + 0.001f * static_cast<float>(i);
  if (r == nan_rank) mine[3] = NAN;
  CheckpointWriter w;
  w.begin(dir, it, world());
  w.add_raw("model/w", {rows_per_rank * n, cols}, ElemType::F32, mine.data(), {rows_per_rank * r, 0},
            {rows_per_rank, cols});
  w.set_attr_int("consumed_train_samples", it * 10);
  w.commit();
}

// The newest loadable iteration (all ranks read all of it, verified) and a check of its values.
int64_t load(const std::string& dir, float seed_of(int64_t)) {
  const int64_t n = world_size();
  std::vector<float> all(static_cast<size_t>(4 * n * 8));
  CheckpointReader r = CheckpointReader::load_latest(dir, world(), [&](const CheckpointReader& c) {
    c.read_verified({{"model/w", {{{0, 0}, {4 * n, 8}}}, all.data(), ElemType::F32, {4 * n, 8}}});
  });
  REQUIRE(r.found());
  for (int64_t rank = 0; rank < n; ++rank)
    for (int64_t i = 0; i < 32; ++i)
      CHECK(all[static_cast<size_t>(rank * 32 + i)] ==
            seed_of(r.iteration()) + static_cast<float>(rank) + 0.001f * static_cast<float>(i));
  return r.iteration();
}
float seed_of(int64_t it) { return static_cast<float>(it); }

std::string tracker(const std::string& dir) {
  std::ifstream in(fs::path(dir) / kTrackerFileName);
  std::string s;
  std::getline(in, s);
  return s;
}

// Every rank's text, so a test can check that all ranks saw an error.
int ranks_with_error(const std::string& e) {
  int mine = e.empty() ? 0 : 1, all = mine;
  if (world() != MPI_COMM_NULL) MPI_Allreduce(&mine, &all, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  return all;
}

}  // namespace

TEST_CASE("checkpoint failure: a step failing on one rank is an error on every rank; nothing is lost") {
  ScratchDir dir("ckpt_fail");
  save(dir.path(), 1, seed_of(1));
  struct Case {
    int rank;
    const char* step;
  };
  std::vector<Case> cases = {{0, "create"}, {0, "write"}, {0, "attrs"}, {0, "close"},
                             {0, "manifest"}, {0, "rename"}, {0, "tracker"}};
  if (world_size() > 1)
    for (const char* s : {"create", "write", "attrs", "close"}) cases.push_back({1, s});
  for (const Case& c : cases) {
    CAPTURE(c.step);
    CAPTURE(c.rank);
    const std::string spec = str(c.rank, ":", c.step, ":2");
    setenv("MPITRON_TEST_CKPT_FAIL", spec.c_str(), 1);
    const std::string e = error_of([&] { save(dir.path(), 2, seed_of(2)); });
    unsetenv("MPITRON_TEST_CKPT_FAIL");
    CHECK(ranks_with_error(e) == world_size());  // every rank reports it
    CHECK(e.find("injected failure of step '" + std::string(c.step) + "'") != std::string::npos);
    if (world_size() > 1) CHECK(e.find(str("[rank ", c.rank, "]")) != std::string::npos);
    CHECK(tracker(dir.path()) == "1");  // `latest` still names the previous checkpoint
    // A failed rename leaves nothing committed; a failed tracker update leaves
    // iter_2 committed but `latest` on 1, which still loads.
    CHECK(fs::exists(fs::path(dir.path()) / iteration_dir_name(2)) == (std::string(c.step) == "tracker"));
    CHECK(load(dir.path(), seed_of) == 1);
    mpitron::test::world_barrier();
    if (world_rank() == 0) fs::remove_all(fs::path(dir.path()) / iteration_dir_name(2));
    mpitron::test::world_barrier();
  }
  // Afterwards the same writer code saves normally.
  save(dir.path(), 2, seed_of(2));
  CHECK(tracker(dir.path()) == "2");
  CHECK(load(dir.path(), seed_of) == 2);
}

TEST_CASE("checkpoint failure: NaN or Inf on any rank is never committed") {
  ScratchDir dir("ckpt_nan");
  save(dir.path(), 1, seed_of(1));
  const int bad = world_size() - 1;
  const std::string e = error_of([&] { save(dir.path(), 2, seed_of(2), 4, 8, bad); });
  CHECK(ranks_with_error(e) == world_size());
  CHECK(e.find("non-finite") != std::string::npos);
  CHECK(e.find("model/w") != std::string::npos);
  CHECK(tracker(dir.path()) == "1");
  CHECK_FALSE(fs::exists(fs::path(dir.path()) / iteration_dir_name(2)));
  CHECK(load(dir.path(), seed_of) == 1);
}

TEST_CASE("checkpoint failure: a full disk (a real small tmpfs) fails the save on every rank; the previous one loads") {
  ScratchDir dir("ckpt_full");
  const std::string mnt = dir / "small";
  int mounted = 0;
  if (world_rank() == 0) {
    fs::create_directories(mnt);
    mounted = ::mount("tmpfs", mnt.c_str(), "tmpfs", 0, "size=192k") == 0 ? 1 : 0;
  }
  if (world() != MPI_COMM_NULL) MPI_Bcast(&mounted, 1, MPI_INT, 0, MPI_COMM_WORLD);
  if (!mounted) {
    MESSAGE("SKIPPED: cannot mount a tmpfs here (not root, or no CAP_SYS_ADMIN); the injected failures above cover "
            "the same paths");
    return;
  }
  save(mnt, 1, seed_of(1));  // small: fits
  // 2 ranks x 2048 x 64 floats = 1 MiB: does not fit in 192 KiB.
  const std::string e = error_of([&] { save(mnt, 2, seed_of(2), 2048, 64); });
  CHECK(ranks_with_error(e) == world_size());
  MESSAGE("full disk error: ", e.substr(0, 400));
  CHECK(tracker(mnt) == "1");
  CHECK(load(mnt, seed_of) == 1);
  mpitron::test::world_barrier();
  if (world_rank() == 0) CHECK(::umount(mnt.c_str()) == 0);
}

TEST_CASE("checkpoint failure: a --save that cannot be written is found at start-up, on every rank") {
  ScratchDir dir("ckpt_savedir");
  if (world_rank() == 0) std::ofstream(dir / "a_file") << "x";
  mpitron::test::world_barrier();
  CHECK_NOTHROW(check_save_dir_writable(dir / "new/sub", world()));
  CHECK(fs::is_directory(dir / "new/sub"));
  CHECK(fs::is_empty(dir / "new/sub"));  // the probe file is gone
  const std::string e = error_of([&] { check_save_dir_writable(dir / "a_file/sub", world()); });
  CHECK(ranks_with_error(e) == world_size());
  CHECK(e.find("a_file/sub") != std::string::npos);
}
