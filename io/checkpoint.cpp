// io/checkpoint.cpp — CheckpointWriter / CheckpointReader (protocol in checkpoint.h).
#include "io/checkpoint.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>
#include <unordered_map>

#include "core/log.h"
#include "io/crc32c.h"

namespace fs = std::filesystem;

namespace mpitron::io {

namespace {

// ---------------------------------------------------------------- communicator helpers
// A communicator view that degrades to "one process" when MPI is not running.
struct Group {
  MPI_Comm comm = MPI_COMM_NULL;
  int rank = 0, size = 1;
  explicit Group(MPI_Comm c) {
    int init = 0, fin = 0;
    MPI_Initialized(&init);
    MPI_Finalized(&fin);
    if (c != MPI_COMM_NULL && init && !fin) {
      comm = c;
      MPI_Comm_rank(c, &rank);
      MPI_Comm_size(c, &size);
    }
  }
  bool mpi() const { return comm != MPI_COMM_NULL; }
  void barrier() const {
    if (mpi()) MPI_Barrier(comm);
  }
  // Every rank's non-empty error text, joined; the same string on all ranks.
  std::string gather_errors(const std::string& mine) const {
    if (!mpi()) return mine;
    const std::string tagged = mine.empty() || size == 1 ? mine : str("[rank ", rank, "] ", mine);
    int n = static_cast<int>(tagged.size());
    std::vector<int> lens(size), displs(size);
    MPI_Allgather(&n, 1, MPI_INT, lens.data(), 1, MPI_INT, comm);
    int total = 0;
    for (int r = 0; r < size; ++r) {
      displs[r] = total;
      total += lens[r];
    }
    if (total == 0) return "";
    std::string all(static_cast<size_t>(total), '\0');
    MPI_Allgatherv(tagged.data(), n, MPI_CHAR, all.data(), lens.data(), displs.data(), MPI_CHAR, comm);
    std::string out;
    for (int r = 0; r < size; ++r)
      if (lens[r]) out += (out.empty() ? "" : "\n  ") + all.substr(displs[r], lens[r]);
    return out;
  }
  // Runs fn on rank 0 only; its error (if any) is thrown on every rank.
  template <typename F> void on_root(const F& fn, const char* what) const {
    std::string err;
    if (rank == 0) {
      err = capture(fn);
    }
    rethrow_all(err, what);
  }
  // Runs fn on every rank; any rank's error is thrown on every rank.
  template <typename F> void on_all(const F& fn, const char* what) const {
    rethrow_all(capture(fn), what);
  }
  // fn's error text ("" when it succeeds): an mpitron::Error without its location prefix.
  template <typename F> static std::string capture(const F& fn) {
    try {
      fn();
    } catch (const Error& e) {
      return e.hint().empty() ? e.message() : str(e.message(), " (hint: ", e.hint(), ")");
    } catch (const std::exception& e) {
      return e.what();
    }
    return "";
  }
  void rethrow_all(const std::string& err, const char* what) const {
    const std::string all = gather_errors(err);
    if (!all.empty()) MPT_THROW(str(what, ": ", all), "");
  }
  // As capture/rethrow_all, remembering whether the error said "the checkpoint
  // is damaged" (CheckpointDamaged): if any rank's did, every rank throws
  // CheckpointDamaged, else a plain Error.
  struct Failure {
    std::string text;
    bool damaged = false;
  };
  template <typename F> static Failure capture_kind(const F& fn) {
    try {
      fn();
    } catch (const CheckpointDamaged& e) {
      return {e.hint().empty() ? e.message() : str(e.message(), " (hint: ", e.hint(), ")"), true};
    } catch (const Error& e) {
      return {e.hint().empty() ? e.message() : str(e.message(), " (hint: ", e.hint(), ")"), false};
    } catch (const std::exception& e) {
      return {e.what(), false};
    }
    return {};
  }
  void rethrow_kind(const Failure& f, const char* what) const {
    const std::string all = gather_errors(f.text);
    if (all.empty()) return;
    int damaged = f.damaged ? 1 : 0;
    if (mpi()) MPI_Allreduce(MPI_IN_PLACE, &damaged, 1, MPI_INT, MPI_MAX, comm);
    if (damaged) throw CheckpointDamaged(str(what, ": ", all), "", __FILE__, __LINE__);
    MPT_THROW(str(what, ": ", all), "");
  }
  // Rank 0's string on every rank.
  std::string bcast_string(const std::string& s) const {
    if (!mpi()) return s;
    uint64_t n = s.size();
    MPI_Bcast(&n, 1, MPI_UINT64_T, 0, comm);
    std::string out = rank == 0 ? s : std::string(static_cast<size_t>(n), '\0');
    if (n) MPI_Bcast(out.data(), static_cast<int>(n), MPI_CHAR, 0, comm);
    return out;
  }
};

// ---------------------------------------------------------------- file system helpers

std::string errno_str() { return std::strerror(errno); }

void fsync_path(const std::string& path, bool dir) {
  const int fd = ::open(path.c_str(), O_RDONLY | (dir ? O_DIRECTORY : 0));
  MPT_CHECK(fd >= 0, str("open '", path, "' for fsync: ", errno_str()), "");
  const int rc = ::fsync(fd);
  const std::string err = errno_str();
  ::close(fd);
  MPT_CHECK(rc == 0, str("fsync '", path, "': ", err), "the disk may be full or failing");
}

void rename_path(const std::string& from, const std::string& to) {
  MPT_CHECK(std::rename(from.c_str(), to.c_str()) == 0, str("rename '", from, "' -> '", to, "': ", errno_str()),
            "");
}

// Writes `text` to `path` atomically: temp file, fsync, rename, fsync the directory.
void replace_file(const std::string& path, const std::string& text) {
  const std::string tmp = path + ".tmp";
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  MPT_CHECK(fd >= 0, str("create '", tmp, "': ", errno_str()), "check that the save directory is writable");
  const ssize_t n = ::write(fd, text.data(), text.size());
  const bool ok = n == static_cast<ssize_t>(text.size()) && ::fsync(fd) == 0;
  const std::string err = errno_str();
  ::close(fd);
  MPT_CHECK(ok, str("write '", tmp, "': ", err), "the disk may be full");
  rename_path(tmp, path);
  fsync_path(fs::path(path).parent_path().string(), true);
}

// iter_N (committed) or iter_N.tmp; -1 for anything else.
int64_t parse_iter_dir(const std::string& name, bool* is_tmp) {
  static const std::regex re(R"(iter_(\d+)(\.tmp)?)");
  std::smatch m;
  if (!std::regex_match(name, m, re)) return -1;
  *is_tmp = m[2].matched;
  return std::stoll(m[1].str());
}

// ---------------------------------------------------------------- hyperslab runs

// The contiguous runs (in the global row-major byte array) of a hyperslab,
// in the order its elements sit in the local row-major buffer.
template <typename F>
void for_each_run(const Shape& global, const Shape& offset, const Shape& count, size_t esize, const F& fn) {
  const int nd = static_cast<int>(global.size());
  if (nd == 0) {
    fn(uint64_t{0}, static_cast<uint64_t>(esize));
    return;
  }
  if (shape_numel(count) == 0) return;
  const Shape gstride = contiguous_strides(global);
  int k = nd - 1;  // dims after k are fully covered, so one run spans count[k] rows of them
  while (k > 0 && count[k] == global[k]) --k;
  const uint64_t run_elems = static_cast<uint64_t>(count[k] * gstride[k]);
  std::vector<int64_t> idx(static_cast<size_t>(k), 0);
  while (true) {
    int64_t start = offset[k] * gstride[k];
    for (int d = 0; d < k; ++d) start += (offset[d] + idx[d]) * gstride[d];
    fn(static_cast<uint64_t>(start) * esize, run_elems * esize);
    int d = k - 1;
    while (d >= 0 && ++idx[d] == count[d]) idx[d--] = 0;
    if (d < 0) break;
  }
}

}  // namespace

std::string iteration_dir_name(int64_t iteration) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "iter_%07lld", static_cast<long long>(iteration));
  return buf;
}

