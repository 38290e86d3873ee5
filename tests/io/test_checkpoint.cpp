// tests/io/test_checkpoint.cpp — the checkpoint protocol in one process:
// commit visibility, crash leftovers, corruption and truncation detection with
// fallback, keep_last, hyperslab tiling checks, and h5py reading our files.
#include <doctest/doctest.h>

#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>

#include "io/checkpoint.h"
#include "io/crc32c.h"
#include "tests/io/io_test_util.h"
#include "tests/error_of.h"  // error_of

using namespace mpitron;
using mpitron::testing_util::error_of;
using namespace mpitron::io;
using mpitron::test::ScratchDir;
namespace fs = std::filesystem;

namespace {

// The tensors of a toy "model" whose values depend on `seed`.
struct Toy {
  Tensor w, b, emb, half, step, ids;
  explicit Toy(float seed) {
    std::vector<float> v(6 * 10), bv(10), ev(4 * 3), hv(5);
    for (size_t i = 0; i < v.size(); ++i) v[i] = seed + 0.01f * static_cast<float>(i);
    for (size_t i = 0; i < bv.size(); ++i) bv[i] = -seed * static_cast<float>(i);
    for (size_t i = 0; i < ev.size(); ++i) ev[i] = seed * 0.5f + static_cast<float>(i);
    for (size_t i = 0; i < hv.size(); ++i) hv[i] = seed / (1.0f + static_cast<float>(i));
    w = Tensor::from_vector(v, {6, 10});
    b = Tensor::from_vector(bv, {10});
    emb = Tensor::from_vector(ev, {4, 3}, DType::BF16);
    half = Tensor::from_vector(hv, {5}, DType::F16);
    step = Tensor::from_ints({static_cast<int64_t>(seed * 1000)}, {1}, DType::I64);
    ids = Tensor::from_ints({1, 2, 3, 65535}, {4}, DType::U16);
  }
};

void write_toy(CheckpointWriter& w, const Toy& t) {
  // w in two row blocks (as two TP ranks would), the rest whole.
  w.add_tensor("layers/0/w", {6, 10}, DType::F32, t.w.slice(0, 0, 6), {0, 0});
  w.add_tensor("layers/0/b", {10}, DType::F32, t.b);
  w.add_tensor("emb", {4, 3}, DType::BF16, t.emb);
  w.add_tensor("half", {5}, DType::F16, t.half);
  w.add_tensor("step", {1}, DType::I64, t.step);
  w.add_tensor("ids", {4}, DType::U16, t.ids);
  w.set_attr_json("flags", {{"num_layers", 1}, {"seed", 1234}});
  w.set_attr_int("consumed_train_samples", 640);
}

std::string save_toy(const std::string& dir, int64_t iteration, float seed, int keep_last = 0) {
  CheckpointWriter w;
  w.begin(dir, iteration);
  write_toy(w, Toy(seed));
  return w.commit(keep_last);
}

bool same_bytes(const Tensor& a, const Tensor& b) {
  return a.dtype() == b.dtype() && a.shape() == b.shape() && std::memcmp(a.data_ptr(), b.data_ptr(), a.nbytes()) == 0;
}

void check_toy(const CheckpointReader& r, float seed) {
  Toy t(seed);
  CHECK(same_bytes(r.read("layers/0/w"), t.w));
  CHECK(same_bytes(r.read("layers/0/b"), t.b));
  CHECK(same_bytes(r.read("emb"), t.emb));
  CHECK(same_bytes(r.read("half"), t.half));
  CHECK(same_bytes(r.read("step"), t.step));
  CHECK(same_bytes(r.read("ids"), t.ids));
}

std::string tracker(const std::string& dir) {
  std::ifstream in(fs::path(dir) / kTrackerFileName);
  std::string s;
  std::getline(in, s);
  return s;
}

std::string h5_path(const std::string& dir, int64_t it) {
  return (fs::path(dir) / iteration_dir_name(it) / kCheckpointFileName).string();
}

void flip_byte(const std::string& path, int64_t offset) {
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  REQUIRE(f);
  f.seekg(offset);
  char c = 0;
  f.read(&c, 1);
  c = static_cast<char>(c ^ 0x10);
  f.seekp(offset);
  f.write(&c, 1);
}

}  // namespace

