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

// ---------------------------------------------------------------- one-pass verified reads

namespace {

// Datasets for the read_verified tests, written in row blocks by every rank.
//   m     40 x 30  f32   read back in column blocks (one range per row)
//   c     30 x 50  f32   read back as flat ZeRO-like shards (partial row, rows, partial row)
//   r      9 x 4   bf16  read whole by every rank (replicas)
//   big 1500 x 1000 f32  read in overlapping row blocks (neighbours share 10 rows)
//   half  20 x 20  f32   rows 0-9 read by every rank, rows 10-19 by nobody
//   unread 20 x 20 f32   never requested
struct RvSet {
  Tensor m, c, r, big, half, unread;
  explicit RvSet(float seed)
      : m(global_tensor(40, 30, seed)),
        c(global_tensor(30, 50, seed + 1)),
        r(global_tensor(9, 4, seed + 2, DType::BF16)),
        big(global_tensor(1500, 1000, seed + 3)),
        half(global_tensor(20, 20, seed + 4)),
        unread(global_tensor(20, 20, seed + 5)) {}
};

void save_rv(const std::string& dir, int64_t it, float seed) {
  const int r = world_rank(), n = world_size();
  const RvSet s(seed);
  CheckpointWriter w;
  w.begin(dir, it, MPI_COMM_WORLD);
  for (auto [name, t] : {std::pair<const char*, Tensor>{"m", s.m}, {"c", s.c}, {"r", s.r}, {"big", s.big},
                         {"half", s.half}, {"unread", s.unread}}) {
    auto [b, e] = block(t.shape()[0], r, n);
    w.add_tensor(name, t.shape(), t.dtype(), t.slice(0, b, e).contiguous(), {b, 0});
  }
  w.commit();
}

// What one rank reads, and the buffers it reads into.
struct RvRead {
  int64_t mb = 0, me = 0, cb = 0, ce = 0, bb = 0, be = 0;
  std::vector<float> m, c, big, half;
  std::vector<uint16_t> r;
  std::vector<ReadRequest> reqs;
  RvRead() {
    const int k = world_rank(), n = world_size();
    std::tie(mb, me) = block(30, k, n);  // columns of m
    m.assign(static_cast<size_t>(40 * (me - mb)), 0.0f);
    std::tie(cb, ce) = block(30 * 50, k, n);  // flat elements of c
    c.assign(static_cast<size_t>(ce - cb), 0.0f);
    auto [b0, e0] = block(1500, k, n);  // rows of big, widened by 10 on each side
    bb = std::max<int64_t>(0, b0 - 10);
    be = std::min<int64_t>(1500, e0 + 10);
    big.assign(static_cast<size_t>((be - bb) * 1000), 0.0f);
    half.assign(10 * 20, 0.0f);
    r.assign(9 * 4, 0);
    if (me > mb) reqs.push_back({"m", {{{0, mb}, {40, me - mb}}}, m.data(), ElemType::F32});
    std::vector<Hdf5File::Hyperslab> cp;  // flat range [cb, ce) of a 30 x 50 array as rectangles
    for (int64_t i = cb; i < ce;) {
      const int64_t row = i / 50, col = i % 50;
      if (col != 0 || ce - i < 50) {
        const int64_t len = std::min(50 - col, ce - i);
        cp.push_back({{row, col}, {1, len}});
        i += len;
      } else {
        const int64_t rows = (ce - i) / 50;
        cp.push_back({{row, 0}, {rows, 50}});
        i += rows * 50;
      }
    }
    reqs.push_back({"c", cp, c.data(), ElemType::F32});
    reqs.push_back({"r", {{{0, 0}, {9, 4}}}, r.data(), ElemType::BF16});
    reqs.push_back({"big", {{{bb, 0}, {be - bb, 1000}}}, big.data(), ElemType::F32});
    reqs.push_back({"half", {{{0, 0}, {10, 20}}}, half.data(), ElemType::F32});
  }
  // The buffers hold the values of RvSet(seed).
  bool holds(float seed) const {
    const RvSet s(seed);
    auto eq = [](const void* a, const Tensor& t) { return std::memcmp(a, t.data_ptr(), t.nbytes()) == 0; };
    bool ok = eq(m.data(), s.m.slice(1, mb, me).contiguous()) && eq(r.data(), s.r) &&
              eq(big.data(), s.big.slice(0, bb, be).contiguous()) && eq(half.data(), s.half.slice(0, 0, 10).contiguous());
    ok = ok && std::memcmp(c.data(), s.c.data<float>() + cb, c.size() * 4) == 0;
    return ok;
  }
};

// The error text of fn, whether it was CheckpointDamaged, and whether every rank got the same text.
struct RankErr {
  std::string text;
  bool damaged = false, same_everywhere = false;
};
RankErr rank_error(const std::function<void()>& fn) {
  RankErr e;
  try {
    fn();
  } catch (const CheckpointDamaged& x) {
    e = {x.message(), true, false};
  } catch (const Error& x) {
    e = {x.message(), false, false};
  }
  unsigned long long h = std::hash<std::string>()(e.text), lo = h, hi = h;
  MPI_Allreduce(MPI_IN_PLACE, &lo, 1, MPI_UNSIGNED_LONG_LONG, MPI_MIN, MPI_COMM_WORLD);
  MPI_Allreduce(MPI_IN_PLACE, &hi, 1, MPI_UNSIGNED_LONG_LONG, MPI_MAX, MPI_COMM_WORLD);
  e.same_everywhere = lo == hi;
  return e;
}

bool all_ranks(bool v) {
  int x = v ? 1 : 0;
  MPI_Allreduce(MPI_IN_PLACE, &x, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  return x == 1;
}

void flip_on_rank0(const std::string& path, const std::string& dataset, int64_t offset) {
  if (world_rank() == 0) {
    const int64_t base = Hdf5File::open(path).data_file_offset(dataset);
    std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(base + offset);
    char c = 0;
    f.read(&c, 1);
    c = static_cast<char>(c ^ 0x04);
    f.seekp(base + offset);
    f.write(&c, 1);
  }
  world_barrier();
}

}  // namespace

TEST_CASE("read_verified mpi: each rank reads its own split (not the writer's); replicas; the file is verified") {
  REQUIRE(mpi_running());
  ScratchDir dir("rv_mpi");
  save_rv(dir.path(), 10, 1.0f);
  CheckpointReader rd = CheckpointReader::open_latest(dir.path(), MPI_COMM_WORLD, /*verify=*/false);
  RvRead mine;
  RankErr e = rank_error([&] { rd.read_verified(mine.reqs); });
  CHECK(e.text == "");
  CHECK(mine.holds(1.0f));
  CHECK(all_ranks(mine.holds(1.0f)));
  // Ranks with nothing to read take part too; verify_all is the same call with no requests.
  const std::vector<ReadRequest> none;
  CHECK(rank_error([&] { rd.read_verified(world_rank() == 0 ? mine.reqs : none); }).text == "");
  CHECK(rank_error([&] { rd.verify_all(); }).text == "");
  // A bad request on one rank is a plain error on every rank (and nobody hangs).
  std::vector<ReadRequest> bad = mine.reqs;
  if (world_rank() == world_size() - 1) bad.push_back({"m", {{{39, 0}, {2, 30}}}, mine.m.data(), ElemType::F32});
  RankErr b = rank_error([&] { rd.read_verified(bad); });
  CHECK_FALSE(b.damaged);
  CHECK(b.same_everywhere);
  CHECK(b.text.find("outside the dataset shape") != std::string::npos);
}

TEST_CASE("read_verified mpi: a flipped byte is found on every rank, read by one rank or by none; load falls back") {
  REQUIRE(mpi_running());
  ScratchDir dir("rv_mpi_flip");
  const int n = world_size();
  const std::string path = dir / "iter_0000002/model_optim_rng.h5";
  struct Case {
    const char* what;
    const char* dataset;
    int64_t offset;
  };
  for (const Case& c : {Case{"in the last rows of big, read only by the last rank", "big", 1499 * 4000 + 100},
                        Case{"in the first row of big, read only by rank 0", "big", 8},
                        Case{"in a column block of m", "m", 39 * 120 + 4 * (30 * (n - 1) / n)},
                        Case{"in rows of half that nobody reads", "half", 15 * 80 + 8},
                        Case{"in a dataset nobody reads", "unread", 0}}) {
    CAPTURE(c.what);
    if (world_rank() == 0) {
      fs::remove_all(dir / "iter_0000001");
      fs::remove_all(dir / "iter_0000002");
    }
    world_barrier();
    save_rv(dir.path(), 1, 1.0f);
    save_rv(dir.path(), 2, 2.0f);
    flip_on_rank0(path, c.dataset, c.offset);

    CheckpointReader rd = CheckpointReader::open_iteration(dir.path(), 2, MPI_COMM_WORLD, /*verify=*/false);
    RvRead mine;
    RankErr e = rank_error([&] { rd.read_verified(mine.reqs); });
    CHECK(e.damaged);
    CHECK(all_ranks(e.damaged));
    CHECK(e.same_everywhere);
    CHECK(e.text.find(str("checksum mismatch in dataset '", c.dataset, "' of checkpoint file '", path, "'")) !=
          std::string::npos);

    // The loader falls back to iteration 1 on every rank, through the same path.
    int calls = 0;
    RvRead loaded;
    CheckpointReader l = CheckpointReader::load_latest(dir.path(), MPI_COMM_WORLD, [&](const CheckpointReader& r) {
      ++calls;
      r.read_verified(loaded.reqs);
    });
    CHECK(l.iteration() == 1);
    CHECK(calls == 2);
    CHECK(all_ranks(loaded.holds(1.0f)));
  }
}