// ================================================================ writer

CheckpointWriter::~CheckpointWriter() {
  // No commit: close what we have; the .tmp directory stays (as after a crash).
  try {
    if (file_.is_open()) file_.close();
  } catch (const std::exception& e) {
    log_warn("closing uncommitted checkpoint '", tmp_dir_, "': ", e.what());
  }
}

std::string CheckpointWriter::final_dir() const {
  return (fs::path(save_dir_) / iteration_dir_name(iteration_)).string();
}

void CheckpointWriter::begin(const std::string& save_dir, int64_t iteration, MPI_Comm comm) {
  MPT_CHECK(!file_.is_open(), str("checkpoint for iteration ", iteration_, " is still open"),
            "commit() it before beginning another");
  MPT_CHECK(iteration >= 0, str("checkpoint iteration must be >= 0, got ", iteration), "");
  Group g(comm);
  comm_ = g.comm;
  save_dir_ = save_dir;
  iteration_ = iteration;
  tmp_dir_ = final_dir() + ".tmp";
  names_.clear();
  nbytes_.clear();
  runs_.clear();
  g.on_root(
      [&] {
        std::error_code ec;
        fs::create_directories(save_dir_, ec);
        MPT_CHECK(!ec, str("create save directory '", save_dir_, "': ", ec.message()), "check --save");
        fs::remove_all(tmp_dir_, ec);  // a previous attempt that crashed
        MPT_CHECK(!ec, str("remove stale '", tmp_dir_, "': ", ec.message()), "");
        fs::create_directory(tmp_dir_, ec);
        MPT_CHECK(!ec, str("create '", tmp_dir_, "': ", ec.message()), "");
      },
      "checkpoint begin");
  file_ = Hdf5File::create((fs::path(tmp_dir_) / kCheckpointFileName).string(), comm_);
  file_.set_attr_string("/", kAttrFormat, kCheckpointFormat);
  file_.set_attr_int("/", kAttrVersion, kCheckpointVersion);
  file_.set_attr_int("/", kAttrIteration, iteration);
  file_.set_attr_int("/", kAttrWorldSize, g.size);
  file_.set_attr_string("/", kAttrChecksumAlgo, "crc32c");
  // Rank 0's clock, so every rank writes the same value.
  double now = std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  if (g.mpi()) MPI_Bcast(&now, 1, MPI_DOUBLE, 0, g.comm);
  file_.set_attr_double("/", kAttrCreated, now);
}

void CheckpointWriter::add_raw(const std::string& name, const Shape& global_shape, ElemType type,
                               const void* data, const Shape& offset, const Shape& count) {
  MPT_CHECK(file_.is_open(), str("add tensor '", name, "': no checkpoint begun"), "call begin() first");
  file_.create_dataset(name, global_shape, type);
  const Shape off = offset.empty() ? Shape(global_shape.size(), 0) : offset;
  const Shape cnt = data ? count : Shape(global_shape.size(), 0);
  file_.write_raw(name, off, cnt, data, type);
  const uint64_t ds = names_.size();
  names_.push_back(name);
  const size_t esize = elem_size(type);
  nbytes_.push_back(static_cast<uint64_t>(shape_numel(global_shape)) * esize);
  if (!data) return;
  const auto* p = static_cast<const uint8_t*>(data);
  for_each_run(global_shape, off, cnt, esize, [&](uint64_t goff, uint64_t len) {
    runs_.push_back(Run{ds, goff, len, crc32c(p, len)});
    p += len;
  });
}

void CheckpointWriter::add_pieces(const std::string& name, const Shape& global_shape, ElemType type,
                                  const std::vector<Hdf5File::Hyperslab>& pieces, const void* data) {
  MPT_CHECK(file_.is_open(), str("add tensor '", name, "': no checkpoint begun"), "call begin() first");
  file_.create_dataset(name, global_shape, type);
  file_.write_pieces(name, pieces, data, type);
  const uint64_t ds = names_.size();
  names_.push_back(name);
  const size_t esize = elem_size(type);
  nbytes_.push_back(static_cast<uint64_t>(shape_numel(global_shape)) * esize);
  const auto* p = static_cast<const uint8_t*>(data);
  for (const Hdf5File::Hyperslab& h : pieces) {
    if (shape_numel(h.count) == 0) continue;
    for_each_run(global_shape, h.offset, h.count, esize, [&](uint64_t goff, uint64_t len) {
      runs_.push_back(Run{ds, goff, len, crc32c(p, len)});
      p += len;
    });
  }
}

void CheckpointWriter::add_tensor(const std::string& name, const Shape& global_shape, DType dtype,
                                  const Tensor& local, const Shape& offset) {
  if (!local.defined()) {
    add_raw(name, global_shape, elem_type_of(dtype), nullptr, {}, {});
    return;
  }
  Tensor host = local.device().is_cpu() ? local : local.to(Device::cpu());
  if (host.dtype() != dtype) {
    MPT_CHECK(is_floating(host.dtype()) && is_floating(dtype),
              str("add tensor '", name, "': tensor is ", dtype_name(host.dtype()), ", checkpoint wants ",
                  dtype_name(dtype)),
              "only floating dtypes are converted");
    host = host.to(dtype);
  }
  if (!host.is_contiguous()) host = host.contiguous();
  MPT_CHECK(host.shape().size() == global_shape.size() && (offset.empty() || offset.size() == global_shape.size()),
            str("add tensor '", name, "': local shape ", shape_str(host.shape()), ", offset ", shape_str(offset),
                " and global shape ", shape_str(global_shape), " differ in rank"),
            "");
  add_raw(name, global_shape, elem_type_of(dtype), host.numel() ? host.data_ptr() : nullptr, offset,
          host.shape());
}

void CheckpointWriter::add_replicated(const std::string& name, const Tensor& whole) {
  Group g(comm_);
  add_tensor(name, whole.shape(), whole.dtype(), g.rank == 0 ? whole : Tensor());
}