TEST_CASE("checkpoint: save, find latest, read back tensors and attributes") {
  ScratchDir dir("ckpt_basic");
  CHECK_FALSE(CheckpointReader::open_latest(dir.path()).found());  // nothing saved yet
  const std::string final_dir = save_toy(dir.path(), 100, 1.5f);
  CHECK(final_dir == dir / "iter_0000100");
  CHECK(tracker(dir.path()) == "100");
  CHECK_FALSE(fs::exists(dir / "iter_0000100.tmp"));

  CheckpointReader r = CheckpointReader::open_latest(dir.path());
  REQUIRE(r.found());
  CHECK(r.iteration() == 100);
  CHECK(r.attr_string(kAttrFormat) == kCheckpointFormat);
  CHECK(r.attr_int(kAttrVersion) == 1);
  CHECK(r.attr_int(kAttrIteration) == 100);
  CHECK(r.attr_int("consumed_train_samples") == 640);
  CHECK(r.attr_json("flags")["seed"] == 1234);
  check_toy(r, 1.5f);
  const auto ts = r.tensors();
  REQUIRE(ts.size() == 6);
  CHECK(ts[0].name == "emb");
  CHECK(ts[0].type == ElemType::BF16);
  CHECK(r.tensor_info("layers/0/w").shape == Shape{6, 10});
  // A hyperslab read (what a TP rank does on load).
  Tensor part = r.read("layers/0/w", {2, 5}, {3, 5});
  CHECK(same_bytes(part, Toy(1.5f).w.slice(0, 2, 5).slice(1, 5, 10).contiguous()));
  // The stored checksum is CRC-32C of the whole tensor's bytes.
  Tensor w = Toy(1.5f).w;
  CHECK(r.file().attr_int("layers/0/w", kAttrDatasetCrc) == crc32c(w.data_ptr(), w.nbytes()));
}

TEST_CASE("checkpoint: nothing changes until commit; an uncommitted .tmp is ignored") {
  ScratchDir dir("ckpt_commit");
  save_toy(dir.path(), 10, 1.0f);
  {
    CheckpointWriter w;
    w.begin(dir.path(), 20);
    write_toy(w, Toy(2.0f));
    CHECK(fs::exists(dir / "iter_0000020.tmp/model_optim_rng.h5"));
    CHECK_FALSE(fs::exists(dir / "iter_0000020"));
    CHECK(tracker(dir.path()) == "10");
    CHECK(CheckpointReader::open_latest(dir.path()).iteration() == 10);
    // "crash": the writer goes away without commit()
  }
  CHECK(fs::exists(dir / "iter_0000020.tmp"));
  CHECK(CheckpointReader::list_iterations(dir.path()) == std::vector<int64_t>{10});
  CheckpointReader r = CheckpointReader::open_latest(dir.path());
  CHECK(r.iteration() == 10);
  check_toy(r, 1.0f);
  // A later save of the same iteration replaces the leftover and commits.
  save_toy(dir.path(), 20, 2.0f);
  CHECK_FALSE(fs::exists(dir / "iter_0000020.tmp"));
  CHECK(tracker(dir.path()) == "20");
  check_toy(CheckpointReader::open_latest(dir.path()), 2.0f);
  // Saving an iteration again replaces it.
  save_toy(dir.path(), 20, 3.0f);
  check_toy(CheckpointReader::open_latest(dir.path()), 3.0f);
}

