// io/checkpoint_writer.cpp — CheckpointWriter: begin, collective writes, commit (protocol in checkpoint.h).
#include "io/checkpoint.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
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
#include "io/checkpoint_group.h"
#include "io/checkpoint_util.h"
#include "io/crc32c.h"
#include "io/checkpoint_manifest.h"
#include "io/io_watchdog.h"

namespace fs = std::filesystem;

namespace mpitron::io {

using namespace detail;

std::string iteration_dir_name(int64_t iteration) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "iter_%07lld", static_cast<long long>(iteration));
  return buf;
}

void check_save_dir_writable(const std::string& save_dir, MPI_Comm comm) {
  Group g(comm);
  IoDeadline deadline(str("check that --save '", save_dir, "' is writable"));
  g.on_root(
      [&] {
        std::error_code ec;
        fs::create_directories(save_dir, ec);
        MPT_CHECK(!ec, str("cannot create the save directory '", save_dir, "': ", ec.message()),
                  "pass a writable directory to --save");
        const std::string probe = (fs::path(save_dir) / str(".mpitron_write_test.", ::getpid())).string();
        const int fd = ::open(probe.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
        MPT_CHECK(fd >= 0, str("the save directory '", save_dir, "' is not writable: ", errno_str()),
                  "pass a writable directory to --save (checked at start-up so that no training is lost)");
        const char byte = 0;
        const bool ok = ::write(fd, &byte, 1) == 1 && ::fsync(fd) == 0;
        const std::string err = errno_str();
        ::close(fd);
        ::unlink(probe.c_str());
        MPT_CHECK(ok, str("cannot write to the save directory '", save_dir, "': ", err),
                  "the disk may be full or read-only");
      },
      "--save");
}

// ================================================================ writer

namespace {

// MPITRON_TEST_CKPT_FAIL="<rank>:<step>[:<iteration>]": an injected failure
// of `step` on `rank` (tests; see checkpoint.h). Empty text: no injection.
std::string injected_failure(const char* step, int rank, int64_t iteration) {
  const char* spec = std::getenv("MPITRON_TEST_CKPT_FAIL");
  if (!spec || !*spec) return "";
  int r = -1;
  char name[32] = {0};
  long long it = -1;
  const int n = std::sscanf(spec, "%d:%31[a-z]:%lld", &r, name, &it);
  if (n < 2 || r != rank || std::strcmp(name, step) != 0 || (n == 3 && it != iteration)) return "";
  return str("injected failure of step '", step, "' (MPITRON_TEST_CKPT_FAIL=", spec, "): No space left on device");
}

}  // namespace

template <typename F> void CheckpointWriter::agreed(const char* step, const std::string& what, const F& fn) {
  Group g(comm_);
  IoDeadline deadline(str("checkpoint ", what, " (step '", step, "', iteration ", iteration_, ", '", tmp_dir_, "')"));
  // An injected failure of a collective step happens after the step ran on
  // every rank (the collective completes, one rank's I/O failed); of a rank-0
  // file-system step (manifest, rename, tracker), instead of it.
  const bool collective = std::strcmp(step, "manifest") && std::strcmp(step, "rename") && std::strcmp(step, "tracker");
  std::string err = injected_failure(step, g.rank, iteration_);
  if (err.empty() || collective) {
    const std::string real = Group::capture(fn);
    if (!real.empty()) err = real;
  }
  const std::string all = g.gather_errors(err);
  if (all.empty()) return;
  failed_ = true;
  const std::string text = str("checkpoint ", what, " of iteration ", iteration_, " in '", save_dir_,
                               "' failed (nothing was committed; the previous checkpoint is intact): ", all);
  // Said now, on every rank: if closing the broken file hangs in HDF5, the
  // watchdog ends the job before the exception reaches main.
  log_error(text);
  MPT_THROW(text, "free space on (or fix the permissions of) the --save file system, then resume from the "
                  "previous checkpoint");
}

void CheckpointWriter::check_finite(const std::string& name, ElemType type, const void* data, uint64_t elems) {
  if (nonfinite_.empty() && data && values_nonfinite(type, data, elems)) nonfinite_ = name;
}

CheckpointWriter::~CheckpointWriter() {
  // No commit (or a failed step): close what we have; the .tmp directory stays
  // (as after a crash). Every rank gets here together after an agreed failure.
  try {
    if (file_.is_open()) {
      IoDeadline deadline(str("close of the uncommitted checkpoint '", tmp_dir_, "'"));
      // After a failed write (a full disk) HDF5 still flushes its metadata on
      // close, and a rank whose flush fails skips HDF5's internal barrier
      // while the others wait in it. The file is garbage now: rank 0 empties
      // it first, which gives back the space it took, so the flush succeeds
      // everywhere. (If the close still hangs, the deadline ends the job.)
      if (failed_ && Group(comm_).rank == 0 && ::truncate(file_.path().c_str(), 0) != 0)
        log_warn("could not empty the failed checkpoint file '", file_.path(), "': ", errno_str());
      file_.close();
    }
  } catch (const std::exception& e) {
    log_warn("closing uncommitted checkpoint '", tmp_dir_, "': ", e.what());
  }
}

void CheckpointWriter::set_run(const std::string& run, const std::vector<std::string>& also_owned) {
  run_ = run;
  owned_runs_ = also_owned;
  owned_runs_.push_back(run);
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
  nonfinite_.clear();
  failed_ = false;
  {
    IoDeadline deadline(str("checkpoint begin in '", save_dir_, "'"));
    g.on_root(
        [&] {
          std::error_code ec;
          fs::create_directories(save_dir_, ec);
          MPT_CHECK(!ec, str("create save directory '", save_dir_, "': ", ec.message()), "check --save");
          fs::remove_all(tmp_dir_, ec);  // a previous attempt that crashed
          MPT_CHECK(!ec, str("remove stale '", tmp_dir_, "': ", ec.message()), "");
          fs::create_directory(tmp_dir_, ec);
          MPT_CHECK(!ec, str("create '", tmp_dir_, "': ", ec.message()),
                    "check that --save is writable and has free space");
        },
        "checkpoint begin");
  }
  agreed("create", "create of the HDF5 file",
         [&] { file_ = Hdf5File::create((fs::path(tmp_dir_) / kCheckpointFileName).string(), comm_); });
  // Rank 0's clock, so every rank writes the same value.
  double now = std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  if (g.mpi()) MPI_Bcast(&now, 1, MPI_DOUBLE, 0, g.comm);
  agreed("attrs", "write of the root attributes", [&] {
    file_.set_attr_string("/", kAttrFormat, kCheckpointFormat);
    file_.set_attr_int("/", kAttrVersion, kCheckpointVersion);
    file_.set_attr_int("/", kAttrIteration, iteration);
    file_.set_attr_int("/", kAttrWorldSize, g.size);
    file_.set_attr_string("/", kAttrChecksumAlgo, "crc32c");
    file_.set_attr_double("/", kAttrCreated, now);
  });
}

void CheckpointWriter::add_raw(const std::string& name, const Shape& global_shape, ElemType type,
                               const void* data, const Shape& offset, const Shape& count) {
  MPT_CHECK(file_.is_open(), str("add tensor '", name, "': no checkpoint begun"), "call begin() first");
  const Shape off = offset.empty() ? Shape(global_shape.size(), 0) : offset;
  const Shape cnt = data ? count : Shape(global_shape.size(), 0);
  agreed("write", str("write of dataset '", name, "'"), [&] {
    file_.create_dataset(name, global_shape, type);
    file_.write_raw(name, off, cnt, data, type);
  });
  const uint64_t ds = names_.size();
  names_.push_back(name);
  const size_t esize = elem_size(type);
  nbytes_.push_back(static_cast<uint64_t>(shape_numel(global_shape)) * esize);
  if (!data) return;
  check_finite(name, type, data, static_cast<uint64_t>(shape_numel(cnt)));
  const auto* p = static_cast<const uint8_t*>(data);
  for_each_run(global_shape, off, cnt, esize, [&](uint64_t goff, uint64_t len) {
    runs_.push_back(Run{ds, goff, len, crc32c(p, len)});
    p += len;
  });
}

void CheckpointWriter::add_pieces(const std::string& name, const Shape& global_shape, ElemType type,
                                  const std::vector<Hdf5File::Hyperslab>& pieces, const void* data) {
  MPT_CHECK(file_.is_open(), str("add tensor '", name, "': no checkpoint begun"), "call begin() first");
  agreed("write", str("write of dataset '", name, "'"), [&] {
    file_.create_dataset(name, global_shape, type);
    file_.write_pieces(name, pieces, data, type);
  });
  const uint64_t ds = names_.size();
  names_.push_back(name);
  const size_t esize = elem_size(type);
  nbytes_.push_back(static_cast<uint64_t>(shape_numel(global_shape)) * esize);
  const auto* p = static_cast<const uint8_t*>(data);
  for (const Hdf5File::Hyperslab& h : pieces) {
    if (shape_numel(h.count) == 0) continue;
    check_finite(name, type, p, static_cast<uint64_t>(shape_numel(h.count)));
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
  agreed("attrs", str("write of attribute '", key, "'"), [&] { file_.set_attr_string("/", key, value); });
}
void CheckpointWriter::set_attr_int(const std::string& key, int64_t value) {
  agreed("attrs", str("write of attribute '", key, "'"), [&] { file_.set_attr_int("/", key, value); });
}
void CheckpointWriter::set_attr_double(const std::string& key, double value) {
  agreed("attrs", str("write of attribute '", key, "'"), [&] { file_.set_attr_double("/", key, value); });
}
void CheckpointWriter::set_attr_json(const std::string& key, const nlohmann::json& value) {
  agreed("attrs", str("write of attribute '", key, "'"), [&] { file_.set_attr_json("/", key, value); });
}

std::string CheckpointWriter::commit(int keep_last) {
  MPT_CHECK(file_.is_open(), "checkpoint commit without begin()", "");
  Group g(comm_);

  // 0. Never a checkpoint with NaN or Inf in it (a diverged run): refused on every rank.
  agreed("finite", "check of the values", [&] {
    MPT_CHECK(nonfinite_.empty(),
              str("dataset '", nonfinite_, "' holds non-finite values (NaN or Inf); the checkpoint is not written"),
              "the run diverged; resume from the previous checkpoint with a lower learning rate or "
              "--loss-scale / gradient clipping");
  });

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
  for (size_t ds = 0; ds < names_.size(); ++ds)
    agreed("attrs", str("write of the checksum of dataset '", names_[ds], "'"), [&] {
      file_.set_attr_int(names_[ds], kAttrDatasetCrc, static_cast<int64_t>(crcs[ds]));
      file_.set_attr_int(names_[ds], kAttrDatasetBytes, static_cast<int64_t>(nbytes_[ds]));
    });
  const std::string h5path = file_.path();
  std::vector<std::pair<uint64_t, uint64_t>> data_ranges;  // where the values lie (for the manifest)
  agreed("close", "flush and close of the HDF5 file", [&] {
    for (const std::string& name : names_) {
      const Hdf5File::RawExtent e = file_.raw_extent(name);
      if (e.file_offset >= 0 && e.nbytes > 0) data_ranges.emplace_back(static_cast<uint64_t>(e.file_offset), e.nbytes);
    }
    file_.flush();
    file_.close();
  });

  // 3. Durable before visible: manifest (size and CRCs of the HDF5 metadata,
  // over the final bytes), fsync file, manifest and directory; rename; fsync
  // the parent; tracker. Each step agreed: an error on rank 0 is every rank's.
  agreed("manifest", "manifest and fsync", [&] {
    if (g.rank != 0) return;
    write_checkpoint_manifest(h5path, data_ranges, run_);
    fsync_path(h5path, false);
    fsync_path(tmp_dir_, true);
  });
  const std::string final_path = final_dir();
  agreed("rename", str("rename of '", tmp_dir_, "' to '", final_path, "'"), [&] {
    if (g.rank != 0) return;
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
  });
  agreed("tracker", str("update of '", kTrackerFileName, "'"), [&] {
    if (g.rank != 0) return;
    replace_file((fs::path(save_dir_) / kTrackerFileName).string(), str(iteration_, "\n"));
  });
  if (keep_last > 0 && g.rank == 0) {  // best effort: a failure here loses nothing
    std::error_code ec;
    // Only this run's lineage counts and is pruned: another run's checkpoints in
    // the same directory are not ours to delete.
    std::vector<int64_t> iters, foreign;
    for (const int64_t it : CheckpointReader::list_iterations(save_dir_)) {
      const std::string r = CheckpointReader::run_of(save_dir_, it);
      (std::find(owned_runs_.begin(), owned_runs_.end(), r) != owned_runs_.end() ? iters : foreign).push_back(it);
    }
    if (!foreign.empty())
      log_info("keep_last: ", foreign.size(), " checkpoint(s) of another run in ", save_dir_, " (newest ",
               iteration_dir_name(foreign.back()), ") are kept");
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
  g.barrier();
  log_info("saved checkpoint iteration ", iteration_, " to ", final_path);
  names_.clear();
  nbytes_.clear();
  runs_.clear();
  return final_path;
}

}  // namespace mpitron::io