void CheckpointWriter::set_attr_string(const std::string& key, const std::string& value) {
  file_.set_attr_string("/", key, value);
}
void CheckpointWriter::set_attr_int(const std::string& key, int64_t value) { file_.set_attr_int("/", key, value); }
void CheckpointWriter::set_attr_double(const std::string& key, double value) {
  file_.set_attr_double("/", key, value);
}
void CheckpointWriter::set_attr_json(const std::string& key, const nlohmann::json& value) {
  file_.set_attr_json("/", key, value);
}

std::string CheckpointWriter::commit(int keep_last) {
  MPT_CHECK(file_.is_open(), "checkpoint commit without begin()", "");
  Group g(comm_);

  // 1. Every rank's runs to rank 0, which joins them per dataset in global order.
  static_assert(sizeof(Run) == 4 * sizeof(uint64_t), "Run is sent as 4 uint64");
  std::vector<Run> all = runs_;
  if (g.mpi()) {
    int n = static_cast<int>(runs_.size() * 4);
    std::vector<int> counts(g.size), displs(g.size);
    MPI_Gather(&n, 1, MPI_INT, counts.data(), 1, MPI_INT, 0, g.comm);
    int total = 0;
    for (int r = 0; r < g.size; ++r) {
      displs[r] = total;
      total += counts[r];
    }
    if (g.rank == 0) all.resize(static_cast<size_t>(total / 4));
    MPI_Gatherv(runs_.data(), n, MPI_UINT64_T, all.data(), counts.data(), displs.data(), MPI_UINT64_T, 0, g.comm);
  }
  std::vector<uint64_t> crcs(names_.size(), 0);
  g.on_root(
      [&] {
        std::sort(all.begin(), all.end(), [](const Run& a, const Run& b) {
          return a.dataset != b.dataset ? a.dataset < b.dataset : a.offset != b.offset ? a.offset < b.offset : a.len < b.len;
        });
        size_t i = 0;
        for (uint64_t ds = 0; ds < names_.size(); ++ds) {
          uint32_t crc = 0;
          uint64_t covered = 0;
          const Run* prev = nullptr;
          for (; i < all.size() && all[i].dataset == ds; ++i) {
            const Run& r = all[i];
            if (r.len == 0) continue;
            if (prev && r.offset == prev->offset && r.len == prev->len) {  // a replica wrote it too
              MPT_CHECK(r.crc == prev->crc,
                        str("dataset '", names_[ds], "': two ranks wrote different data to bytes [", r.offset, ", ",
                            r.offset + r.len, ")"),
                        "replicas must hold identical values, or only one of them should write");
              continue;
            }
            MPT_CHECK(r.offset == covered,
                      str("dataset '", names_[ds], "': ", r.offset > covered ? "no rank wrote" : "ranks overlap on",
                          " bytes [", std::min(r.offset, covered), ", ", std::max(r.offset, covered), ") of ",
                          nbytes_[ds]),
                      "the ranks' hyperslabs must tile the global tensor exactly once");
            crc = crc32c_combine(crc, static_cast<uint32_t>(r.crc), r.len);
            covered += r.len;
            prev = &r;
          }
          MPT_CHECK(covered == nbytes_[ds],
                    str("dataset '", names_[ds], "': no rank wrote bytes [", covered, ", ", nbytes_[ds], ")"),
                    "the ranks' hyperslabs must tile the global tensor exactly once");
          crcs[ds] = crc;
        }
      },
      str("checkpoint commit of '", tmp_dir_, "'").c_str());
  if (g.mpi() && !crcs.empty())
    MPI_Bcast(crcs.data(), static_cast<int>(crcs.size()), MPI_UINT64_T, 0, g.comm);

  // 2. Checksums as attributes (collective metadata), then flush and close.
  for (size_t ds = 0; ds < names_.size(); ++ds) {
    file_.set_attr_int(names_[ds], kAttrDatasetCrc, static_cast<int64_t>(crcs[ds]));
    file_.set_attr_int(names_[ds], kAttrDatasetBytes, static_cast<int64_t>(nbytes_[ds]));
  }
  const std::string h5path = file_.path();
  file_.flush();
  file_.close();

  // 3. Durable before visible: fsync file and directory, barrier, rename, fsync parent, tracker.
  g.on_root(
      [&] {
        fsync_path(h5path, false);
        fsync_path(tmp_dir_, true);
      },
      "checkpoint fsync");
  g.barrier();
  const std::string final_path = final_dir();
  g.on_root(
      [&] {
        std::error_code ec;
        if (fs::exists(final_path)) {  // saving an iteration again: move the old one out of sight first
          const std::string old = final_path + ".old.tmp";
          fs::remove_all(old, ec);
          rename_path(final_path, old);
          rename_path(tmp_dir_, final_path);
          fs::remove_all(old, ec);
        } else {
          rename_path(tmp_dir_, final_path);
        }
        fsync_path(save_dir_, true);
        replace_file((fs::path(save_dir_) / kTrackerFileName).string(), str(iteration_, "\n"));
        if (keep_last > 0) {
          std::vector<int64_t> iters = CheckpointReader::list_iterations(save_dir_);
          for (size_t k = 0; k + static_cast<size_t>(keep_last) < iters.size(); ++k) {
            if (iters[k] == iteration_) continue;
            fs::remove_all(fs::path(save_dir_) / iteration_dir_name(iters[k]), ec);
            if (ec) log_warn("keep_last: could not remove ", iteration_dir_name(iters[k]), ": ", ec.message());
          }
          for (const auto& e : fs::directory_iterator(save_dir_, ec)) {
            bool tmp = false;
            const int64_t it = parse_iter_dir(e.path().filename().string(), &tmp);
            if (tmp && it >= 0 && it < iteration_) fs::remove_all(e.path(), ec);
          }
        }
      },
      "checkpoint commit");
  log_info("saved checkpoint iteration ", iteration_, " to ", final_path);
  names_.clear();
  nbytes_.clear();
  runs_.clear();
  return final_path;
}

// ================================================================ reader

int64_t CheckpointReader::read_tracker(const std::string& load_dir) {
  std::ifstream in(fs::path(load_dir) / kTrackerFileName);
  if (!in) return -1;
  std::string s;
  in >> s;
  if (s.empty() || !std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; })) return -1;
  try {
    return std::stoll(s);
  } catch (const std::exception&) {
    return -1;
  }
}

std::vector<int64_t> CheckpointReader::list_iterations(const std::string& load_dir) {
  std::vector<int64_t> out;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(load_dir, ec)) {
    bool tmp = false;
    const int64_t it = parse_iter_dir(e.path().filename().string(), &tmp);
    if (it >= 0 && !tmp && e.is_directory(ec)) out.push_back(it);
  }
  std::sort(out.begin(), out.end());
  return out;
}

