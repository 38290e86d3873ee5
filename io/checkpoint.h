// io/checkpoint.h — the checkpoint directory protocol (docs/checkpoint-format.md).
//
//   <save>/iter_0000100/model_optim_rng.h5     one HDF5 file, written collectively
//   <save>/latest_checkpointed_iteration.txt   "100\n": the newest committed one
//
// Tensors are stored in their GLOBAL shape; each rank writes and reads only its
// hyperslab. The writer goes to iter_N.tmp/ and commit() makes it visible:
// close + fsync the file and the directory, barrier, rename to iter_N/, fsync
// the parent, replace the tracker file by write-temp + fsync + rename. A crash
// at any instant leaves the previous checkpoint loadable; *.tmp directories
// are never loaded.
//
// Each dataset carries CRC-32C of its global bytes in row-major order
// (attribute mpitron_crc32c). Ranks checksum the contiguous runs of their own
// hyperslabs and rank 0 joins the runs with crc32c_combine in global order, so
// the value does not depend on how the tensor was split, and commit() also
// proves that the ranks' hyperslabs tile every dataset exactly.
//
// Loading (docs/checkpoint-format.md, "Finding the checkpoint to load"): the
// fast, safe way is CheckpointReader::load_latest with a callback that calls
// read_verified() with this rank's hyperslabs: the file is read once in
// total, the bytes a rank needs are checksummed on their way into its
// buffers, the bytes nobody needs are read by someone so that every dataset's
// CRC is still proved, and a damaged checkpoint makes every rank fall back to
// the previous one together. Typical use (every rank):
//
//   std::vector<float> w(rows * cols);               // this rank's block
//   CheckpointReader r = CheckpointReader::load_latest(dir, comm, [&](const CheckpointReader& c) {
//     c.read_verified({{"model/w", {{{row0, 0}, {rows, cols}}}, w.data(), ElemType::F32}});
//   });
//   if (!r.found()) { /* fresh start */ }           // else w holds verified values
//
// The model decides dataset names and extra attributes; this layer knows
// nothing of models. Communicator: MPI_COMM_NULL (or MPI not initialised)
// means one process and HDF5's serial driver; otherwise every call marked
// "collective" must be made by every rank of comm, in the same order.
#pragma once
#include <mpi.h>

#include <functional>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <vector>

#include "io/hdf5_file.h"

namespace mpitron::io {

constexpr const char* kCheckpointFormat = "mpitron-ckpt";
constexpr int64_t kCheckpointVersion = 1;
constexpr const char* kCheckpointFileName = "model_optim_rng.h5";
constexpr const char* kTrackerFileName = "latest_checkpointed_iteration.txt";
// Attribute names (file root unless noted).
constexpr const char* kAttrFormat = "format";                 // string "mpitron-ckpt"
constexpr const char* kAttrVersion = "version";               // int 1
constexpr const char* kAttrIteration = "iteration";           // int
constexpr const char* kAttrWorldSize = "world_size";          // int, ranks that wrote it
constexpr const char* kAttrCreated = "created_unix_time";     // double
constexpr const char* kAttrChecksumAlgo = "checksum";         // string "crc32c"
constexpr const char* kAttrDatasetCrc = "mpitron_crc32c";     // dataset: int (uint32 value)
constexpr const char* kAttrDatasetBytes = "mpitron_nbytes";   // dataset: int, global bytes

std::string iteration_dir_name(int64_t iteration);  // "iter_0000100"

// Collective, at start-up: rank 0 creates save_dir (and parents) and writes,
// fsyncs and removes a probe file in it; an error (read-only, not a
// directory, full) is thrown on every rank naming the directory, so a bad
// --save is found before training instead of at the first save.
void check_save_dir_writable(const std::string& save_dir, MPI_Comm comm = MPI_COMM_NULL);

class CheckpointWriter {
 public:
  CheckpointWriter() = default;
  CheckpointWriter(const CheckpointWriter&) = delete;
  CheckpointWriter& operator=(const CheckpointWriter&) = delete;
  // Without commit() the file is closed and iter_N.tmp/ stays behind, exactly
  // as after a crash (and is ignored by readers).
  ~CheckpointWriter();

