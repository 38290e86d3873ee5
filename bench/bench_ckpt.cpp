// bench/bench_ckpt.cpp — checkpoint save/load throughput against the disk's
// sequential ceiling, measured in the same run and the same directory.
//
//   bench_ckpt [--scale S] [--reps N] [--dir DIR] [--json FILE] [--no-drop] [--keep]
//   mpirun -np N bench_ckpt ...          (each rank writes/reads a row block)
//
// Tensor set: the parameters of GPT-2 124M (vocab padded to 50304, 1024
// positions, 12 layers, hidden 768) three times over, as f32: master weights
// and the two Adam moments, ~1.49 GB at --scale 1. --scale multiplies the
// first dimension of every tensor (so 0.1 is ~150 MB).
//
// Started without mpirun the benchmark runs one process with HDF5's serial
// driver (MPI_COMM_NULL); under mpirun every rank takes part through MPI-IO
// and writes, then reads, a block of rows of every tensor.
//
// Per repetition (every phase barrier to barrier, GB/s = checkpoint bytes
// (1e9) over wall time):
//   ceiling write  rank 0 alone: write() of the same number of bytes in 8 MiB
//                  chunks to one file in DIR, then fsync (others wait);
//   ceiling read   rank 0 alone: read() of that file in 8 MiB chunks, after
//                  dropping the page cache; both ceilings are measured before
//                  the save and again after the loads and the faster kept
//                  (the disk is shared with whatever else runs);
//   save           begin + add_tensor (every tensor) + commit (checksums,
//                  MPI_File_sync, fsync, rename, tracker);
//   load           THE number the requirement is about: what resuming a run
//                  costs. Page cache dropped, then CheckpointReader::load_latest
//                  whose callback has every rank read_verified() its own row
//                  blocks: the file is read once in total, each rank's reads
//                  are checksummed as they land and every dataset's CRC-32C is
//                  proved (ranges no rank asked for would be dealt out and read
//                  too) before load_latest returns;
//   load-2pass     the older way, for comparison: page cache dropped,
//                  open_latest(verify=true) (a verification pass that reads the
//                  whole file, dealt out to the ranks in file order) and then
//                  read_raw (H5Dread) of every rank's row blocks again: the
//                  file is read twice (the second time mostly from the page
//                  cache). (Before read_verified existed, this was "load",
//                  and its verification pass read whole datasets largest
//                  first through HDF5: 0.42 x ceiling read at 1 rank);
//   load-nv        page cache dropped, open_latest(verify=false) + read_raw of
//                  the row blocks: HDF5's raw read path with NO verification
//                  (what the disk and HDF5 give without checksums).
// Ratios: save/wr = save / ceiling write; load/rd, 2p/rd, nv/rd = load,
// load-2pass, load-nv / ceiling read. The requirement is save/wr >= 0.5 and
// load/rd >= 0.5. Dropping the page cache writes 3 to /proc/sys/vm/drop_caches
// (root only); when that fails, or with --no-drop, reads are warm and the
// table says so. Every load is checked byte for byte against what was written
// in the first repetition. The table shows the median of the repetitions;
// --json writes every repetition and the medians.
#include <fcntl.h>
#include <mpi.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "io/checkpoint.h"

using namespace mpitron;
using namespace mpitron::io;
namespace fs = std::filesystem;