CheckpointReader CheckpointReader::open_iteration(const std::string& load_dir, int64_t iteration, MPI_Comm comm,
                                                  bool verify) {
  Group g(comm);
  CheckpointReader r;
  r.comm_ = g.comm;
  r.iteration_ = iteration;
  r.dir_ = (fs::path(load_dir) / iteration_dir_name(iteration)).string();
  const std::string path = (fs::path(r.dir_) / kCheckpointFileName).string();
  std::string err;
  if (!fs::exists(path)) err = str("'", path, "' does not exist");
  err = g.gather_errors(err);  // the same answer everywhere before a collective open
  if (!err.empty()) MPT_THROW(str("checkpoint iteration ", iteration, ": ", err), "");
  r.file_ = Hdf5File::open(path, false, g.comm);
  g.on_all(
      [&] {
        MPT_CHECK(r.file_.has_attr("/", kAttrFormat) && r.file_.attr_string("/", kAttrFormat) == kCheckpointFormat,
                  str("'", path, "' is not an mpitron checkpoint (no format=\"", kCheckpointFormat, "\")"), "");
        const int64_t v = r.file_.attr_int("/", kAttrVersion);
        MPT_CHECK(v >= 1 && v <= kCheckpointVersion,
                  str("'", path, "' has checkpoint format version ", v, "; this build reads up to ",
                      kCheckpointVersion),
                  "load it with a newer mpitron");
        const int64_t it = r.file_.attr_int("/", kAttrIteration);
        MPT_CHECK(it == iteration, str("'", path, "' says iteration ", it, " but sits in ", r.dir_), "");
      },
      "open checkpoint");
  if (verify) r.verify_all();
  return r;
}

namespace {
// The order in which open_latest / load_latest try checkpoints: the tracker's
// iteration, then every committed iter_* newest first.
std::vector<int64_t> candidate_order(const std::string& load_dir, int64_t tracker, int rank) {
  std::vector<int64_t> iters = CheckpointReader::list_iterations(load_dir);
  std::reverse(iters.begin(), iters.end());  // newest first
  std::vector<int64_t> order;
  if (tracker >= 0) order.push_back(tracker);
  for (int64_t it : iters)
    if (it != tracker) order.push_back(it);
  if (tracker < 0 && !iters.empty() && rank == 0)
    log_warn("checkpoint: '", (fs::path(load_dir) / kTrackerFileName).string(),
             "' is missing or unreadable; trying the newest iter_* directory");
  return order;
}

[[noreturn]] void throw_none_intact(const std::string& load_dir, const std::string& tried) {
  MPT_THROW(str("no intact checkpoint in '", load_dir, "':", tried),
            "restore the directory from a backup, or start without --load");
}
}  // namespace

CheckpointReader CheckpointReader::open_latest(const std::string& load_dir, MPI_Comm comm, bool verify) {
  Group g(comm);
  const int64_t tracker = read_tracker(load_dir);
  const std::vector<int64_t> order = candidate_order(load_dir, tracker, g.rank);
  std::string tried;
  for (int64_t it : order) {
    try {
      CheckpointReader r = open_iteration(load_dir, it, comm, verify);
      if (it != tracker && tracker >= 0 && g.rank == 0)
        log_warn("checkpoint: fell back to iteration ", it, " (the tracker names ", tracker, ")");
      return r;
    } catch (const Error& e) {
      if (g.rank == 0)
        log_warn("checkpoint: skipping iteration ", it, " in '", load_dir, "': ", e.message());
      tried += str("\n  iteration ", it, ": ", e.message());
    }
  }
  if (order.empty()) return CheckpointReader();
  throw_none_intact(load_dir, tried);
}

CheckpointReader CheckpointReader::load_latest(const std::string& load_dir, MPI_Comm comm,
                                               const std::function<void(const CheckpointReader&)>& load) {
  Group g(comm);
  const int64_t tracker = read_tracker(load_dir);
  const std::vector<int64_t> order = candidate_order(load_dir, tracker, g.rank);
  std::string tried;
  for (int64_t it : order) {
    CheckpointReader r;
    try {
      r = open_iteration(load_dir, it, comm, /*verify=*/false);
      load(r);  // read_verified inside: CheckpointDamaged on every rank alike
    } catch (const CheckpointDamaged& e) {
      if (g.rank == 0) log_warn("checkpoint: skipping iteration ", it, " in '", load_dir, "': ", e.message());
      tried += str("\n  iteration ", it, ": ", e.message());
      continue;
    } catch (const Error& e) {
      if (r.found()) throw;  // opened fine: the caller's error, not a damaged checkpoint
      if (g.rank == 0) log_warn("checkpoint: skipping iteration ", it, " in '", load_dir, "': ", e.message());
      tried += str("\n  iteration ", it, ": ", e.message());
      continue;
    }
    if (it != tracker && tracker >= 0 && g.rank == 0)
      log_warn("checkpoint: fell back to iteration ", it, " (the tracker names ", tracker, ")");
    return r;
  }
  if (order.empty()) return CheckpointReader();
  throw_none_intact(load_dir, tried);
}

std::vector<TensorInfo> CheckpointReader::tensors() const {
  std::vector<TensorInfo> out;
  for (const std::string& n : file_.list_datasets()) out.push_back(tensor_info(n));
  return out;
}

TensorInfo CheckpointReader::tensor_info(const std::string& name) const {
  const DatasetInfo d = file_.dataset_info(name);
  return TensorInfo{name, d.shape, d.type};
}

Tensor CheckpointReader::read(const std::string& name) const { return file_.read(name); }
Tensor CheckpointReader::read(const std::string& name, const Shape& offset, const Shape& count) const {
  return file_.read(name, offset, count);
}
void CheckpointReader::read_raw(const std::string& name, const Shape& offset, const Shape& count, void* out,
                                ElemType type) const {
  file_.read_raw(name, offset, count, out, type);
}

nlohmann::json CheckpointReader::attr_json(const std::string& key) const { return file_.attr_json("/", key); }

const std::vector<std::string>& CheckpointReader::dataset_names() const {
  if (!names_ready_) {
    names_ = file_.list_datasets();
    names_ready_ = true;
  }
  return names_;
}