  // Collective. Creates <save_dir>/iter_N.tmp/ (removing a stale one) and the
  // HDF5 file in it, and writes the standard attributes.
  //
  // Failures (every call below): each collective step ends with an agreement
  // across the ranks, so an I/O error on one rank (disk full, read-only,
  // quota) is thrown on EVERY rank, naming the ranks and the step; nothing is
  // renamed, the previous checkpoint and the tracker file stay as they were.
  // A step that hangs inside MPI-IO (a rank died) aborts the job after
  // MPITRON_COMM_TIMEOUT_S (io/io_watchdog.h). MPITRON_TEST_CKPT_FAIL=
  // "<rank>:<step>[:<iteration>]" (tests only) makes the step fail on that
  // rank after it ran, as a full disk would; steps: create, write, attrs,
  // close, manifest, rename, tracker.
  void begin(const std::string& save_dir, int64_t iteration, MPI_Comm comm = MPI_COMM_NULL);

  // Collective: every rank calls it for every tensor, same name/shape/dtype.
  // `local` is this rank's hyperslab (host or device, converted to `dtype`
  // when both are floating) at `offset` in the global shape; an empty offset
  // means zeros. A rank contributing nothing passes Tensor(). The ranks'
  // hyperslabs must tile the dataset (identical duplicates are allowed).
  void add_tensor(const std::string& name, const Shape& global_shape, DType dtype, const Tensor& local,
                  const Shape& offset = {});
  // Several hyperslabs of this rank in one collective call: `data` (host,
  // `type` elements) holds the pieces back to back, in the order their
  // elements occur in the dataset (see Hdf5File::write_pieces). The ranks'
  // pieces must tile the dataset.
  void add_pieces(const std::string& name, const Shape& global_shape, ElemType type,
                  const std::vector<Hdf5File::Hyperslab>& pieces, const void* data);
  // Rank 0 of comm writes the whole tensor, the others nothing. Collective.
  void add_replicated(const std::string& name, const Tensor& whole);
  // Raw form (also f64): `count` elements of `type` at `offset`; data == nullptr: nothing.
  void add_raw(const std::string& name, const Shape& global_shape, ElemType type, const void* data,
               const Shape& offset, const Shape& count);

  // Root attributes (collective, same value on every rank): consumed samples,
  // flags JSON, tokenizer, scheduler state, ...
  void set_attr_string(const std::string& key, const std::string& value);
  void set_attr_int(const std::string& key, int64_t value);
  void set_attr_double(const std::string& key, double value);
  void set_attr_json(const std::string& key, const nlohmann::json& value);
  Hdf5File& file() { return file_; }
  // The run (lineage) writing this checkpoint, recorded in its manifest, and
  // the runs whose checkpoints keep_last may delete: `run` and `also_owned`.
  // Without it the run is "" (checkpoints written before runs were recorded).
  void set_run(const std::string& run, const std::vector<std::string>& also_owned = {});

  // Collective. Refuses (on every rank, committing nothing) when any rank
  // wrote a NaN or Inf into a floating dataset. Writes checksums, closes the
  // file, records its manifest (manifest.json: size and CRCs of the HDF5
  // metadata, checked before any reader parses the file), commits (see top),
  // and then, when
  // keep_last > 0, removes all but the newest keep_last committed checkpoints
  // OF THE OWNED RUNS (set_run; another run's checkpoints in the same
  // directory are never deleted) and stale *.tmp directories of older
  // iterations. Returns the final directory.
  std::string commit(int keep_last = 0);

  bool active() const { return file_.is_open(); }
  int64_t iteration() const { return iteration_; }
  const std::string& tmp_dir() const { return tmp_dir_; }
  std::string final_dir() const;

 private:
  struct Run {  // one contiguous range of a dataset written by this rank
    uint64_t dataset, offset, len, crc;  // offset/len in bytes of the global row-major array
  };
  // Runs one step of the save on every rank under an IoDeadline and agrees on
  // its outcome: if fn failed on any rank, every rank throws the same error
  // (naming the ranks), so none goes on to the next collective alone.
  // `step` names the step for MPITRON_TEST_CKPT_FAIL (fault injection).
  template <typename F> void agreed(const char* step, const std::string& what, const F& fn);
  // Records a dataset with NaN/Inf (checked at commit, on every rank together).
  void check_finite(const std::string& name, ElemType type, const void* data, uint64_t elems);