namespace {

struct Options {
  double scale = 0.5;
  int reps = 1;
  std::string dir, json;
  bool drop = true, keep = false;
};

struct Spec {
  std::string name;
  Shape shape;  // global
};

// GPT-2 124M parameters (weights stored [out, in] as the model does), one set
// per optimizer copy: "master/", "exp_avg/", "exp_avg_sq/".
std::vector<Spec> gpt2_124m(double scale) {
  const int64_t V = 50304, P = 1024, L = 12, H = 768;
  auto rows = [&](int64_t r) { return std::max<int64_t>(1, static_cast<int64_t>(r * scale + 0.5)); };
  std::vector<Spec> one;
  one.push_back({"wte", {rows(V), H}});
  one.push_back({"wpe", {rows(P), H}});
  for (int64_t l = 0; l < L; ++l) {
    const std::string p = str("layers/", l, "/");
    one.push_back({p + "ln1_w", {rows(H)}});
    one.push_back({p + "ln1_b", {rows(H)}});
    one.push_back({p + "qkv_w", {rows(3 * H), H}});
    one.push_back({p + "qkv_b", {rows(3 * H)}});
    one.push_back({p + "proj_w", {rows(H), H}});
    one.push_back({p + "proj_b", {rows(H)}});
    one.push_back({p + "ln2_w", {rows(H)}});
    one.push_back({p + "ln2_b", {rows(H)}});
    one.push_back({p + "fc_w", {rows(4 * H), H}});
    one.push_back({p + "fc_b", {rows(4 * H)}});
    one.push_back({p + "fc_proj_w", {rows(H), 4 * H}});
    one.push_back({p + "fc_proj_b", {rows(H)}});
  }
  one.push_back({"lnf_w", {rows(H)}});
  one.push_back({"lnf_b", {rows(H)}});
  std::vector<Spec> all;
  for (const char* copy : {"master/", "exp_avg/", "exp_avg_sq/"})
    for (const Spec& s : one) all.push_back({copy + s.name, s.shape});
  return all;
}

// This rank's row block of a tensor: offset and count in the global shape.
struct Slab {
  Shape offset, count;
  Tensor data;  // f32, contiguous, count's shape (undefined when the block is empty)
};

Slab slab_of(const Spec& s, int rank, int nranks) {
  const int64_t n = s.shape[0], b = n * rank / nranks, e = n * (rank + 1) / nranks;
  Slab sl;
  sl.offset = s.shape;
  sl.count = s.shape;
  for (auto& v : sl.offset) v = 0;
  sl.offset[0] = b;
  sl.count[0] = e - b;
  return sl;
}

void fill(Tensor& t, uint64_t seed) {
  float* p = t.data<float>();
  uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
  for (int64_t i = 0, n = t.numel(); i < n; ++i) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    p[i] = static_cast<float>(x >> 40) / 16777216.0f * 2.0f - 1.0f;
  }
}

double now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

struct World {
  MPI_Comm comm = MPI_COMM_NULL;  // MPI_COMM_NULL: one process, serial HDF5
  int rank = 0, size = 1;
  void barrier() const {
    if (comm != MPI_COMM_NULL) MPI_Barrier(comm);
  }
  template <typename T> void bcast(T& v) const {
    if (comm != MPI_COMM_NULL) MPI_Bcast(&v, sizeof(T), MPI_BYTE, 0, comm);
  }
};

// Rank 0 syncs and drops the page cache; true on every rank when it worked.
bool drop_caches(const World& w, bool enabled) {
  int ok = 0;
  if (w.rank == 0 && enabled) {
    ::sync();
    const int fd = ::open("/proc/sys/vm/drop_caches", O_WRONLY);
    if (fd >= 0) {
      ok = ::write(fd, "3\n", 2) == 2;
      ::close(fd);
    }
  }
  w.bcast(ok);
  return ok != 0;
}

constexpr size_t kChunk = size_t(8) << 20;

// Sequential write() + fsync of `bytes` to `path`; seconds.
double ceiling_write(const std::string& path, uint64_t bytes, const std::vector<char>& buf) {
  const double t0 = now();
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  MPT_CHECK(fd >= 0, str("cannot create ", path, ": ", std::strerror(errno)), "");
  for (uint64_t done = 0; done < bytes;) {
    const size_t n = static_cast<size_t>(std::min<uint64_t>(kChunk, bytes - done));
    const ssize_t w = ::write(fd, buf.data(), n);
    MPT_CHECK(w > 0, str("write ", path, ": ", std::strerror(errno)), "");
    done += static_cast<uint64_t>(w);
  }
  MPT_CHECK(::fsync(fd) == 0, str("fsync ", path, ": ", std::strerror(errno)), "");
  ::close(fd);
  return now() - t0;
}

double ceiling_read(const std::string& path, std::vector<char>& buf) {
  const double t0 = now();
  const int fd = ::open(path.c_str(), O_RDONLY);
  MPT_CHECK(fd >= 0, str("cannot open ", path, ": ", std::strerror(errno)), "");
  while (true) {
    const ssize_t r = ::read(fd, buf.data(), kChunk);
    MPT_CHECK(r >= 0, str("read ", path, ": ", std::strerror(errno)), "");
    if (r == 0) break;
  }
  ::close(fd);
  return now() - t0;
}