namespace {

constexpr uint64_t kReadChunk = uint64_t{8} << 20;  // bytes per pread (into the destination or a bounce buffer)
constexpr uint64_t kMergeGap = uint64_t{64} << 10;  // a rank's ranges of one dataset this close are read as one
constexpr uint64_t kGapAlign = uint64_t{1} << 20;   // unread bytes are dealt to ranks in multiples of this

const char* const kDamagedHint = "the file is damaged (disk or copy error, or an interrupted copy); load an older checkpoint";

// CRC of `len` bytes at global byte offset `offset` of dataset `dataset` (as in
// the writer's runs); len == 0 only marks "this rank requested the dataset".
struct VRun {
  uint64_t dataset, offset, len, crc;
};
static_assert(sizeof(VRun) == 4 * sizeof(uint64_t), "VRun is sent as 4 uint64");

// Bytes [offset, offset + len) of a dataset that no rank read, and who reads them.
// via_hdf5: the dataset cannot be read raw (not contiguous, or not native
// bytes); then the range is the whole dataset, read through HDF5.
struct GapTask {
  uint64_t dataset, offset, len, rank, via_hdf5;
};
static_assert(sizeof(GapTask) == 5 * sizeof(uint64_t), "GapTask is sent as 5 uint64");

// Every rank's vector on rank 0 (rank 0's own first), empty elsewhere.
template <typename T> std::vector<T> gather_to_root(const Group& g, const std::vector<T>& mine) {
  static_assert(sizeof(T) % sizeof(uint64_t) == 0, "sent as uint64");
  constexpr int kWords = sizeof(T) / sizeof(uint64_t);
  if (!g.mpi()) return mine;
  int n = static_cast<int>(mine.size()) * kWords;
  std::vector<int> counts(static_cast<size_t>(g.size)), displs(static_cast<size_t>(g.size));
  MPI_Gather(&n, 1, MPI_INT, counts.data(), 1, MPI_INT, 0, g.comm);
  int total = 0;
  for (int r = 0; r < g.size; ++r) {
    displs[r] = total;
    total += counts[r];
  }
  std::vector<T> all(g.rank == 0 ? static_cast<size_t>(total / kWords) : 0);
  MPI_Gatherv(mine.data(), n, MPI_UINT64_T, all.data(), counts.data(), displs.data(), MPI_UINT64_T, 0, g.comm);
  return all;
}

template <typename T> void bcast_vector(const Group& g, std::vector<T>& v) {
  if (!g.mpi()) return;
  uint64_t n = v.size();
  MPI_Bcast(&n, 1, MPI_UINT64_T, 0, g.comm);
  v.resize(static_cast<size_t>(n));
  if (n) MPI_Bcast(v.data(), static_cast<int>(n * sizeof(T) / sizeof(uint64_t)), MPI_UINT64_T, 0, g.comm);
}

struct Fd {
  int fd = -1;
  Fd() = default;
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
};

void open_raw(Fd& f, const std::string& path) {
  if (f.fd >= 0) return;
  f.fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (f.fd < 0)
    throw CheckpointDamaged(str("open checkpoint file '", path, "' for reading: ", errno_str()), kDamagedHint,
                            __FILE__, __LINE__);
  // Sequential reads ahead of us: the kernel may read ahead further.
  (void)::posix_fadvise(f.fd, 0, 0, POSIX_FADV_SEQUENTIAL);
}

// Exactly n bytes at file offset `off`, or CheckpointDamaged (short file, I/O error).
void pread_full(int fd, void* dst, uint64_t n, uint64_t off, const std::string& path, const std::string& dataset) {
  auto* p = static_cast<uint8_t*>(dst);
  while (n > 0) {
    const size_t want = static_cast<size_t>(std::min<uint64_t>(n, uint64_t{1} << 30));
    const ssize_t r = ::pread(fd, p, want, static_cast<off_t>(off));
    if (r < 0 && errno == EINTR) continue;
    if (r < 0)
      throw CheckpointDamaged(str("reading dataset '", dataset, "' of checkpoint file '", path, "' at byte ", off,
                                  ": ", errno_str()),
                              kDamagedHint, __FILE__, __LINE__);
    if (r == 0)
      throw CheckpointDamaged(str("checkpoint file '", path, "' ends at byte ", off, ", inside dataset '", dataset,
                                  "' (", n, " more bytes expected): the file is truncated"),
                              kDamagedHint, __FILE__, __LINE__);
    p += r;
    off += static_cast<uint64_t>(r);
    n -= static_cast<uint64_t>(r);
  }
}

// CRC-32C of a whole dataset read through HDF5 in ~64 MiB blocks of rows
// (datasets that are not contiguous or not stored as native bytes).
uint32_t crc_via_hdf5(const Hdf5File& f, const std::string& name, const DatasetInfo& d) {
  const size_t esize = elem_size(d.type);
  const uint64_t nbytes = static_cast<uint64_t>(shape_numel(d.shape)) * esize;
  uint32_t crc = 0;
  if (d.shape.empty()) {
    std::vector<uint8_t> buf(esize);
    f.read_raw(name, {}, {}, buf.data(), d.type);
    return crc32c(buf.data(), buf.size());
  }
  if (nbytes == 0) return 0;
  const uint64_t row_bytes = nbytes / static_cast<uint64_t>(d.shape[0]);
  const int64_t rows = std::max<int64_t>(1, static_cast<int64_t>((64u << 20) / std::max<uint64_t>(row_bytes, 1)));
  std::vector<uint8_t> buf;
  for (int64_t r0 = 0; r0 < d.shape[0]; r0 += rows) {
    Shape off(d.shape.size(), 0), cnt = d.shape;
    off[0] = r0;
    cnt[0] = std::min(rows, d.shape[0] - r0);
    buf.resize(static_cast<size_t>(cnt[0]) * row_bytes);
    f.read_raw(name, off, cnt, buf.data(), d.type);
    crc = crc32c_extend(crc, buf.data(), buf.size());
  }
  return crc;
}

std::string mismatch_text(const std::string& name, const std::string& path, uint32_t want, uint32_t got) {
  char hex[48];
  std::snprintf(hex, sizeof hex, "0x%08x, computed 0x%08x", want, got);
  return str("checksum mismatch in dataset '", name, "' of checkpoint file '", path, "': stored ", hex);
}

bool is_half_type(ElemType t) { return t == ElemType::BF16 || t == ElemType::F16; }

// A range of a dataset this rank reads raw: global byte offset, length, destination.
struct Seg {
  uint64_t dataset, goff, len, foff;  // foff: file offset of the first byte
  uint8_t* dst;
};

// Reads one window [ws, we) of a dataset (global byte offsets; file offset
// fbase + goff) that covers the segments segs[b, e) (sorted by goff), copying
// each segment's bytes to its destination; returns the CRC of the whole window.
// A chunk that lies inside exactly one segment is read straight into it.
uint32_t read_window(int fd, const std::string& path, const std::string& name, uint64_t fbase, uint64_t ws,
                     uint64_t we, const std::vector<Seg>& segs, size_t b, size_t e, std::vector<uint8_t>& bounce) {
  uint32_t crc = 0;
  size_t lo = b;
  for (uint64_t c0 = ws; c0 < we;) {
    const uint64_t c1 = std::min(we, c0 + kReadChunk);
    while (lo < e && segs[lo].goff + segs[lo].len <= c0) ++lo;
    size_t hits = 0, only = 0;
    bool inside = false;
    for (size_t k = lo; k < e && segs[k].goff < c1; ++k)
      if (segs[k].goff + segs[k].len > c0) {
        ++hits;
        only = k;
        inside = segs[k].goff <= c0 && segs[k].goff + segs[k].len >= c1;
      }
    if (hits == 1 && inside) {
      uint8_t* dst = segs[only].dst + (c0 - segs[only].goff);
      pread_full(fd, dst, c1 - c0, fbase + c0, path, name);
      crc = crc32c_extend(crc, dst, c1 - c0);
    } else {
      if (bounce.size() < kReadChunk) bounce.resize(kReadChunk);
      pread_full(fd, bounce.data(), c1 - c0, fbase + c0, path, name);
      crc = crc32c_extend(crc, bounce.data(), c1 - c0);
      for (size_t k = lo; k < e && segs[k].goff < c1; ++k) {
        const uint64_t a = std::max(c0, segs[k].goff), z = std::min(c1, segs[k].goff + segs[k].len);
        if (a < z) std::memcpy(segs[k].dst + (a - segs[k].goff), bounce.data() + (a - c0), z - a);
      }
    }
    c0 = c1;
  }
  return crc;
}

// CRC of bytes [goff, goff + len) of a dataset read raw through a bounce buffer.
uint32_t crc_raw_range(int fd, const std::string& path, const std::string& name, uint64_t fbase, uint64_t goff,
                       uint64_t len, std::vector<uint8_t>& bounce) {
  if (bounce.size() < kReadChunk) bounce.resize(kReadChunk);
  uint32_t crc = 0;
  for (uint64_t done = 0; done < len;) {
    const uint64_t n = std::min(kReadChunk, len - done);
    pread_full(fd, bounce.data(), n, fbase + goff + done, path, name);
    crc = crc32c_extend(crc, bounce.data(), n);
    done += n;
  }
  return crc;
}

// Per dataset: which of the ranges read by the ranks tile it (each byte
// once), with as few unread bytes as possible; the unread ranges are returned
// in `gaps`. runs: this dataset's ranges, sorted by (offset, len), duplicates
// removed, len > 0.
std::vector<size_t> choose_tiling(const std::vector<VRun>& runs, uint64_t nbytes,
                                  std::vector<std::pair<uint64_t, uint64_t>>* gaps) {
  std::vector<uint64_t> pts = {0, nbytes};
  for (const VRun& r : runs) {
    pts.push_back(r.offset);
    pts.push_back(r.offset + r.len);
  }
  std::sort(pts.begin(), pts.end());
  pts.erase(std::unique(pts.begin(), pts.end()), pts.end());
  auto at = [&](uint64_t x) { return static_cast<size_t>(std::lower_bound(pts.begin(), pts.end(), x) - pts.begin()); };
  // ending[i]: runs that end at pts[i].
  std::vector<std::vector<size_t>> ending(pts.size());
  for (size_t k = 0; k < runs.size(); ++k) ending[at(runs[k].offset + runs[k].len)].push_back(k);
  // best[i]: fewest unread bytes to cover [0, pts[i]); how[i]: run used to reach
  // pts[i], or SIZE_MAX for "unread from pts[i-1]".
  constexpr size_t kGap = static_cast<size_t>(-1);
  std::vector<uint64_t> best(pts.size(), 0);
  std::vector<size_t> how(pts.size(), kGap);
  for (size_t i = 1; i < pts.size(); ++i) {
    best[i] = best[i - 1] + (pts[i] - pts[i - 1]);
    for (size_t k : ending[i]) {
      const uint64_t c = best[at(runs[k].offset)];
      if (c <= best[i]) {
        best[i] = c;
        how[i] = k;
      }
    }
  }
  std::vector<size_t> chosen;
  gaps->clear();
  for (size_t i = pts.size() - 1; i > 0;) {
    if (how[i] == kGap) {
      const uint64_t a = pts[i - 1], z = pts[i];
      if (!gaps->empty() && gaps->back().first == z) gaps->back() = {a, gaps->back().second + (z - a)};
      else gaps->push_back({a, z - a});
      --i;
    } else {
      chosen.push_back(how[i]);
      i = at(runs[how[i]].offset);
    }
  }
  std::reverse(chosen.begin(), chosen.end());
  std::reverse(gaps->begin(), gaps->end());
  return chosen;
}

}  // namespace

