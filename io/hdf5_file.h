// io/hdf5_file.h — a thin RAII wrapper over (parallel) HDF5.
//
// One Hdf5File is one open HDF5 file. Given an MPI communicator (and MPI is
// initialised) it uses the MPI-IO driver and every rank of the communicator
// must make the same create/attribute/write calls in the same order
// (collective); otherwise it uses HDF5's default serial driver.
//
// Datasets hold a GLOBAL shape; a rank writes or reads a hyperslab
// (offset, count) of it from or into a contiguous row-major host buffer.
// Element types on disk (little-endian):
//   f32 IEEE_F32LE   f64 IEEE_F64LE   i32 STD_I32LE   i64 STD_I64LE   u16 STD_U16LE
//   bf16, f16: STD_U16LE holding the bit pattern, plus a string attribute
//              mpitron_dtype = "bf16" | "f16" (HDF5 1.10 has no half types
//              that every reader understands).
// Layout is contiguous (no chunking, no filters), so a dataset's bytes are one
// range of the file (see data_file_offset).
//
// Every HDF5 failure becomes an mpitron::Error naming the operation, the file,
// the object and HDF5's own innermost message; HDF5's automatic stderr dump is
// switched off.
#pragma once
#include <hdf5.h>
#include <mpi.h>

#include <nlohmann/json_fwd.hpp>
#include <optional>
#include <string>
#include <vector>

#include "tensor/tensor.h"

namespace mpitron::io {

// What an HDF5 dataset holds: the tensor dtypes plus f64 (schedule state etc.).
enum class ElemType : uint8_t { F32, BF16, F16, I32, I64, U16, F64 };

ElemType elem_type_of(DType t);
DType dtype_of(ElemType t);  // throws for F64 (no tensor dtype)
size_t elem_size(ElemType t);
const char* elem_name(ElemType t);           // "f32", "bf16", "f16", "i32", "i64", "u16", "f64"
ElemType elem_type_from_name(const std::string& name);

struct DatasetInfo {
  Shape shape;    // global shape; {} for a scalar dataset
  ElemType type;
};

// A closing wrapper around an hid_t (file, dataset, dataspace, ...).
class H5Handle {
 public:
  H5Handle() = default;
  H5Handle(hid_t id, herr_t (*closer)(hid_t)) : id_(id), closer_(closer) {}
  H5Handle(H5Handle&& o) noexcept : id_(o.id_), closer_(o.closer_) { o.id_ = -1; }
  H5Handle& operator=(H5Handle&& o) noexcept;
  H5Handle(const H5Handle&) = delete;
  H5Handle& operator=(const H5Handle&) = delete;
  ~H5Handle() { reset(); }
  hid_t get() const { return id_; }
  bool valid() const { return id_ >= 0; }
  herr_t reset();  // closes; returns the closer's status (0 when nothing to close)

 private:
  hid_t id_ = -1;
  herr_t (*closer_)(hid_t) = nullptr;
};

class Hdf5File {
 public:
  Hdf5File() = default;
  Hdf5File(Hdf5File&&) noexcept = default;
  Hdf5File& operator=(Hdf5File&&) noexcept;
  ~Hdf5File();  // closes quietly (errors are logged); call close() to see them

  // Creates (truncating) `path`. comm == MPI_COMM_NULL, or MPI not initialised:
  // serial driver. Collective over comm.
  static Hdf5File create(const std::string& path, MPI_Comm comm = MPI_COMM_NULL);
  // Opens an existing file read-only (or read-write). Collective over comm.
  static Hdf5File open(const std::string& path, bool writable = false, MPI_Comm comm = MPI_COMM_NULL);

  bool is_open() const { return file_.valid(); }
  bool parallel() const { return parallel_; }
  const std::string& path() const { return path_; }

  void flush();  // collective; with MPI-IO this syncs the file (MPI_File_sync)
  void close();  // collective; throws on failure

  // ---- datasets (names may contain '/', groups are created as needed) ----
  // Collective: every rank passes the same name, shape and type.
  void create_dataset(const std::string& name, const Shape& global_shape, ElemType type);
  bool has_dataset(const std::string& name) const;
  DatasetInfo dataset_info(const std::string& name) const;
  // Every dataset in the file, full names without the leading '/', sorted.
  std::vector<std::string> list_datasets() const;