struct Rep {
  double ceil_write_s = 0, ceil_read_s = 0;
  double save_s = 0, save_commit_s = 0;
  double load_s = 0, load_2pass_s = 0, load_verify_s = 0, load_noverify_s = 0;
  bool read_cold = false;
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

int run(const Options& opt, const World& w) {
  const std::vector<Spec> specs = gpt2_124m(opt.scale);
  uint64_t total = 0;
  for (const Spec& s : specs) total += static_cast<uint64_t>(shape_numel(s.shape)) * 4;

  std::string dir = opt.dir;
  if (dir.empty()) {
    long long id = static_cast<long long>(::getpid());
    w.bcast(id);
    dir = (fs::temp_directory_path() / str("mpitron_bench_ckpt_", id)).string();
  }
  const std::string ckpt_dir = (fs::path(dir) / "ckpt").string();
  const std::string ceil_path = (fs::path(dir) / "ceiling.bin").string();
  if (w.rank == 0) {
    fs::remove_all(ckpt_dir);
    fs::create_directories(dir);
  }
  w.barrier();

  // This rank's row blocks, filled once (not timed), and buffers to read into.
  std::vector<Slab> mine, back;
  uint64_t local_bytes = 0;
  for (size_t i = 0; i < specs.size(); ++i) {
    Slab s = slab_of(specs[i], w.rank, w.size), b = s;
    if (s.count[0] > 0) {
      s.data = Tensor::empty(s.count, DType::F32);
      fill(s.data, i * 1000003ull + static_cast<uint64_t>(s.offset[0]));
      b.data = Tensor::empty(s.count, DType::F32);
      std::memset(b.data.data_ptr(), 0, b.data.nbytes());  // touch it now: loads into existing buffers
      local_bytes += s.data.nbytes();
    }
    mine.push_back(std::move(s));
    back.push_back(std::move(b));
  }
  std::vector<char> buf(kChunk, 'x');
  for (size_t i = 0; i < buf.size(); ++i) buf[i] = static_cast<char>(i * 131 + (i >> 12));

  if (w.rank == 0)
    std::printf("bench_ckpt: %zu tensors, %.3f GB (GPT-2 124M x3 f32, scale %g), %d rank%s (%s), %d rep%s, dir %s\n",
                specs.size(), total / 1e9, opt.scale, w.size, w.size == 1 ? "" : "s",
                w.comm == MPI_COMM_NULL ? "serial HDF5" : "MPI-IO", opt.reps, opt.reps == 1 ? "" : "s",
                dir.c_str());

  auto read_back = [&](const CheckpointReader& rd) {
    for (size_t i = 0; i < specs.size(); ++i)
      if (mine[i].count[0] > 0)
        rd.read_raw(specs[i].name, mine[i].offset, mine[i].count, back[i].data.data_ptr(), ElemType::F32);
  };
  // The one-pass verified load: this rank's row block of every tensor.
  auto read_back_verified = [&](const CheckpointReader& rd) {
    std::vector<ReadRequest> reqs;
    for (size_t i = 0; i < specs.size(); ++i)
      if (mine[i].count[0] > 0)
        reqs.push_back(ReadRequest{specs[i].name, {{mine[i].offset, mine[i].count}}, back[i].data.data_ptr(),
                                   ElemType::F32});
    rd.read_verified(reqs);
  };
  auto clear_back = [&] {
    for (Slab& b : back)
      if (b.data.defined()) std::memset(b.data.data_ptr(), 0, b.data.nbytes());
  };
  auto check_back = [&](const char* what) {
    int bad = 0;
    for (size_t i = 0; i < specs.size(); ++i)
      if (mine[i].count[0] > 0 &&
          std::memcmp(mine[i].data.data_ptr(), back[i].data.data_ptr(), mine[i].data.nbytes()) != 0)
        bad = 1;
    if (w.comm != MPI_COMM_NULL) MPI_Allreduce(MPI_IN_PLACE, &bad, 1, MPI_INT, MPI_MAX, w.comm);
    MPT_CHECK(!bad, str(what, ": data read back differ from what was saved"), "");
  };

  std::vector<Rep> reps;
  bool all_cold = true;
  for (int rep = 0; rep < opt.reps; ++rep) {
    Rep r;
    // ---- ceiling: rank 0 alone, sequential; measured before the save and
    // after the loads, the faster of the two kept (the disk is shared) ----
    auto ceiling = [&] {
      w.barrier();
      double ws = 0, rs = 0;
      if (w.rank == 0) ws = ceiling_write(ceil_path, total, buf);
      w.barrier();
      r.read_cold = drop_caches(w, opt.drop) && (r.ceil_write_s == 0 || r.read_cold);
      if (w.rank == 0) {
        rs = ceiling_read(ceil_path, buf);
        fs::remove(ceil_path);
      }
      w.bcast(ws);
      w.bcast(rs);
      r.ceil_write_s = r.ceil_write_s == 0 ? ws : std::min(r.ceil_write_s, ws);
      r.ceil_read_s = r.ceil_read_s == 0 ? rs : std::min(r.ceil_read_s, rs);
    };
    ceiling();

    // ---- save ----
    w.barrier();
    double t0 = now();
    {
      CheckpointWriter wr;
      wr.begin(ckpt_dir, rep + 1, w.comm);
      for (size_t i = 0; i < specs.size(); ++i)
        wr.add_tensor(specs[i].name, specs[i].shape, DType::F32, mine[i].data, mine[i].offset);
      const double tc = now();
      wr.commit(/*keep_last=*/1);
      w.barrier();
      r.save_commit_s = now() - tc;
    }
    r.save_s = now() - t0;

    // ---- load: one pass, verified (load_latest + read_verified) ----
    if (rep == 0) clear_back();
    r.read_cold = drop_caches(w, opt.drop) && r.read_cold;
    w.barrier();
    t0 = now();
    {
      CheckpointReader rd = CheckpointReader::load_latest(ckpt_dir, w.comm, read_back_verified);
      MPT_CHECK(rd.found() && rd.iteration() == rep + 1, str("loaded iteration ", rd.iteration()), "");
      w.barrier();
      r.load_s = now() - t0;
    }
    if (rep == 0) check_back("load");

    // ---- load-2pass: open_latest(verify=true), then read own blocks again ----
    if (rep == 0) clear_back();
    r.read_cold = drop_caches(w, opt.drop) && r.read_cold;
    w.barrier();
    t0 = now();
    {
      CheckpointReader rd = CheckpointReader::open_latest(ckpt_dir, w.comm, /*verify=*/true);
      w.barrier();
      r.load_verify_s = now() - t0;
      MPT_CHECK(rd.found() && rd.iteration() == rep + 1, str("loaded iteration ", rd.iteration()), "");
      read_back(rd);
      w.barrier();
      r.load_2pass_s = now() - t0;
    }
    if (rep == 0) check_back("load-2pass");

    // ---- load without verification ----
    if (rep == 0) clear_back();
    r.read_cold = drop_caches(w, opt.drop) && r.read_cold;
    w.barrier();
    t0 = now();
    {
      CheckpointReader rd = CheckpointReader::open_latest(ckpt_dir, w.comm, /*verify=*/false);
      read_back(rd);
      w.barrier();
      r.load_noverify_s = now() - t0;
    }
    if (rep == 0) check_back("load-nv");
    ceiling();
    all_cold = all_cold && r.read_cold;
    reps.push_back(r);
  }

  // ---- report ----
  auto gbps = [&](double s) { return s > 0 ? total / s / 1e9 : 0.0; };
  std::vector<double> sv, lv, tv, nv, cw, cr, sc, lvf;
  for (const Rep& r : reps) {
    sv.push_back(gbps(r.save_s));
    lv.push_back(gbps(r.load_s));
    tv.push_back(gbps(r.load_2pass_s));
    nv.push_back(gbps(r.load_noverify_s));
    cw.push_back(gbps(r.ceil_write_s));
    cr.push_back(gbps(r.ceil_read_s));
    sc.push_back(r.save_commit_s);
    lvf.push_back(r.load_verify_s);
  }
  const double save = median(sv), load = median(lv), load2 = median(tv), loadnv = median(nv), cwm = median(cw),
               crm = median(cr);
  nlohmann::json j;
  if (w.rank == 0) {
    const char* hdr = "%-4s %5s %8s %8s %8s %8s %8s %8s %7s %7s %7s %7s\n";
    std::printf(hdr, "rep", "ranks", "save", "load", "load-2p", "load-nv", "ceil-wr", "ceil-rd", "save/wr", "load/rd",
                "2p/rd", "nv/rd");
    std::printf(hdr, "", "", "GB/s", "GB/s", "GB/s", "GB/s", "GB/s", "GB/s", "", "", "", "");
    const char* row = "%-4s %5d %8.3f %8.3f %8.3f %8.3f %8.3f %8.3f %7.2f %7.2f %7.2f %7.2f\n";
    for (size_t i = 0; i < reps.size(); ++i)
      std::printf(row, std::to_string(i + 1).c_str(), w.size, sv[i], lv[i], tv[i], nv[i], cw[i], cr[i],
                  sv[i] / cw[i], lv[i] / cr[i], tv[i] / cr[i], nv[i] / cr[i]);
    std::printf(row, "med", w.size, save, load, load2, loadnv, cwm, crm, save / cwm, load / crm, load2 / crm,
                loadnv / crm);
    std::printf("\nsave: %.3f s median, of which commit (checksums, sync, rename, keep_last=1 cleanup) %.3f s\n",
                total / save / 1e9, median(sc));
    std::printf("load (one pass, verified: load_latest + read_verified): %.3f s; load-2pass: open+verify %.3f s of "
                "%.3f s; load-nv (NOT verified): %.3f s\n",
                total / load / 1e9, median(lvf), total / load2 / 1e9, total / loadnv / 1e9);
    std::printf("reads: %s\n", all_cold ? "cold (page cache dropped via /proc/sys/vm/drop_caches before each read)"
                                        : "WARM (could not drop the page cache, or --no-drop): read GB/s are optimistic");
    std::printf("target: save >= 0.5 x ceiling write: %s; load (verified) >= 0.5 x ceiling read: %s\n",
                save >= 0.5 * cwm ? "yes" : "NO", load >= 0.5 * crm ? "yes" : "NO");

    j["bench"] = "bench_ckpt";
    j["ranks"] = w.size;
    j["driver"] = w.comm == MPI_COMM_NULL ? "serial" : "mpio";
    j["scale"] = opt.scale;
    j["tensors"] = specs.size();
    j["bytes"] = total;
    j["dir"] = dir;
    j["reads_cold"] = all_cold;
    for (size_t i = 0; i < reps.size(); ++i)
      j["reps"].push_back({{"save_gbps", sv[i]}, {"load_gbps", lv[i]}, {"load_2pass_gbps", tv[i]},
                           {"load_noverify_gbps", nv[i]}, {"ceiling_write_gbps", cw[i]},
                           {"ceiling_read_gbps", cr[i]}, {"save_s", reps[i].save_s},
                           {"save_commit_s", reps[i].save_commit_s}, {"load_s", reps[i].load_s},
                           {"load_2pass_s", reps[i].load_2pass_s}, {"load_2pass_verify_s", reps[i].load_verify_s},
                           {"load_noverify_s", reps[i].load_noverify_s}, {"read_cold", reps[i].read_cold}});
    j["median"] = {{"save_gbps", save},
                   {"load_gbps", load},
                   {"load_2pass_gbps", load2},
                   {"load_noverify_gbps", loadnv},
                   {"ceiling_write_gbps", cwm},
                   {"ceiling_read_gbps", crm},
                   {"save_ratio", save / cwm},
                   {"load_ratio", load / crm},
                   {"load_2pass_ratio", load2 / crm},
                   {"load_noverify_ratio", loadnv / crm}};
    if (!opt.json.empty()) {
      std::ofstream(opt.json) << j.dump(2) << "\n";
      std::printf("wrote %s\n", opt.json.c_str());
    }
  }
  (void)local_bytes;
  w.barrier();
  if (w.rank == 0 && !opt.keep && opt.dir.empty()) fs::remove_all(dir);
  else if (w.rank == 0 && !opt.keep) fs::remove_all(ckpt_dir);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  setenv("MPITRON_LOG_LEVEL", "warn", 0);  // one "saved checkpoint" line per save is noise here
  Options opt;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "%s needs a value\n", a.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--scale") opt.scale = std::stod(next());
    else if (a == "--reps") opt.reps = std::max(1, std::stoi(next()));
    else if (a == "--dir") opt.dir = next();
    else if (a == "--json") opt.json = next();
    else if (a == "--no-drop") opt.drop = false;
    else if (a == "--keep") opt.keep = true;
    else {
      std::fprintf(stderr,
                   "usage: [mpirun -np N] bench_ckpt [--scale S] [--reps N] [--dir DIR] [--json FILE] [--no-drop] "
                   "[--keep]\n");
      return a == "--help" || a == "-h" ? 0 : 2;
    }
  }
  const bool under_mpi = std::getenv("OMPI_COMM_WORLD_SIZE") || std::getenv("PMI_SIZE");
  World w;
  if (under_mpi) {
    int provided = 0;
    MPI_Init_thread(&argc, &argv, MPI_THREAD_FUNNELED, &provided);
    w.comm = MPI_COMM_WORLD;
    MPI_Comm_rank(w.comm, &w.rank);
    MPI_Comm_size(w.comm, &w.size);
    set_process_rank(w.rank);
  }
  int rc = 0;
  try {
    rc = run(opt, w);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_ckpt (rank %d): %s\n", w.rank, e.what());
    if (under_mpi) MPI_Abort(MPI_COMM_WORLD, 1);
    return 1;
  }
  if (under_mpi) MPI_Finalize();
  return rc;
}