  std::string save_dir_, tmp_dir_;
  std::string run_;
  std::vector<std::string> owned_runs_{""};
  std::string nonfinite_;  // first dataset this rank wrote with a NaN or Inf
  bool failed_ = false;    // a step failed (on some rank): the file is garbage
  int64_t iteration_ = -1;
  MPI_Comm comm_ = MPI_COMM_NULL;
  Hdf5File file_;
  std::vector<std::string> names_;   // datasets in creation order
  std::vector<uint64_t> nbytes_;     // global bytes of each
  std::vector<Run> runs_;
};

struct TensorInfo {
  std::string name;
  Shape shape;    // global
  ElemType type;
};

// A checkpoint that must not be used: a stored checksum does not match the
// data, the file is shorter than its datasets, or reading it failed. Thrown
// by CheckpointReader::read_verified (and verify_all) with the same text on
// every rank; CheckpointReader::load_latest catches exactly this type and
// falls back to the previous checkpoint.
class CheckpointDamaged : public Error {
 public:
  using Error::Error;
};

// One dataset's part that this rank wants (CheckpointReader::read_verified):
// the hyperslabs `pieces` (offset, count in the dataset's global shape) land in
// `out` back to back, each row-major, in the order of `pieces` -- the layout
// CheckpointWriter::add_pieces writes from. `type` is the element type of
// `out`; when it is the dataset's own type the bytes are copied raw (the fast
// path), another numeric type is converted by HDF5 (never between a 16-bit
// float and anything else). Pieces with a zero count are skipped; a scalar
// dataset takes one piece with offset = count = {}. `out` is host memory that
// must hold sum(numel(count)) elements and stay valid during the call.
// `expect_shape`, when not empty, is the global shape the caller expects: a
// dataset of another shape is an error (reported collectively, like every
// request error, so no rank has to check before the collective call).
struct ReadRequest {
  std::string name;
  std::vector<Hdf5File::Hyperslab> pieces;
  void* out = nullptr;
  ElemType type = ElemType::F32;
  Shape expect_shape = {};
};

// Which datasets read_verified proves intact.
enum class VerifyScope {
  AllDatasets,        // every dataset of the file (what open_latest(verify=true) proves)
  RequestedDatasets,  // only datasets that some rank asked for (e.g. weights only, no optimizer state)
};

class CheckpointReader {
 public:
  CheckpointReader() = default;
  CheckpointReader(CheckpointReader&&) noexcept = default;
  CheckpointReader& operator=(CheckpointReader&&) noexcept = default;

  // Collective. The newest intact checkpoint in load_dir: the tracker file's
  // iteration first, then every committed iter_* directory newest first, each
  // one skipped with a warning saying why (missing, truncated, bad checksum).
  // found() is false when load_dir holds no checkpoint at all; throws when
  // some exist but none is intact. verify: check every checksum (reads the
  // whole file once, datasets shared among the ranks of comm).
  static CheckpointReader open_latest(const std::string& load_dir, MPI_Comm comm = MPI_COMM_NULL,
                                      bool verify = true);
  // Collective. That iteration or an error.
  static CheckpointReader open_iteration(const std::string& load_dir, int64_t iteration,
                                         MPI_Comm comm = MPI_COMM_NULL, bool verify = true);

  // Collective: load the newest intact checkpoint with ONE pass over the data.
  // Candidates in open_latest's order (tracker, then iter_* newest first); each
  // is opened without the verification pass (open_iteration(verify=false):
  // missing, truncated or foreign files are skipped with a warning, as in
  // open_latest), then `load(reader)` runs on every rank; it is expected to
  // call reader.read_verified(requests) ONCE, with all of this rank's
  // requests, to fill its buffers (each call verifies its whole scope). When
  // `load` throws CheckpointDamaged (read_verified found a bad checksum or a
  // short file, on every rank alike) the candidate is skipped with a warning
  // and `load` runs again on the next older one, so `load` must (re)write all
  // of its outputs each time. Any other exception propagates at once (a model
  // that does not match the checkpoint is not a reason to fall back). Returns
  // the reader of the checkpoint that loaded (found() false, `load` never
  // called, when load_dir holds no checkpoint); throws "no intact checkpoint"
  // when checkpoints exist but none loaded. Values written by `load` may be
  // used only after load_latest returns.
  static CheckpointReader load_latest(const std::string& load_dir, MPI_Comm comm,
                                      const std::function<void(const CheckpointReader&)>& load);