TEST_CASE("checkpoint: a flipped data byte is a checksum error naming dataset and file; load falls back") {
  ScratchDir dir("ckpt_flip");
  save_toy(dir.path(), 1, 1.0f);
  save_toy(dir.path(), 2, 2.0f);
  const std::string path = h5_path(dir.path(), 2);
  int64_t off = -1;
  {
    Hdf5File f = Hdf5File::open(path);
    off = f.data_file_offset("layers/0/w");
  }
  REQUIRE(off > 0);
  flip_byte(path, off + 37);
  std::string e = error_of([&] { CheckpointReader::open_iteration(dir.path(), 2); });
  CHECK(e.find("checksum mismatch in dataset 'layers/0/w'") != std::string::npos);
  CHECK(e.find(path) != std::string::npos);
  // Opened without verification, verify(name) finds it, and only there.
  CheckpointReader r = CheckpointReader::open_iteration(dir.path(), 2, MPI_COMM_NULL, false);
  CHECK_THROWS_WITH_AS(r.verify("layers/0/w"), doctest::Contains("checksum mismatch"), Error);
  CHECK_NOTHROW(r.verify("layers/0/b"));
  // The loader skips it with a warning and takes iteration 1.
  CheckpointReader l = CheckpointReader::open_latest(dir.path());
  CHECK(l.iteration() == 1);
  check_toy(l, 1.0f);
}

TEST_CASE("checkpoint: a truncated file is a clear error; load falls back to the previous one") {
  ScratchDir dir("ckpt_trunc");
  save_toy(dir.path(), 1, 1.0f);
  for (int64_t cut : {int64_t{1}, int64_t{-1}}) {  // lose the last byte; lose half the file
    CAPTURE(cut);
    save_toy(dir.path(), 2, 2.0f);
    const std::string path = h5_path(dir.path(), 2);
    const auto size = static_cast<int64_t>(fs::file_size(path));
    fs::resize_file(path, static_cast<uintmax_t>(cut > 0 ? size - cut : size / 2));
    std::string e = error_of([&] { CheckpointReader::open_iteration(dir.path(), 2); });
    CHECK(e.find(path) != std::string::npos);
    CHECK(e.find("truncated") != std::string::npos);
    CheckpointReader l = CheckpointReader::open_latest(dir.path());
    CHECK(l.iteration() == 1);
    check_toy(l, 1.0f);
  }
  // Every checkpoint broken: a clear error, not a silent fresh start.
  fs::resize_file(h5_path(dir.path(), 1), 100);
  std::string e = error_of([&] { CheckpointReader::open_latest(dir.path()); });
  CHECK(e.find("no intact checkpoint") != std::string::npos);
}

TEST_CASE("checkpoint: tracker file missing, garbage, or naming a missing directory") {
  ScratchDir dir("ckpt_tracker");
  save_toy(dir.path(), 5, 5.0f);
  save_toy(dir.path(), 7, 7.0f);
  fs::remove(dir / kTrackerFileName);
  CHECK(CheckpointReader::read_tracker(dir.path()) == -1);
  CHECK(CheckpointReader::open_latest(dir.path()).iteration() == 7);
  { std::ofstream(dir / kTrackerFileName) << "release\n"; }
  CHECK(CheckpointReader::open_latest(dir.path()).iteration() == 7);
  { std::ofstream(dir / kTrackerFileName) << "9\n"; }  // no iter_0000009
  CHECK(CheckpointReader::open_latest(dir.path()).iteration() == 7);
  { std::ofstream(dir / kTrackerFileName) << "5\n"; }  // the tracker wins over a newer directory
  CHECK(CheckpointReader::open_latest(dir.path()).iteration() == 5);
}

TEST_CASE("checkpoint: keep_last removes older committed checkpoints only after the commit") {
  ScratchDir dir("ckpt_keep");
  for (int64_t it : {10, 20, 30}) save_toy(dir.path(), it, static_cast<float>(it), 2);
  { CheckpointWriter w; w.begin(dir.path(), 25); }  // a stale crash leftover, older than the next save
  save_toy(dir.path(), 40, 40.0f, 2);
  CHECK(CheckpointReader::list_iterations(dir.path()) == std::vector<int64_t>{30, 40});
  CHECK_FALSE(fs::exists(dir / "iter_0000025.tmp"));
  check_toy(CheckpointReader::open_latest(dir.path()), 40.0f);
}

