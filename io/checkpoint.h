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
// The model decides dataset names and extra attributes; this layer knows
// nothing of models. Communicator: MPI_COMM_NULL (or MPI not initialised)
// means one process and HDF5's serial driver; otherwise every call marked
// "collective" must be made by every rank of comm, in the same order.
#pragma once
#include <mpi.h>

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
  void begin(const std::string& save_dir, int64_t iteration, MPI_Comm comm = MPI_COMM_NULL);

  // Collective: every rank calls it for every tensor, same name/shape/dtype.
  // `local` is this rank's hyperslab (host or device, converted to `dtype`
  // when both are floating) at `offset` in the global shape; an empty offset
  // means zeros. A rank contributing nothing passes Tensor(). The ranks'
  // hyperslabs must tile the dataset (identical duplicates are allowed).
  void add_tensor(const std::string& name, const Shape& global_shape, DType dtype, const Tensor& local,
                  const Shape& offset = {});
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

  // Collective. Writes checksums, commits (see top), and then, when
  // keep_last > 0, removes all but the newest keep_last committed checkpoints
  // and stale *.tmp directories of older iterations. Returns the final directory.
  std::string commit(int keep_last = 0);

  bool active() const { return file_.is_open(); }
  int64_t iteration() const { return iteration_; }
  const std::string& tmp_dir() const { return tmp_dir_; }
  std::string final_dir() const;

 private:
  struct Run {  // one contiguous range of a dataset written by this rank
    uint64_t dataset, offset, len, crc;  // offset/len in bytes of the global row-major array
  };
  std::string save_dir_, tmp_dir_;
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

  // The tracker file's iteration; -1 when it is missing or unreadable.
  static int64_t read_tracker(const std::string& load_dir);
  // Committed iterations (iter_N directories, *.tmp ignored), ascending.
  static std::vector<int64_t> list_iterations(const std::string& load_dir);

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

  // Throws (naming dataset and file) when the stored checksum does not match
  // the data. Not collective.
  void verify(const std::string& name) const;
  // Collective: every dataset verified once across the ranks; all ranks throw
  // the same error when any fails.
  void verify_all() const;

  bool has_attr(const std::string& key) const { return file_.has_attr("/", key); }
  std::string attr_string(const std::string& key) const { return file_.attr_string("/", key); }
  int64_t attr_int(const std::string& key) const { return file_.attr_int("/", key); }
  double attr_double(const std::string& key) const { return file_.attr_double("/", key); }
  nlohmann::json attr_json(const std::string& key) const;
  const Hdf5File& file() const { return file_; }

 private:
  Hdf5File file_;
  std::string dir_;
  int64_t iteration_ = -1;
  MPI_Comm comm_ = MPI_COMM_NULL;
};

}  // namespace mpitron::io