  // The tracker file's iteration; -1 when it is missing or unreadable.
  static int64_t read_tracker(const std::string& load_dir);
  // Committed iterations (iter_N directories, *.tmp ignored), ascending.
  static std::vector<int64_t> list_iterations(const std::string& load_dir);
  // The run (lineage) that wrote committed iteration `iteration` ("" when not recorded).
  static std::string run_of(const std::string& load_dir, int64_t iteration);
  // Committed iterations written by a run not in `owned`, ascending.
  static std::vector<int64_t> foreign_iterations(const std::string& load_dir, const std::vector<std::string>& owned);

  bool found() const { return file_.is_open(); }
  int64_t iteration() const { return iteration_; }
  const std::string& dir() const { return dir_; }
  const std::string& path() const { return file_.path(); }

  std::vector<TensorInfo> tensors() const;  // every dataset, sorted by name
  bool has_tensor(const std::string& name) const { return file_.has_dataset(name); }
  TensorInfo tensor_info(const std::string& name) const;
  Tensor read(const std::string& name) const;  // whole, host
  Tensor read(const std::string& name, const Shape& offset, const Shape& count) const;  // host
  void read_raw(const std::string& name, const Shape& offset, const Shape& count, void* out, ElemType type) const;

  // Collective (every rank of the reader's communicator calls it, each with
  // its own list, possibly empty): reads this rank's requests into their
  // buffers AND proves the checksums, reading the file once in total:
  //  1. each rank reads its requests (straight from the file for contiguous
  //     datasets, in file order, large reads; a block of whole rows is one
  //     contiguous range) and computes CRC-32C of every contiguous range it read;
  //  2. rank 0 gathers the ranges, picks per dataset a tiling of the ranges
  //     (identical ranges read by several ranks -- replicas -- count once, and
  //     must agree), and deals every byte range that NO rank read out to the
  //     ranks in file order (balanced), which read and checksum them;
  //  3. rank 0 joins the CRCs with crc32c_combine in global order and compares
  //     each dataset's result with its stored mpitron_crc32c.
  // Datasets checked: all of the file (scope AllDatasets) or only those some
  // rank requested (RequestedDatasets). Throws CheckpointDamaged, the same
  // text on every rank, naming dataset and file ("checksum mismatch in dataset
  // 'NAME' of checkpoint file 'PATH': stored 0x.., computed 0x..", or a short
  // read / read failure); the buffers' contents are then undefined. Throws a
  // plain Error on every rank for a bad request (unknown dataset, another
  // shape than expect_shape, hyperslab outside the shape, a type that cannot
  // be converted), before anything is read. Returns only when
  // every checked dataset is intact. Each call verifies its whole scope again:
  // make ONE call with all of this rank's requests, not one per dataset.
  void read_verified(const std::vector<ReadRequest>& requests,
                     VerifyScope scope = VerifyScope::AllDatasets) const;

  // Throws (naming dataset and file) when the stored checksum does not match
  // the data. Not collective; reads the whole dataset through HDF5.
  void verify(const std::string& name) const;
  // Collective: every dataset verified once across the ranks (read_verified
  // with no requests: the file dealt out to the ranks in file order); all
  // ranks throw the same CheckpointDamaged when any fails.
  void verify_all() const;

  bool has_attr(const std::string& key) const { return file_.has_attr("/", key); }
  std::string attr_string(const std::string& key) const { return file_.attr_string("/", key); }
  int64_t attr_int(const std::string& key) const { return file_.attr_int("/", key); }
  double attr_double(const std::string& key) const { return file_.attr_double("/", key); }
  nlohmann::json attr_json(const std::string& key) const;
  const Hdf5File& file() const { return file_; }

 private:
  const std::vector<std::string>& dataset_names() const;  // sorted; computed once

  Hdf5File file_;
  mutable std::vector<std::string> names_;
  mutable bool names_ready_ = false;
  std::string dir_;
  int64_t iteration_ = -1;
  MPI_Comm comm_ = MPI_COMM_NULL;
};

}  // namespace mpitron::io