TEST_CASE("checkpoint: commit refuses hyperslabs that do not tile a tensor") {
  ScratchDir dir("ckpt_tiling");
  Toy t(1.0f);
  {
    CheckpointWriter w;
    w.begin(dir.path(), 3);
    w.add_tensor("w", {6, 10}, DType::F32, t.w.slice(0, 0, 4).contiguous(), {0, 0});  // rows 4-5 never written
    CHECK_THROWS_WITH_AS(w.commit(), doctest::Contains("dataset 'w': no rank wrote bytes [160, 240)"), Error);
  }
  CHECK_FALSE(fs::exists(dir / "iter_0000003"));
  CHECK_FALSE(fs::exists(dir / kTrackerFileName));
  // A tensor nobody wrote at all.
  {
    CheckpointWriter w;
    w.begin(dir.path(), 4);
    w.add_tensor("b", {10}, DType::F32, t.b);
    w.add_tensor("nobody", {2, 3}, DType::F32, Tensor());
    CHECK_THROWS_WITH_AS(w.commit(), doctest::Contains("dataset 'nobody': no rank wrote bytes [0, 24)"), Error);
  }
  CHECK(CheckpointReader::list_iterations(dir.path()).empty());
}

TEST_CASE("checkpoint: h5py reads every tensor and recomputes every checksum") {
  ScratchDir dir("ckpt_h5py");
  save_toy(dir.path(), 42, 4.25f);
  Toy t(4.25f);
  nlohmann::json want;
  auto add = [&](const std::string& name, const Tensor& x) {
    nlohmann::json vals = nlohmann::json::array();
    if (is_floating(x.dtype()))
      for (float v : x.to_floats()) vals.push_back(v);
    else
      for (int64_t v : x.to_ints()) vals.push_back(v);
    want[name] = {{"dtype", dtype_name(x.dtype())}, {"shape", x.shape()}, {"values", vals}};
  };
  add("layers/0/w", t.w);
  add("layers/0/b", t.b);
  add("emb", t.emb);
  add("half", t.half);
  add("step", t.step);
  add("ids", t.ids);
  { std::ofstream(dir / "expected.json") << want.dump(); }
  mpitron::test::run_python_check("h5py_check.py", h5_path(dir.path(), 42) + " " + (dir / "expected.json"), "h5py");
}

// ---------------------------------------------------------------- one-pass verified reads

namespace {

// A dataset big enough for several 8 MiB read chunks: 1200 x 2500 f32 (12 MB).
Tensor big_tensor(float seed) {
  std::vector<float> v(1200 * 2500);
  for (size_t i = 0; i < v.size(); ++i) v[i] = seed + static_cast<float>(i % 9973) * 0.5f;
  return Tensor::from_vector(v, {1200, 2500});
}

std::string save_big(const std::string& dir, int64_t iteration, float seed) {
  CheckpointWriter w;
  w.begin(dir, iteration);
  write_toy(w, Toy(seed));
  w.add_tensor("big", {1200, 2500}, DType::F32, big_tensor(seed));
  return w.commit();
}

// The error of fn and whether it was a CheckpointDamaged.
std::pair<std::string, bool> damage_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const CheckpointDamaged& e) {
    return {e.what(), true};
  } catch (const Error& e) {
    return {e.what(), false};
  }
  return {"", false};
}

Tensor block_of(const Tensor& t, int64_t r0, int64_t r1, int64_t c0, int64_t c1) {
  return t.slice(0, r0, r1).slice(1, c0, c1).contiguous();
}

}  // namespace