  // Writes the hyperslab at `offset` of shape `count` from `data` (row-major,
  // contiguous, `type` elements). Collective in parallel mode: a rank with
  // nothing to write passes count with a zero (or data == nullptr) and takes
  // part with an empty selection. A scalar dataset takes offset = count = {}.
  void write_raw(const std::string& name, const Shape& offset, const Shape& count, const void* data,
                 ElemType type);
  // Several hyperslabs in one collective write: `data` holds each piece's
  // elements (row-major) back to back, in the order of `pieces`, which must be
  // the order in which the pieces' elements occur in the dataset's row-major
  // order (pieces sorted by position that never interleave within a row).
  // An empty list takes part with nothing.
  struct Hyperslab {
    Shape offset, count;
  };
  void write_pieces(const std::string& name, const std::vector<Hyperslab>& pieces, const void* data, ElemType type);
  // Same, from a host (or device: copied) tensor whose shape is the count.
  // An undefined Tensor() means "nothing from this rank".
  void write(const std::string& name, const Shape& offset, const Tensor& local);

  // Reads a hyperslab (independent, not collective) into `out` (row-major).
  void read_raw(const std::string& name, const Shape& offset, const Shape& count, void* out,
                ElemType type) const;
  Tensor read(const std::string& name, const Shape& offset, const Shape& count) const;  // host tensor
  Tensor read(const std::string& name) const;  // the whole dataset

  // Byte offset of a contiguous dataset's data in the file; -1 when it has no
  // storage yet. (Tests use it to corrupt data on purpose.)
  int64_t data_file_offset(const std::string& name) const;

  // Where a dataset's bytes lie, for reading them without HDF5 (the verified
  // checkpoint reader does): `file_offset` is the first data byte in the file,
  // or -1 unless the storage is contiguous, allocated and inside this file (not
  // chunked, not external). `native`: the bytes on disk are exactly the
  // in-memory bytes of `info.type` on this host (so raw bytes need no
  // conversion and their CRC is the CRC of the values).
  struct RawExtent {
    DatasetInfo info;
    uint64_t nbytes = 0;  // numel x element size
    int64_t file_offset = -1;
    bool native = false;
  };
  RawExtent raw_extent(const std::string& name) const;

  // ---- attributes: obj "" or "/" is the file's root group, else a dataset ----
  // Writing is collective in parallel mode (same values on every rank).
  // Strings are fixed-length UTF-8; integers I64LE; doubles F64LE; JSON is a
  // string attribute holding its compact dump.
  void set_attr_string(const std::string& obj, const std::string& key, const std::string& value);
  void set_attr_int(const std::string& obj, const std::string& key, int64_t value);
  void set_attr_double(const std::string& obj, const std::string& key, double value);
  void set_attr_json(const std::string& obj, const std::string& key, const nlohmann::json& value);
  bool has_attr(const std::string& obj, const std::string& key) const;
  std::vector<std::string> attr_names(const std::string& obj) const;
  std::string attr_string(const std::string& obj, const std::string& key) const;
  int64_t attr_int(const std::string& obj, const std::string& key) const;
  double attr_double(const std::string& obj, const std::string& key) const;
  // Several integer attributes of one object with one open; absent ones are nullopt.
  std::vector<std::optional<int64_t>> attr_ints(const std::string& obj, const std::vector<std::string>& keys) const;
  nlohmann::json attr_json(const std::string& obj, const std::string& key) const;

 private:
  H5Handle open_dataset(const std::string& name, const char* op) const;
  H5Handle open_object(const std::string& obj, const char* op) const;
  H5Handle open_attr(const std::string& obj, const std::string& key, const char* op) const;
  void write_attr(const std::string& obj, const std::string& key, hid_t file_type, hid_t mem_type,
                  const void* value);
  void close_impl(bool throw_on_error);

  H5Handle file_;
  std::string path_;
  bool parallel_ = false;
};

}  // namespace mpitron::io