namespace {

// One read_verified call on one rank: what it reads, what it has read, and
// on rank 0 the plan and the verdict.
class VerifiedRead {
 public:
  VerifiedRead(const Hdf5File& file, const std::vector<std::string>& names)
      : file_(file), path_(file.path()), names_(names) {
    for (size_t i = 0; i < names_.size(); ++i) index_.emplace(names_[i], i);
  }

  // 0. Checks the requests (plain Error: a caller's mistake) and cuts them
  // into contiguous ranges of the global row-major byte arrays.
  void add_requests(const std::vector<ReadRequest>& requests) {
    for (const ReadRequest& q : requests) {
      auto it = index_.find(q.name);
      MPT_CHECK(it != index_.end(), str("checkpoint file '", path_, "' has no dataset '", q.name, "'"),
                "list its datasets with h5ls -r");
      const uint64_t ds = it->second;
      const Hdf5File::RawExtent& e = extent(ds);
      const Shape& shape = e.info.shape;
      runs_.push_back(VRun{ds, 0, 0, 0});  // "requested" mark
      MPT_CHECK(q.expect_shape.empty() || q.expect_shape == shape,
                str("dataset '", q.name, "' in '", path_, "' has shape ", shape_str(shape), ", the reader expects ",
                    shape_str(q.expect_shape)),
                "the checkpoint was saved with other tensor sizes");
      MPT_CHECK(q.type == e.info.type || (!is_half_type(q.type) && !is_half_type(e.info.type)),
                str("read of dataset '", q.name, "' in '", path_, "': dataset holds ", elem_name(e.info.type),
                    ", buffer is ", elem_name(q.type)),
                "read 16-bit floats into a buffer of their own type and convert after");
      uint64_t elems = 0;
      for (const Hdf5File::Hyperslab& h : q.pieces) {
        bool ok = h.offset.size() == shape.size() && h.count.size() == shape.size();
        for (size_t d = 0; ok && d < shape.size(); ++d)
          ok = h.offset[d] >= 0 && h.count[d] >= 0 && h.offset[d] + h.count[d] <= shape[d];
        MPT_CHECK(ok,
                  str("read of dataset '", q.name, "' in '", path_, "': hyperslab offset ", shape_str(h.offset),
                      " count ", shape_str(h.count), " is outside the dataset shape ", shape_str(shape)),
                  "");
        elems += static_cast<uint64_t>(shape_numel(h.count));
      }
      if (elems == 0) continue;
      MPT_CHECK(q.out != nullptr, str("read of dataset '", q.name, "' in '", path_, "': no output buffer"), "");
      if (!(raw_readable(e) && q.type == e.info.type)) {  // HDF5 converts it; someone else checksums the bytes
        via_hdf5_.push_back(&q);
        continue;
      }
      auto* p = static_cast<uint8_t*>(q.out);
      for (const Hdf5File::Hyperslab& h : q.pieces) {
        if (shape_numel(h.count) == 0) continue;
        for_each_run(shape, h.offset, h.count, elem_size(e.info.type), [&](uint64_t goff, uint64_t len) {
          segs_.push_back(Seg{ds, goff, len, static_cast<uint64_t>(e.file_offset) + goff, p});
          p += len;
        });
      }
    }
  }