TEST_CASE("checkpoint: read_verified reads split hyperslabs into the right places and verifies") {
  ScratchDir dir("ckpt_rv");
  save_big(dir.path(), 7, 3.0f);
  CheckpointReader r = CheckpointReader::open_iteration(dir.path(), 7, MPI_COMM_NULL, /*verify=*/false);
  const Toy t(3.0f);
  const Tensor big = big_tensor(3.0f);
  // layers/0/w as two column blocks of rows 1-4 in one request (pieces back to back), and the
  // same rows again whole in another request (a duplicate range).
  std::vector<float> wcols(4 * 3 + 4 * 7), wrows(4 * 10);
  // big: a block of whole rows (over several read chunks), a column block (one range per row,
  // read through a bounce buffer), and a partial row + whole rows + partial row (a ZeRO shard).
  std::vector<float> brows(600 * 2500), bcols(50 * 40);
  std::vector<float> shard(2500 - 100 + 2 * 2500 + 7);
  std::vector<uint16_t> emb(4 * 3);  // bf16 bits
  std::vector<double> b64(10);       // f32 dataset into doubles: converted by HDF5, verified by raw reads
  int64_t step = 0;
  std::vector<ReadRequest> reqs = {
      {"layers/0/w", {{{1, 0}, {4, 3}}, {{1, 3}, {4, 7}}}, wcols.data(), ElemType::F32},
      {"layers/0/w", {{{1, 0}, {4, 10}}}, wrows.data(), ElemType::F32},
      {"big", {{{300, 0}, {600, 2500}}}, brows.data(), ElemType::F32},
      {"big", {{{1000, 2400}, {50, 40}}}, bcols.data(), ElemType::F32},
      {"big", {{{10, 100}, {1, 2400}}, {{11, 0}, {2, 2500}}, {{13, 0}, {1, 7}}}, shard.data(), ElemType::F32},
      {"emb", {{{0, 0}, {4, 3}}}, emb.data(), ElemType::BF16},
      {"layers/0/b", {{{0}, {10}}}, b64.data(), ElemType::F64},
      {"step", {{{0}, {1}}}, &step, ElemType::I64},
      {"half", {{{0}, {0}}}, nullptr, ElemType::F16},  // nothing, but "requested"
  };
  // Every dataset mpitron writes is one contiguous range of native bytes (the raw read path).
  for (const char* name : {"big", "layers/0/w", "emb", "half", "step", "ids"}) {
    CAPTURE(name);
    const Hdf5File::RawExtent e = r.file().raw_extent(name);
    CHECK(e.native);
    CHECK(e.file_offset > 0);
    CHECK(e.file_offset == r.file().data_file_offset(name));
  }
  CHECK(r.file().raw_extent("big").nbytes == 1200 * 2500 * 4);
  REQUIRE_NOTHROW(r.read_verified(reqs));
  auto floats = [](const std::vector<float>& v, const Shape& s) { return Tensor::from_vector(v, s); };
  CHECK(same_bytes(floats(std::vector<float>(wcols.begin(), wcols.begin() + 12), {4, 3}), block_of(t.w, 1, 5, 0, 3)));
  CHECK(same_bytes(floats(std::vector<float>(wcols.begin() + 12, wcols.end()), {4, 7}), block_of(t.w, 1, 5, 3, 10)));
  CHECK(same_bytes(floats(wrows, {4, 10}), block_of(t.w, 1, 5, 0, 10)));
  CHECK(same_bytes(floats(brows, {600, 2500}), block_of(big, 300, 900, 0, 2500)));
  CHECK(same_bytes(floats(bcols, {50, 40}), block_of(big, 1000, 1050, 2400, 2440)));
  const float* bp = big.data<float>();
  CHECK(std::memcmp(shard.data(), bp + 10 * 2500 + 100, shard.size() * 4) == 0);
  CHECK(std::memcmp(emb.data(), t.emb.data_ptr(), emb.size() * 2) == 0);
  const std::vector<float> bv = t.b.to_floats();
  for (size_t i = 0; i < b64.size(); ++i) CHECK(b64[i] == static_cast<double>(bv[i]));
  CHECK(step == 3000);
  // Both scopes pass on an intact file; verify_all (no requests) too.
  CHECK_NOTHROW(r.read_verified(reqs, VerifyScope::RequestedDatasets));
  CHECK_NOTHROW(r.read_verified({}));
  CHECK_NOTHROW(r.verify_all());
}

