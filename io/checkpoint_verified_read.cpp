// io/checkpoint_verified_read.cpp — CheckpointReader::read_verified: one pass that reads and proves the checksums.
#include "io/checkpoint.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
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

namespace fs = std::filesystem;

namespace mpitron::io {

using namespace detail;

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
  // Intact bytes, but never NaN/Inf weights (a file written by another tool,
  // or by a run that diverged before saves refused them): the same refusal on
  // every rank, as damage, so the loader falls back to an older checkpoint.
  g.rethrow_kind(Group::capture_kind([&] {
                   for (const ReadRequest& q : requests) {
                     uint64_t n = 0;
                     for (const Hdf5File::Hyperslab& h : q.pieces) n += static_cast<uint64_t>(shape_numel(h.count));
                     if (n && q.out && values_nonfinite(q.type, q.out, n))
                       throw CheckpointDamaged(str("dataset '", q.name, "' of checkpoint file '", file_.path(),
                                                   "' holds non-finite values (NaN or Inf)"),
                                               "the checkpoint was saved from a diverged run; load an older one",
                                               __FILE__, __LINE__);
                   }
                 }),
                 "checkpoint refused");
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
