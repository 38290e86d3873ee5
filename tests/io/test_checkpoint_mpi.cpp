// tests/io/test_checkpoint_mpi.cpp — collective HDF5 writes and the checkpoint
// protocol with several ranks: row, column and block hyperslabs of one dataset,
// ranks with nothing to write, checksums independent of the split, distributed
// verification, and h5py reading the result.
// mpitron-test: np=2,4
// mpitron-test: timeout=300
#include <doctest/doctest.h>

#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>

#include "io/checkpoint.h"
#include "io/crc32c.h"
#include "tests/io/io_test_util.h"

using namespace mpitron;
using namespace mpitron::io;
using namespace mpitron::test;
namespace fs = std::filesystem;

namespace {

// The global tensor every test splits: G[i][j] = 100 i + j + seed.
Tensor global_tensor(int64_t rows, int64_t cols, float seed, DType dtype = DType::F32) {
  std::vector<float> v(static_cast<size_t>(rows * cols));
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < cols; ++j) v[static_cast<size_t>(i * cols + j)] = 100.0f * i + j + seed;
  return Tensor::from_vector(v, {rows, cols}, dtype);
}

// Block [begin, end) of n items for part p of k (uneven, possibly empty).
std::pair<int64_t, int64_t> block(int64_t n, int p, int k) {
  return {n * p / k, n * (p + 1) / k};
}

bool same_bytes(const Tensor& a, const Tensor& b) {
  return a.dtype() == b.dtype() && a.shape() == b.shape() && std::memcmp(a.data_ptr(), b.data_ptr(), a.nbytes()) == 0;
}

}  // namespace

TEST_CASE("hdf5 mpi: ranks write row blocks of one dataset collectively, read back whole") {
  REQUIRE(mpi_running());
  ScratchDir dir("h5_mpi");
  const int r = world_rank(), n = world_size();
  const std::string path = dir / "rows.h5";
  const Tensor g = global_tensor(7, 5, 0.5f), small = global_tensor(n - 1, 5, 9.0f);
  {
    Hdf5File f = Hdf5File::create(path, MPI_COMM_WORLD);
    CHECK(f.parallel());
    f.create_dataset("rows", {7, 5}, ElemType::F32);
    auto [b, e] = block(7, r, n);
    f.write("rows", {b, 0}, g.slice(0, b, e).contiguous());
    // n-1 rows among n ranks: the last rank has nothing and takes part with an empty selection.
    f.create_dataset("short", {n - 1, 5}, ElemType::F32);
    if (r < n - 1)
      f.write("short", {r, 0}, small.slice(0, r, r + 1).contiguous());
    else
      f.write("short", {}, Tensor());
    f.set_attr_int("/", "ranks", n);
    f.close();
  }
  Hdf5File f = Hdf5File::open(path, false, MPI_COMM_WORLD);
  CHECK(same_bytes(f.read("rows"), g));
  CHECK(same_bytes(f.read("short"), small));
  CHECK(f.attr_int("/", "ranks") == n);
}