  // 1. Reads the ranges in file order, one window per run of nearby ranges of
  // a dataset, keeping the CRC of each window; then the converted requests.
  void read_requests() {
    std::sort(segs_.begin(), segs_.end(),
              [](const Seg& a, const Seg& b) { return a.foff != b.foff ? a.foff < b.foff : a.len > b.len; });
    for (size_t b = 0; b < segs_.size();) {
      const uint64_t ds = segs_[b].dataset, ws = segs_[b].goff;
      uint64_t we = ws + segs_[b].len;
      size_t e = b + 1;
      while (e < segs_.size() && segs_[e].dataset == ds && segs_[e].goff <= we + kMergeGap) {
        we = std::max(we, segs_[e].goff + segs_[e].len);
        ++e;
      }
      const uint32_t crc = read_window(fd(), path_, names_[ds], segs_[b].foff - segs_[b].goff, ws, we, segs_, b, e,
                                       bounce_);
      runs_.push_back(VRun{ds, ws, we - ws, crc});
      bytes_read_ += we - ws;
      b = e;
    }
    for (const ReadRequest* q : via_hdf5_) {
      auto* p = static_cast<uint8_t*>(q->out);
      for (const Hdf5File::Hyperslab& h : q->pieces) {
        const int64_t n = shape_numel(h.count);
        if (n == 0) continue;
        try {
          file_.read_raw(q->name, h.offset, h.count, p, q->type);
        } catch (const Error& err) {
          throw CheckpointDamaged(err.message(), kDamagedHint, __FILE__, __LINE__);
        }
        p += static_cast<size_t>(n) * elem_size(q->type);
      }
    }
  }
  const std::vector<VRun>& runs() const { return runs_; }

  // 2. (rank 0) From every rank's ranges: per checked dataset the ranges whose
  // CRCs are joined, and the tasks for what nobody read, dealt out in file order.
  std::vector<GapTask> plan(std::vector<VRun> all, VerifyScope scope, int nranks) {
    std::sort(all.begin(), all.end(), [](const VRun& a, const VRun& b) {
      return a.dataset != b.dataset ? a.dataset < b.dataset : a.offset != b.offset ? a.offset < b.offset : a.len < b.len;
    });
    std::vector<char> requested(names_.size(), 0);
    for (const VRun& r : all) requested[r.dataset] = 1;
    for (uint64_t ds = 0; ds < names_.size(); ++ds)
      if (scope == VerifyScope::AllDatasets || requested[ds]) checked_.push_back(ds);
    pieces_.assign(checked_.size(), {});
    struct RawGap {
      uint64_t foff, dataset, offset, len;
    };
    std::vector<RawGap> raw_gaps;
    std::vector<uint64_t> whole;  // datasets read through HDF5
    size_t i = 0;
    for (size_t c = 0; c < checked_.size(); ++c) {
      const uint64_t ds = checked_[c];
      while (i < all.size() && all[i].dataset < ds) ++i;
      std::vector<VRun> runs;  // distinct ranges; replicas' copies must agree
      for (; i < all.size() && all[i].dataset == ds; ++i) {
        const VRun& r = all[i];
        if (r.len == 0) continue;
        if (!runs.empty() && runs.back().offset == r.offset && runs.back().len == r.len) {
          if (runs.back().crc != r.crc)
            throw CheckpointDamaged(str("dataset '", names_[ds], "' of checkpoint file '", path_,
                                        "': two ranks read different bytes from [", r.offset, ", ", r.offset + r.len,
                                        ")"),
                                    "the file changed while it was read, or the storage returns inconsistent data",
                                    __FILE__, __LINE__);
          continue;
        }
        runs.push_back(r);
      }
      const Hdf5File::RawExtent& e = extent(ds);
      if (e.nbytes == 0) continue;
      if (!raw_readable(e)) {
        whole.push_back(ds);
        continue;
      }
      std::vector<std::pair<uint64_t, uint64_t>> gaps;
      for (size_t k : choose_tiling(runs, e.nbytes, &gaps)) pieces_[c].push_back(runs[k]);
      for (const auto& [off, len] : gaps)
        raw_gaps.push_back(RawGap{static_cast<uint64_t>(e.file_offset) + off, ds, off, len});
    }
    // Rank r reads the r-th share (whole MiBs) of the unread bytes in file order.
    std::sort(raw_gaps.begin(), raw_gaps.end(), [](const RawGap& a, const RawGap& b) { return a.foff < b.foff; });
    uint64_t total = 0;
    for (const RawGap& r : raw_gaps) total += r.len;
    const uint64_t n = static_cast<uint64_t>(nranks);
    const uint64_t quota = ((total + n - 1) / n + kGapAlign - 1) / kGapAlign * kGapAlign;
    std::vector<uint64_t> load(static_cast<size_t>(n), 0);
    std::vector<GapTask> tasks;
    uint64_t rank = 0;
    for (const RawGap& r : raw_gaps) {
      for (uint64_t done = 0; done < r.len;) {
        if (load[rank] >= quota && rank + 1 < n) ++rank;
        const uint64_t take = rank + 1 < n ? std::min(r.len - done, quota - load[rank]) : r.len - done;
        tasks.push_back(GapTask{r.dataset, r.offset + done, take, rank, 0});
        load[rank] += take;
        done += take;
      }
    }
    for (uint64_t ds : whole) {  // whole datasets onto the least loaded rank
      const auto r = static_cast<uint64_t>(std::min_element(load.begin(), load.end()) - load.begin());
      tasks.push_back(GapTask{ds, 0, extent(ds).nbytes, r, 1});
      load[r] += extent(ds).nbytes;
    }
    return tasks;
  }

  // 3. Reads and checksums this rank's share of what nobody read.
  std::vector<VRun> read_gaps(const std::vector<GapTask>& tasks, int rank) {
    std::vector<VRun> out;
    for (const GapTask& t : tasks) {
      if (t.rank != static_cast<uint64_t>(rank)) continue;
      const Hdf5File::RawExtent& e = extent(t.dataset);
      uint32_t crc = 0;
      if (t.via_hdf5) {
        try {
          crc = crc_via_hdf5(file_, names_[t.dataset], e.info);
        } catch (const Error& err) {
          throw CheckpointDamaged(err.message(), kDamagedHint, __FILE__, __LINE__);
        }
      } else {
        crc = crc_raw_range(fd(), path_, names_[t.dataset], static_cast<uint64_t>(e.file_offset), t.offset, t.len,
                            bounce_);
      }
      out.push_back(VRun{t.dataset, t.offset, t.len, crc});
      bytes_gaps_ += t.len;
    }
    return out;
  }