TEST_CASE("checkpoint: read_verified finds a flipped byte in a part it read and in a part nobody asked for") {
  ScratchDir dir("ckpt_rv_flip");
  const std::string path = h5_path(dir.path(), 7);
  const int64_t row = 2500 * 4;  // bytes per row of "big"
  // Where to flip (byte offset inside 'big') and which scopes must notice.
  struct Case {
    const char* what;
    const char* dataset;
    int64_t offset;
    bool requested_scope_sees_it;
  };
  for (const Case& c : {Case{"inside the rows read", "big", 400 * row + 1234, true},
                        Case{"in rows of a read dataset that nobody read", "big", 1100 * row + 5, true},
                        Case{"in the last byte of a read dataset", "big", 1200 * row - 1, true},
                        Case{"in a dataset nobody read", "layers/0/w", 17, false}}) {
    CAPTURE(c.what);
    fs::remove_all(dir / "iter_0000007");
    save_big(dir.path(), 7, 3.0f);
    int64_t off = -1;
    {
      Hdf5File f = Hdf5File::open(path);
      off = f.data_file_offset(c.dataset);
    }
    REQUIRE(off > 0);
    flip_byte(path, off + c.offset);
    CheckpointReader r = CheckpointReader::open_iteration(dir.path(), 7, MPI_COMM_NULL, /*verify=*/false);
    std::vector<float> rows(600 * 2500);
    const std::vector<ReadRequest> reqs = {{"big", {{{300, 0}, {600, 2500}}}, rows.data(), ElemType::F32}};
    auto [e, damaged] = damage_of([&] { r.read_verified(reqs); });
    CHECK(damaged);
    CHECK(e.find(str("checksum mismatch in dataset '", c.dataset, "' of checkpoint file '", path, "'")) !=
          std::string::npos);
    auto [e2, damaged2] = damage_of([&] { r.read_verified(reqs, VerifyScope::RequestedDatasets); });
    CHECK(damaged2 == c.requested_scope_sees_it);
  }
}

TEST_CASE("checkpoint: load_latest falls back past a damaged checkpoint, reading each candidate once") {
  ScratchDir dir("ckpt_rv_fallback");
  int calls = 0;
  std::vector<float> big(1200 * 2500), w(60);
  auto load = [&](const CheckpointReader& r) {
    ++calls;
    r.read_verified({{"big", {{{0, 0}, {1200, 2500}}}, big.data(), ElemType::F32},
                     {"layers/0/w", {{{0, 0}, {6, 10}}}, w.data(), ElemType::F32}});
  };
  // Nothing saved: a fresh start, the callback never runs.
  CHECK_FALSE(CheckpointReader::load_latest(dir.path(), MPI_COMM_NULL, load).found());
  CHECK(calls == 0);
  save_big(dir.path(), 1, 1.0f);
  save_big(dir.path(), 2, 2.0f);
  {
    CheckpointReader r = CheckpointReader::load_latest(dir.path(), MPI_COMM_NULL, load);
    CHECK(r.iteration() == 2);
    CHECK(calls == 1);
    CHECK(std::memcmp(big.data(), big_tensor(2.0f).data_ptr(), big.size() * 4) == 0);
  }
  // Iteration 2 damaged where the loader reads: it falls back to 1 and the buffers hold 1's values.
  const std::string path = h5_path(dir.path(), 2);
  flip_byte(path, Hdf5File::open(path).data_file_offset("big") + 777777);
  calls = 0;
  {
    CheckpointReader r = CheckpointReader::load_latest(dir.path(), MPI_COMM_NULL, load);
    CHECK(r.iteration() == 1);
    CHECK(calls == 2);
    CHECK(std::memcmp(big.data(), big_tensor(1.0f).data_ptr(), big.size() * 4) == 0);
    CHECK(same_bytes(Tensor::from_vector(w, {6, 10}), Toy(1.0f).w));
    CHECK(r.attr_int("consumed_train_samples") == 640);
  }
  // A third one, truncated: skipped at open (the callback does not run for it).
  save_big(dir.path(), 3, 3.0f);
  fs::resize_file(h5_path(dir.path(), 3), fs::file_size(h5_path(dir.path(), 3)) / 2);
  calls = 0;
  CHECK(CheckpointReader::load_latest(dir.path(), MPI_COMM_NULL, load).iteration() == 1);
  CHECK(calls == 2);
  // A callback error that is not damage (a model that does not fit) propagates: no fallback.
  calls = 0;
  auto [e, damaged] = damage_of([&] {
    CheckpointReader::load_latest(dir.path(), MPI_COMM_NULL, [&](const CheckpointReader& r) {
      ++calls;
      r.read_verified({{"no/such/tensor", {{{0}, {1}}}, big.data(), ElemType::F32}});
    });
  });
  CHECK_FALSE(damaged);
  CHECK(e.find("has no dataset 'no/such/tensor'") != std::string::npos);
  CHECK(calls == 1);
  // Every checkpoint damaged: "no intact checkpoint", naming each reason.
  flip_byte(h5_path(dir.path(), 1), Hdf5File::open(h5_path(dir.path(), 1)).data_file_offset("layers/0/w") + 3);
  auto [e3, damaged3] = damage_of([&] { CheckpointReader::load_latest(dir.path(), MPI_COMM_NULL, load); });
  CHECK(e3.find("no intact checkpoint") != std::string::npos);
  CHECK(e3.find("checksum mismatch in dataset 'layers/0/w'") != std::string::npos);
  CHECK(e3.find("truncated") != std::string::npos);
}