TEST_CASE("checkpoint mpi: split layouts, layout-independent checksums, distributed verify, reload") {
  REQUIRE(mpi_running());
  ScratchDir dir("ckpt_mpi");
  const int r = world_rank(), n = world_size();
  const Tensor cols = global_tensor(6, 10, 1.0f);                 // split by columns (row-parallel linear)
  const Tensor rows = global_tensor(9, 4, 2.0f, DType::BF16);     // split by rows (column-parallel linear)
  const Tensor blocks = global_tensor(8, 6, 3.0f);                // 2-D blocks: rank grid 2 x n/2
  const Tensor repl = global_tensor(3, 3, 4.0f, DType::F16);      // replicated, rank 0 writes
  const Tensor dup = global_tensor(2, 5, 5.0f);                   // every rank writes the same values
  {
    CheckpointWriter w;
    w.begin(dir.path(), 1000, MPI_COMM_WORLD);
    auto [cb, ce] = block(10, r, n);
    w.add_tensor("cols", {6, 10}, DType::F32, cols.slice(1, cb, ce).contiguous(), {0, cb});
    auto [rb, re] = block(9, r, n);
    w.add_tensor("rows", {9, 4}, DType::BF16, rows.slice(0, rb, re).contiguous(), {rb, 0});
    const int gr = r % 2, gc = r / 2, ncol = (n + 1) / 2;
    auto [bb, be] = block(8, gr, 2);
    auto [kb, ke] = block(6, gc, ncol);
    w.add_tensor("blocks", {8, 6}, DType::F32, blocks.slice(0, bb, be).slice(1, kb, ke).contiguous(), {bb, kb});
    w.add_replicated("repl", repl);
    w.add_tensor("dup", {2, 5}, DType::F32, dup);
    // Per-rank state (RNG): row r of a (world, 4) tensor.
    w.add_tensor("rng", {n, 4}, DType::I64, Tensor::from_ints({r, r * 10, r * 100, -r}, {1, 4}, DType::I64), {r, 0});
    w.set_attr_json("flags", {{"tp", n}});
    CHECK(w.commit() == dir / "iter_0001000");
  }
  // Visible to every rank once commit returns.
  CHECK(CheckpointReader::read_tracker(dir.path()) == 1000);
  CheckpointReader rd = CheckpointReader::open_latest(dir.path(), MPI_COMM_WORLD);  // verifies, shared among ranks
  REQUIRE(rd.found());
  CHECK(rd.iteration() == 1000);
  CHECK(rd.attr_int(kAttrWorldSize) == n);
  CHECK(same_bytes(rd.read("cols"), cols));
  CHECK(same_bytes(rd.read("rows"), rows));
  CHECK(same_bytes(rd.read("blocks"), blocks));
  CHECK(same_bytes(rd.read("repl"), repl));
  CHECK(same_bytes(rd.read("dup"), dup));
  CHECK(rd.read("rng", {r, 0}, {1, 4}).to_ints() == std::vector<int64_t>{r, r * 10, r * 100, -r});
  // The checksum is CRC-32C of the whole tensor, whatever the split.
  for (auto [name, t] : {std::pair<const char*, Tensor>{"cols", cols}, {"rows", rows}, {"blocks", blocks},
                         {"repl", repl}, {"dup", dup}}) {
    CAPTURE(name);
    CHECK(rd.file().attr_int(name, kAttrDatasetCrc) == crc32c(t.data_ptr(), t.nbytes()));
  }
  // Each rank alone (serial driver, as a different parallel layout would) reads it too.
  CheckpointReader solo = CheckpointReader::open_iteration(dir.path(), 1000, MPI_COMM_NULL, true);
  CHECK(same_bytes(solo.read("cols", {2, 3}, {4, 5}), cols.slice(0, 2, 6).slice(1, 3, 8).contiguous()));

  if (r == 0) {
    nlohmann::json want;
    for (auto [name, t] : {std::pair<const char*, Tensor>{"cols", cols}, {"rows", rows}, {"blocks", blocks},
                           {"repl", repl}, {"dup", dup}}) {
      nlohmann::json vals = nlohmann::json::array();
      for (float v : t.to_floats()) vals.push_back(v);
      want[name] = {{"dtype", dtype_name(t.dtype())}, {"shape", t.shape()}, {"values", vals}};
    }
    nlohmann::json rng = nlohmann::json::array();
    for (int k = 0; k < n; ++k) rng.insert(rng.end(), {k, k * 10, k * 100, -k});
    want["rng"] = {{"dtype", "i64"}, {"shape", {n, 4}}, {"values", rng}};
    { std::ofstream(dir / "expected.json") << want.dump(); }
    run_python_check("h5py_check.py", (dir / "iter_0001000/model_optim_rng.h5") + " " + (dir / "expected.json"),
                     "h5py");
  }
  world_barrier();
}

TEST_CASE("checkpoint mpi: overlapping different data is one error on every rank; nothing committed") {
  REQUIRE(mpi_running());
  ScratchDir dir("ckpt_mpi_bad");
  const int r = world_rank();
  CheckpointWriter w;
  w.begin(dir.path(), 5, MPI_COMM_WORLD);
  // Every rank writes the whole tensor, each with different values.
  w.add_tensor("w", {2, 3}, DType::F32, global_tensor(2, 3, static_cast<float>(r)));
  if (world_size() > 1)
    CHECK_THROWS_WITH_AS(w.commit(), doctest::Contains("two ranks wrote different data"), Error);
  else
    CHECK_NOTHROW(w.commit());
  world_barrier();
  CHECK(fs::exists(dir / "iter_0000005") == (world_size() == 1));
}

TEST_CASE("checkpoint mpi: a corrupt newest checkpoint makes every rank fall back together") {
  REQUIRE(mpi_running());
  ScratchDir dir("ckpt_mpi_flip");
  const int r = world_rank(), n = world_size();
  for (int64_t it : {1, 2}) {
    const Tensor g = global_tensor(4, 8, static_cast<float>(it));
    CheckpointWriter w;
    w.begin(dir.path(), it, MPI_COMM_WORLD);
    for (const char* name : {"a", "b", "c", "d", "e"}) {  // several datasets: verification is shared out
      auto [b, e] = block(8, r, n);
      w.add_tensor(name, {4, 8}, DType::F32, g.slice(1, b, e).contiguous(), {0, b});
    }
    w.commit();
  }
  if (r == 0) {
    const std::string path = dir / "iter_0000002/model_optim_rng.h5";
    int64_t off = Hdf5File::open(path).data_file_offset("d");
    std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(off + 3);
    f.put('\x7f');
  }
  world_barrier();
  CheckpointReader rd = CheckpointReader::open_latest(dir.path(), MPI_COMM_WORLD);
  CHECK(rd.iteration() == 1);
  CHECK(same_bytes(rd.read("d"), global_tensor(4, 8, 1.0f)));
}
