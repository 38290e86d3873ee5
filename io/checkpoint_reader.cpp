// io/checkpoint_reader.cpp — CheckpointReader: finding, verifying and opening a checkpoint, with fallback.
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
#include <optional>
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

std::string CheckpointReader::run_of(const std::string& load_dir, int64_t iteration) {
  return checkpoint_run((fs::path(load_dir) / iteration_dir_name(iteration)).string());
}

std::vector<int64_t> CheckpointReader::foreign_iterations(const std::string& load_dir,
                                                          const std::vector<std::string>& owned) {
  std::vector<int64_t> out;
  for (const int64_t it : list_iterations(load_dir))
    if (std::find(owned.begin(), owned.end(), run_of(load_dir, it)) == owned.end()) out.push_back(it);
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
  // libhdf5 may crash on damaged metadata: rank 0 proves the file's size and
  // every metadata byte against manifest.json first, and every rank learns the
  // verdict (CheckpointDamaged everywhere) before anyone calls H5Fopen.
  std::optional<IoDeadline> deadline;
  deadline.emplace(str("open of checkpoint '", path, "'"));
  bool legacy = false;
  g.rethrow_kind(Group::capture_kind([&] {
                   if (g.rank == 0) legacy = !verify_checkpoint_manifest(path);
                 }),
                 "checkpoint");
  if (legacy)
    log_warn("checkpoint '", path, "' has no ", kManifestFileName,
             " (written by an older mpitron): its HDF5 metadata cannot be verified before HDF5 reads it");
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
  deadline.reset();  // the verification pass below may take long on a big file; it has its own agreements
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

}  // namespace mpitron::io