  // 4. (rank 0) Joins each checked dataset's CRCs in global order and
  // compares with the stored checksum; throws CheckpointDamaged listing the bad ones.
  void judge(std::vector<VRun> gap_runs) {
    std::sort(gap_runs.begin(), gap_runs.end(), [](const VRun& a, const VRun& b) {
      return a.dataset != b.dataset ? a.dataset < b.dataset : a.offset < b.offset;
    });
    std::vector<std::string> bad;
    size_t j = 0;
    for (size_t c = 0; c < checked_.size(); ++c) {
      const uint64_t ds = checked_[c];
      const std::string& name = names_[ds];
      std::vector<VRun>& ps = pieces_[c];
      while (j < gap_runs.size() && gap_runs[j].dataset < ds) ++j;
      for (; j < gap_runs.size() && gap_runs[j].dataset == ds; ++j) ps.push_back(gap_runs[j]);
      std::sort(ps.begin(), ps.end(), [](const VRun& a, const VRun& b) { return a.offset < b.offset; });
      const Hdf5File::RawExtent& e = extent(ds);
      uint32_t crc = 0;
      uint64_t covered = 0;
      for (const VRun& r : ps) {
        MPT_CHECK(r.offset == covered,
                  str("internal: dataset '", name, "' bytes [", std::min(covered, r.offset), ", ",
                      std::max(covered, r.offset), ") verified twice or not at all"),
                  "");
        crc = crc32c_combine(crc, static_cast<uint32_t>(r.crc), r.len);
        covered += r.len;
      }
      MPT_CHECK(covered == e.nbytes, str("internal: dataset '", name, "': verified ", covered, " of ", e.nbytes, " bytes"),
                "");
      const auto attrs = file_.attr_ints(name, {kAttrDatasetCrc, kAttrDatasetBytes});
      if (!attrs[0]) {
        bad.push_back(str("dataset '", name, "' in '", path_, "' has no checksum attribute ", kAttrDatasetCrc,
                          " (the checkpoint was not committed by mpitron)"));
      } else if (attrs[1] && static_cast<uint64_t>(*attrs[1]) != e.nbytes) {
        bad.push_back(str("dataset '", name, "' in '", path_, "' holds ", e.nbytes, " bytes, its attribute says ",
                          *attrs[1]));
      } else if (crc != static_cast<uint32_t>(*attrs[0])) {
        bad.push_back(mismatch_text(name, path_, static_cast<uint32_t>(*attrs[0]), crc));
      }
    }
    if (bad.empty()) return;
    std::string s;
    for (size_t k = 0; k < bad.size() && k < 8; ++k) s += (k ? "\n  " : "") + bad[k];
    if (bad.size() > 8) s += str("\n  ... and ", bad.size() - 8, " more damaged datasets");
    throw CheckpointDamaged(s, kDamagedHint, __FILE__, __LINE__);
  }

  uint64_t bytes_read() const { return bytes_read_; }
  uint64_t bytes_gaps() const { return bytes_gaps_; }

 private:
  static bool raw_readable(const Hdf5File::RawExtent& e) { return e.native && e.file_offset >= 0; }
  const Hdf5File::RawExtent& extent(uint64_t ds) {
    auto it = extents_.find(ds);
    if (it == extents_.end()) it = extents_.emplace(ds, file_.raw_extent(names_[ds])).first;
    return it->second;
  }
  int fd() {
    open_raw(fd_, path_);
    return fd_.fd;
  }

  const Hdf5File& file_;
  const std::string& path_;
  const std::vector<std::string>& names_;
  std::unordered_map<std::string, uint64_t> index_;
  std::unordered_map<uint64_t, Hdf5File::RawExtent> extents_;
  std::vector<Seg> segs_;
  std::vector<const ReadRequest*> via_hdf5_;
  std::vector<VRun> runs_;  // ranges this rank read with their CRCs, plus len-0 "requested" marks
  Fd fd_;
  std::vector<uint8_t> bounce_;
  uint64_t bytes_read_ = 0, bytes_gaps_ = 0;
  // rank 0
  std::vector<uint64_t> checked_;           // datasets to verify
  std::vector<std::vector<VRun>> pieces_;   // per checked dataset: ranges whose CRCs are joined
};

double seconds_now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

}  // namespace

void CheckpointReader::read_verified(const std::vector<ReadRequest>& requests, VerifyScope scope) const {
  MPT_CHECK(file_.is_open(), "read_verified: no checkpoint is open", "");
  Group g(comm_);
  const double t0 = seconds_now();
  VerifiedRead v(file_, dataset_names());
  g.rethrow_kind(Group::capture_kind([&] { v.add_requests(requests); }), "checkpoint read");
  g.rethrow_kind(Group::capture_kind([&] { v.read_requests(); }), "checkpoint read");
  const double t1 = seconds_now();

  std::vector<GapTask> tasks;
  std::string err;
  std::vector<VRun> all = gather_to_root(g, v.runs());
  if (g.rank == 0) err = Group::capture_kind([&] { tasks = v.plan(std::move(all), scope, g.size); }).text;
  err = g.bcast_string(err);  // rank 0's plan fails only for a damaged file
  if (!err.empty()) throw CheckpointDamaged(str("checkpoint verification: ", err), "", __FILE__, __LINE__);
  bcast_vector(g, tasks);
  const double t2 = seconds_now();

  std::vector<VRun> gap_runs;
  g.rethrow_kind(Group::capture_kind([&] { gap_runs = v.read_gaps(tasks, g.rank); }), "checkpoint verification");
  const double t3 = seconds_now();

  std::vector<VRun> got = gather_to_root(g, gap_runs);
  if (g.rank == 0) err = Group::capture_kind([&] { v.judge(std::move(got)); }).text;
  err = g.bcast_string(err);
  log_debug("read_verified '", file_.path(), "' rank ", g.rank, ": requests ", v.bytes_read(), " B in ", t1 - t0,
            " s, plan ", t2 - t1, " s, unread ranges ", v.bytes_gaps(), " B in ", t3 - t2, " s, verdict ",
            seconds_now() - t3, " s");
  if (!err.empty()) throw CheckpointDamaged(str("checkpoint verification: ", err), "", __FILE__, __LINE__);
}

void CheckpointReader::verify(const std::string& name) const {
  MPT_CHECK(file_.has_attr(name, kAttrDatasetCrc),
            str("dataset '", name, "' in '", file_.path(), "' has no checksum attribute ", kAttrDatasetCrc),
            "the checkpoint was not committed by mpitron");
  const uint32_t want = static_cast<uint32_t>(file_.attr_int(name, kAttrDatasetCrc));
  const DatasetInfo d = file_.dataset_info(name);
  const uint64_t nbytes = static_cast<uint64_t>(shape_numel(d.shape)) * elem_size(d.type);
  if (file_.has_attr(name, kAttrDatasetBytes)) {
    const int64_t stored = file_.attr_int(name, kAttrDatasetBytes);
    MPT_CHECK(static_cast<uint64_t>(stored) == nbytes,
              str("dataset '", name, "' in '", file_.path(), "' holds ", nbytes, " bytes, its attribute says ",
                  stored),
              "the checkpoint is damaged");
  }
  const uint32_t crc = crc_via_hdf5(file_, name, d);
  if (crc != want) throw CheckpointDamaged(mismatch_text(name, file_.path(), want, crc), kDamagedHint, __FILE__, __LINE__);
}

void CheckpointReader::verify_all() const { read_verified({}, VerifyScope::AllDatasets); }

}  // namespace mpitron::io