TEST_CASE("checkpoint: read_verified reports a file cut short under an open reader as damage") {
  ScratchDir dir("ckpt_rv_short");
  save_big(dir.path(), 5, 5.0f);
  const std::string path = h5_path(dir.path(), 5);
  CheckpointReader r = CheckpointReader::open_iteration(dir.path(), 5, MPI_COMM_NULL, false);
  const int64_t off = r.file().data_file_offset("big");
  std::vector<float> rows(1200 * 2500);
  const std::vector<ReadRequest> reqs = {{"big", {{{0, 0}, {1200, 2500}}}, rows.data(), ElemType::F32}};
  (void)r.tensors();  // metadata read while the file is whole
  fs::resize_file(path, static_cast<uintmax_t>(off + (1 << 20)));
  auto [e, damaged] = damage_of([&] { r.read_verified(reqs); });
  CHECK(damaged);
  CHECK(e.find(str("checkpoint file '", path, "' ends at byte ", off + (1 << 20), ", inside dataset 'big'")) !=
        std::string::npos);
}

TEST_CASE("checkpoint: read_verified rejects bad requests with a plain error") {
  ScratchDir dir("ckpt_rv_bad");
  save_toy(dir.path(), 1, 1.0f);
  CheckpointReader r = CheckpointReader::open_iteration(dir.path(), 1, MPI_COMM_NULL, false);
  std::vector<float> buf(100);
  auto [e1, d1] = damage_of([&] { r.read_verified({{"layers/0/w", {{{5, 0}, {2, 10}}}, buf.data(), ElemType::F32}}); });
  CHECK_FALSE(d1);
  CHECK(e1.find("outside the dataset shape") != std::string::npos);
  auto [e2, d2] = damage_of([&] { r.read_verified({{"emb", {{{0, 0}, {1, 3}}}, buf.data(), ElemType::F32}}); });
  CHECK_FALSE(d2);
  CHECK(e2.find("dataset holds bf16") != std::string::npos);
  ReadRequest q{"layers/0/w", {{{0, 0}, {1, 10}}}, buf.data(), ElemType::F32, {6, 11}};
  auto [e3, d3] = damage_of([&] { r.read_verified({q}); });
  CHECK_FALSE(d3);
  CHECK(e3.find("has shape [6, 10], the reader expects [6, 11]") != std::string::npos);
  q.expect_shape = {6, 10};
  CHECK_NOTHROW(r.read_verified({q}));
}
