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

CheckpointReader CheckpointReader::open_latest(const std::string& load_dir, MPI_Comm comm, bool verify) {
  Group g(comm);
  const int64_t tracker = read_tracker(load_dir);
  std::vector<int64_t> iters = list_iterations(load_dir);
  std::reverse(iters.begin(), iters.end());  // newest first
  std::vector<int64_t> order;
  if (tracker >= 0) order.push_back(tracker);
  for (int64_t it : iters)
    if (it != tracker) order.push_back(it);
  if (tracker < 0 && !iters.empty() && g.rank == 0)
    log_warn("checkpoint: '", (fs::path(load_dir) / kTrackerFileName).string(),
             "' is missing or unreadable; trying the newest iter_* directory");
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
  MPT_THROW(str("no intact checkpoint in '", load_dir, "':", tried),
            "restore the directory from a backup, or start without --load");
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

void CheckpointReader::verify(const std::string& name) const {
  MPT_CHECK(file_.has_attr(name, kAttrDatasetCrc),
            str("dataset '", name, "' in '", file_.path(), "' has no checksum attribute ", kAttrDatasetCrc),
            "the checkpoint was not committed by mpitron");
  const uint32_t want = static_cast<uint32_t>(file_.attr_int(name, kAttrDatasetCrc));
  const DatasetInfo d = file_.dataset_info(name);
  const size_t esize = elem_size(d.type);
  const uint64_t nbytes = static_cast<uint64_t>(shape_numel(d.shape)) * esize;
  if (file_.has_attr(name, kAttrDatasetBytes)) {
    const int64_t stored = file_.attr_int(name, kAttrDatasetBytes);
    MPT_CHECK(static_cast<uint64_t>(stored) == nbytes,
              str("dataset '", name, "' in '", file_.path(), "' holds ", nbytes, " bytes, its attribute says ",
                  stored),
              "the checkpoint is damaged");
  }
  uint32_t crc = 0;
  if (d.shape.empty()) {
    std::vector<uint8_t> buf(esize);
    file_.read_raw(name, {}, {}, buf.data(), d.type);
    crc = crc32c(buf.data(), buf.size());
  } else if (nbytes > 0) {
    // Whole rows of dim 0, about 64 MiB at a time; the bytes as stored (no conversion).
    const uint64_t row_bytes = nbytes / static_cast<uint64_t>(d.shape[0]);
    const int64_t rows = std::max<int64_t>(1, static_cast<int64_t>((64u << 20) / std::max<uint64_t>(row_bytes, 1)));
    std::vector<uint8_t> buf;
    for (int64_t r0 = 0; r0 < d.shape[0]; r0 += rows) {
      Shape off(d.shape.size(), 0), cnt = d.shape;
      off[0] = r0;
      cnt[0] = std::min(rows, d.shape[0] - r0);
      buf.resize(static_cast<size_t>(cnt[0]) * row_bytes);
      file_.read_raw(name, off, cnt, buf.data(), d.type);
      crc = crc32c_extend(crc, buf.data(), buf.size());
    }
  }
  char hex[32];
  std::snprintf(hex, sizeof hex, "0x%08x, computed 0x%08x", want, crc);
  MPT_CHECK(crc == want,
            str("checksum mismatch in dataset '", name, "' of checkpoint file '", file_.path(), "': stored ", hex),
            "the file is corrupt (disk or copy error); load an older checkpoint");
}

void CheckpointReader::verify_all() const {
  Group g(comm_);
  // Datasets dealt to ranks biggest first onto the least-loaded rank: deterministic, balanced.
  std::vector<TensorInfo> ts = tensors();
  std::vector<std::pair<uint64_t, size_t>> sizes;
  for (size_t i = 0; i < ts.size(); ++i)
    sizes.push_back({static_cast<uint64_t>(shape_numel(ts[i].shape)) * elem_size(ts[i].type), i});
  std::stable_sort(sizes.begin(), sizes.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
  std::vector<uint64_t> load(static_cast<size_t>(g.size), 0);
  g.on_all(
      [&] {
        for (const auto& [bytes, i] : sizes) {
          const size_t r = static_cast<size_t>(std::min_element(load.begin(), load.end()) - load.begin());
          load[r] += bytes + 1;
          if (static_cast<int>(r) == g.rank) verify(ts[i].name);
        }
      },
      "checkpoint verification");
}

}  // namespace mpitron::io
