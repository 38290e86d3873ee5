// io/hdf5_file.cpp — Hdf5File: HDF5 calls, each checked, each failure an mpitron::Error.
#include "io/hdf5_file.h"

#include <algorithm>
#include <cstring>
#include <nlohmann/json.hpp>

#include "core/log.h"

namespace mpitron::io {

// ---------------------------------------------------------------- element types

ElemType elem_type_of(DType t) {
  switch (t) {
    case DType::F32: return ElemType::F32;
    case DType::BF16: return ElemType::BF16;
    case DType::F16: return ElemType::F16;
    case DType::I32: return ElemType::I32;
    case DType::I64: return ElemType::I64;
    case DType::U16: return ElemType::U16;
  }
  MPT_THROW(str("unknown dtype ", static_cast<int>(t)), "");
}

DType dtype_of(ElemType t) {
  switch (t) {
    case ElemType::F32: return DType::F32;
    case ElemType::BF16: return DType::BF16;
    case ElemType::F16: return DType::F16;
    case ElemType::I32: return DType::I32;
    case ElemType::I64: return DType::I64;
    case ElemType::U16: return DType::U16;
    case ElemType::F64: break;
  }
  MPT_THROW("f64 datasets have no tensor dtype", "read them with Hdf5File::read_raw into doubles");
}

size_t elem_size(ElemType t) {
  switch (t) {
    case ElemType::F32: case ElemType::I32: return 4;
    case ElemType::BF16: case ElemType::F16: case ElemType::U16: return 2;
    case ElemType::I64: case ElemType::F64: return 8;
  }
  return 0;
}

const char* elem_name(ElemType t) {
  switch (t) {
    case ElemType::F32: return "f32";
    case ElemType::BF16: return "bf16";
    case ElemType::F16: return "f16";
    case ElemType::I32: return "i32";
    case ElemType::I64: return "i64";
    case ElemType::U16: return "u16";
    case ElemType::F64: return "f64";
  }
  return "?";
}

ElemType elem_type_from_name(const std::string& name) {
  for (ElemType t : {ElemType::F32, ElemType::BF16, ElemType::F16, ElemType::I32, ElemType::I64,
                     ElemType::U16, ElemType::F64})
    if (name == elem_name(t)) return t;
  MPT_THROW(str("unknown element type '", name, "'"), "use one of f32 bf16 f16 i32 i64 u16 f64");
}

namespace {

constexpr const char* kDtypeAttr = "mpitron_dtype";

hid_t file_type(ElemType t) {
  switch (t) {
    case ElemType::F32: return H5T_IEEE_F32LE;
    case ElemType::F64: return H5T_IEEE_F64LE;
    case ElemType::I32: return H5T_STD_I32LE;
    case ElemType::I64: return H5T_STD_I64LE;
    case ElemType::BF16: case ElemType::F16: case ElemType::U16: return H5T_STD_U16LE;
  }
  return -1;
}

hid_t mem_type(ElemType t) {
  switch (t) {
    case ElemType::F32: return H5T_NATIVE_FLOAT;
    case ElemType::F64: return H5T_NATIVE_DOUBLE;
    case ElemType::I32: return H5T_NATIVE_INT32;
    case ElemType::I64: return H5T_NATIVE_INT64;
    case ElemType::BF16: case ElemType::F16: case ElemType::U16: return H5T_NATIVE_UINT16;
  }
  return -1;
}

bool is_half(ElemType t) { return t == ElemType::BF16 || t == ElemType::F16; }

// HDF5 prints its error stack to stderr by default; we turn that off once and
// build our own messages from the stack instead.
void quiet_hdf5() {
  static const bool done = [] {
    H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
    return true;
  }();
  (void)done;
}

herr_t collect_error(unsigned n, const H5E_error2_t* e, void* out) {
  auto* msgs = static_cast<std::vector<std::string>*>(out);
  if (e->desc && *e->desc) msgs->push_back(str(e->func_name ? e->func_name : "?", ": ", e->desc));
  return 0;
}

// HDF5's error stack, innermost (the actual cause) first.
std::string hdf5_stack() {
  std::vector<std::string> msgs;
  H5Ewalk2(H5E_DEFAULT, H5E_WALK_UPWARD, collect_error, &msgs);
  H5Eclear2(H5E_DEFAULT);
  std::string s;
  for (size_t i = 0; i < msgs.size() && i < 4; ++i) s += (i ? "; " : "") + msgs[i];
  return s.empty() ? "no HDF5 error detail" : s;
}

[[noreturn]] void h5_fail(const std::string& op, const std::string& file, const std::string& obj,
                          const std::string& hint = "") {
  std::string what = str("HDF5 ", op, " failed: file '", file, "'");
  if (!obj.empty()) what += str(", object '", obj, "'");
  what += str(": ", hdf5_stack());
  MPT_THROW(what, hint);
}

std::string obj_path(const std::string& obj) { return obj.empty() ? "/" : obj; }

bool mpi_ready() {
  int init = 0, fin = 0;
  MPI_Initialized(&init);
  MPI_Finalized(&fin);
  return init && !fin;
}

H5Handle make_fapl(MPI_Comm comm, bool* parallel, const std::string& path) {
  H5Handle fapl(H5Pcreate(H5P_FILE_ACCESS), H5Pclose);
  if (!fapl.valid()) h5_fail("H5Pcreate(file access)", path, "");
  *parallel = comm != MPI_COMM_NULL && mpi_ready();
  if (*parallel) {
    if (H5Pset_fapl_mpio(fapl.get(), comm, MPI_INFO_NULL) < 0) h5_fail("H5Pset_fapl_mpio", path, "");
    // Metadata written collectively (one writer, not every rank).
    if (H5Pset_coll_metadata_write(fapl.get(), true) < 0) h5_fail("H5Pset_coll_metadata_write", path, "");
  }
  // The 1.8 object format: attributes larger than 64 KiB (long flag JSON) go to dense storage.
  if (H5Pset_libver_bounds(fapl.get(), H5F_LIBVER_V18, H5F_LIBVER_LATEST) < 0)
    h5_fail("H5Pset_libver_bounds", path, "");
  return fapl;
}

}  // namespace

// ---------------------------------------------------------------- handles

H5Handle& H5Handle::operator=(H5Handle&& o) noexcept {
  if (this != &o) {
    reset();
    id_ = o.id_;
    closer_ = o.closer_;
    o.id_ = -1;
  }
  return *this;
}

herr_t H5Handle::reset() {
  herr_t rc = 0;
  if (id_ >= 0 && closer_) rc = closer_(id_);
  id_ = -1;
  return rc;
}

// ---------------------------------------------------------------- file

Hdf5File& Hdf5File::operator=(Hdf5File&& o) noexcept {
  if (this != &o) {
    close_impl(false);
    file_ = std::move(o.file_);
    path_ = std::move(o.path_);
    parallel_ = o.parallel_;
  }
  return *this;
}

Hdf5File::~Hdf5File() { close_impl(false); }

Hdf5File Hdf5File::create(const std::string& path, MPI_Comm comm) {
  quiet_hdf5();
  Hdf5File f;
  f.path_ = path;
  H5Handle fapl = make_fapl(comm, &f.parallel_, path);
  hid_t id = H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, fapl.get());
  if (id < 0) h5_fail("H5Fcreate", path, "", "check that the directory exists and is writable");
  f.file_ = H5Handle(id, H5Fclose);
  return f;
}

Hdf5File Hdf5File::open(const std::string& path, bool writable, MPI_Comm comm) {
  quiet_hdf5();
  Hdf5File f;
  f.path_ = path;
  H5Handle fapl = make_fapl(comm, &f.parallel_, path);
  hid_t id = H5Fopen(path.c_str(), writable ? H5F_ACC_RDWR : H5F_ACC_RDONLY, fapl.get());
  if (id < 0)
    h5_fail("H5Fopen", path, "",
            "the file is missing, not HDF5, or truncated (an interrupted copy or a full disk)");
  f.file_ = H5Handle(id, H5Fclose);
  return f;
}

void Hdf5File::flush() {
  MPT_CHECK(is_open(), str("flush of a closed HDF5 file '", path_, "'"), "");
  if (H5Fflush(file_.get(), H5F_SCOPE_GLOBAL) < 0) h5_fail("H5Fflush", path_, "");
}

void Hdf5File::close() { close_impl(true); }

void Hdf5File::close_impl(bool throw_on_error) {
  if (!file_.valid()) return;
  if (file_.reset() < 0) {
    if (throw_on_error) h5_fail("H5Fclose", path_, "", "the disk may be full or the file system gone");
    log_warn("HDF5 H5Fclose failed for '", path_, "': ", hdf5_stack());
  }
}

// ---------------------------------------------------------------- datasets

H5Handle Hdf5File::open_dataset(const std::string& name, const char* op) const {
  MPT_CHECK(is_open(), str(op, ": HDF5 file '", path_, "' is not open"), "");
  quiet_hdf5();
  hid_t id = H5Dopen2(file_.get(), name.c_str(), H5P_DEFAULT);
  if (id < 0) h5_fail(str(op, " (H5Dopen)"), path_, name, "list the file's datasets with h5ls -r");
  return H5Handle(id, H5Dclose);
}

H5Handle Hdf5File::open_object(const std::string& obj, const char* op) const {
  MPT_CHECK(is_open(), str(op, ": HDF5 file '", path_, "' is not open"), "");
  quiet_hdf5();
  hid_t id = H5Oopen(file_.get(), obj_path(obj).c_str(), H5P_DEFAULT);
  if (id < 0) h5_fail(str(op, " (H5Oopen)"), path_, obj_path(obj));
  return H5Handle(id, H5Oclose);
}

void Hdf5File::create_dataset(const std::string& name, const Shape& global_shape, ElemType type) {
  MPT_CHECK(is_open(), str("create_dataset: HDF5 file '", path_, "' is not open"), "");
  quiet_hdf5();
  for (int64_t d : global_shape)
    MPT_CHECK(d >= 0, str("create_dataset '", name, "' in '", path_, "': negative dim in ", shape_str(global_shape)),
              "");
  H5Handle lcpl(H5Pcreate(H5P_LINK_CREATE), H5Pclose);
  H5Handle dcpl(H5Pcreate(H5P_DATASET_CREATE), H5Pclose);
  if (!lcpl.valid() || !dcpl.valid()) h5_fail("H5Pcreate", path_, name);
  if (H5Pset_create_intermediate_group(lcpl.get(), 1) < 0 || H5Pset_layout(dcpl.get(), H5D_CONTIGUOUS) < 0 ||
      H5Pset_fill_time(dcpl.get(), H5D_FILL_TIME_NEVER) < 0)
    h5_fail("dataset property setup", path_, name);
  std::vector<hsize_t> dims(global_shape.begin(), global_shape.end());
  H5Handle space(global_shape.empty() ? H5Screate(H5S_SCALAR)
                                      : H5Screate_simple(static_cast<int>(dims.size()), dims.data(), nullptr),
                 H5Sclose);
  if (!space.valid()) h5_fail("H5Screate", path_, name);
  hid_t id = H5Dcreate2(file_.get(), name.c_str(), file_type(type), space.get(), lcpl.get(), dcpl.get(),
                        H5P_DEFAULT);
  if (id < 0) h5_fail(str("H5Dcreate ", elem_name(type), shape_str(global_shape)), path_, name,
                      "a dataset of that name may already exist");
  H5Handle ds(id, H5Dclose);
  ds.reset();
  if (is_half(type)) set_attr_string(name, kDtypeAttr, elem_name(type));
}

bool Hdf5File::has_dataset(const std::string& name) const {
  MPT_CHECK(is_open(), str("has_dataset: HDF5 file '", path_, "' is not open"), "");
  quiet_hdf5();
  // Walk the path so a missing intermediate group is "no" rather than an error.
  size_t pos = 0;
  while (true) {
    pos = name.find('/', pos + 1);
    const std::string prefix = name.substr(0, pos);
    if (!prefix.empty() && H5Lexists(file_.get(), prefix.c_str(), H5P_DEFAULT) <= 0) {
      H5Eclear2(H5E_DEFAULT);
      return false;
    }
    if (pos == std::string::npos) break;
  }
  H5Handle obj(H5Oopen(file_.get(), name.c_str(), H5P_DEFAULT), H5Oclose);
  if (!obj.valid()) {
    H5Eclear2(H5E_DEFAULT);
    return false;
  }
  return H5Iget_type(obj.get()) == H5I_DATASET;
}

DatasetInfo Hdf5File::dataset_info(const std::string& name) const {
  H5Handle ds = open_dataset(name, "dataset_info");
  H5Handle space(H5Dget_space(ds.get()), H5Sclose);
  H5Handle type(H5Dget_type(ds.get()), H5Tclose);
  if (!space.valid() || !type.valid()) h5_fail("H5Dget_space/H5Dget_type", path_, name);
  DatasetInfo info;
  const int nd = H5Sget_simple_extent_ndims(space.get());
  if (nd < 0) h5_fail("H5Sget_simple_extent_ndims", path_, name);
  std::vector<hsize_t> dims(static_cast<size_t>(nd));
  if (nd > 0 && H5Sget_simple_extent_dims(space.get(), dims.data(), nullptr) < 0)
    h5_fail("H5Sget_simple_extent_dims", path_, name);
  info.shape.assign(dims.begin(), dims.end());
  const H5T_class_t cls = H5Tget_class(type.get());
  const size_t size = H5Tget_size(type.get());
  if (cls == H5T_FLOAT && size == 4) {
    info.type = ElemType::F32;
  } else if (cls == H5T_FLOAT && size == 8) {
    info.type = ElemType::F64;
  } else if (cls == H5T_INTEGER && H5Tget_sign(type.get()) == H5T_SGN_2 && (size == 4 || size == 8)) {
    info.type = size == 4 ? ElemType::I32 : ElemType::I64;
  } else if (cls == H5T_INTEGER && H5Tget_sign(type.get()) == H5T_SGN_NONE && size == 2) {
    info.type = ElemType::U16;
    if (has_attr(name, kDtypeAttr)) info.type = elem_type_from_name(attr_string(name, kDtypeAttr));
  } else {
    MPT_THROW(str("dataset '", name, "' in '", path_, "' has an HDF5 type mpitron does not read (class ",
                  static_cast<int>(cls), ", ", size, " bytes)"),
              "mpitron reads f32 f64 i32 i64 u16 (and bf16/f16 stored as u16 with attribute mpitron_dtype)");
  }
  return info;
}

namespace {
herr_t collect_link(hid_t group, const char* name, const H5L_info_t* info, void* out) {
  if (info->type != H5L_TYPE_HARD) return 0;
  H5Handle obj(H5Oopen(group, name, H5P_DEFAULT), H5Oclose);
  if (obj.valid() && H5Iget_type(obj.get()) == H5I_DATASET)
    static_cast<std::vector<std::string>*>(out)->push_back(name);
  return 0;
}
}  // namespace

std::vector<std::string> Hdf5File::list_datasets() const {
  MPT_CHECK(is_open(), str("list_datasets: HDF5 file '", path_, "' is not open"), "");
  quiet_hdf5();
  std::vector<std::string> names;
  if (H5Lvisit(file_.get(), H5_INDEX_NAME, H5_ITER_INC, collect_link, &names) < 0)
    h5_fail("H5Lvisit", path_, "/");
  std::sort(names.begin(), names.end());
  return names;
}

namespace {

// File and memory dataspaces for a hyperslab; `none` selects nothing (a rank
// taking part in a collective call without data).
struct Selection {
  H5Handle file_space, mem_space;
};

Selection select(hid_t ds, const std::string& path, const std::string& name, const Shape& offset,
                 const Shape& count, bool none, const char* op) {
  Selection s;
  s.file_space = H5Handle(H5Dget_space(ds), H5Sclose);
  if (!s.file_space.valid()) h5_fail(str(op, " (H5Dget_space)"), path, name);
  const int nd = H5Sget_simple_extent_ndims(s.file_space.get());
  std::vector<hsize_t> dims(static_cast<size_t>(std::max(nd, 0)));
  if (nd > 0) H5Sget_simple_extent_dims(s.file_space.get(), dims.data(), nullptr);
  MPT_CHECK(static_cast<int>(offset.size()) == nd && static_cast<int>(count.size()) == nd,
            str(op, " of dataset '", name, "' in '", path, "': offset ", shape_str(offset), " and count ",
                shape_str(count), " must have ", nd, " dims (dataset shape ", shape_str(Shape(dims.begin(), dims.end())), ")"),
            "");
  bool empty = none;
  for (int i = 0; i < nd; ++i) {
    MPT_CHECK(offset[i] >= 0 && count[i] >= 0 && static_cast<hsize_t>(offset[i] + count[i]) <= dims[i],
              str(op, " of dataset '", name, "' in '", path, "': hyperslab offset ", shape_str(offset), " count ",
                  shape_str(count), " is outside the dataset shape ", shape_str(Shape(dims.begin(), dims.end()))),
              "");
    if (count[i] == 0) empty = true;
  }
  if (empty) {
    const hsize_t one = 1;
    s.mem_space = H5Handle(H5Screate_simple(1, &one, nullptr), H5Sclose);
    if (!s.mem_space.valid() || H5Sselect_none(s.mem_space.get()) < 0 || H5Sselect_none(s.file_space.get()) < 0)
      h5_fail(str(op, " (H5Sselect_none)"), path, name);
  } else if (nd == 0) {
    s.mem_space = H5Handle(H5Screate(H5S_SCALAR), H5Sclose);
    if (!s.mem_space.valid()) h5_fail(str(op, " (H5Screate)"), path, name);
  } else {
    std::vector<hsize_t> start(offset.begin(), offset.end()), cnt(count.begin(), count.end());
    if (H5Sselect_hyperslab(s.file_space.get(), H5S_SELECT_SET, start.data(), nullptr, cnt.data(), nullptr) < 0)
      h5_fail(str(op, " (H5Sselect_hyperslab)"), path, name);
    s.mem_space = H5Handle(H5Screate_simple(nd, cnt.data(), nullptr), H5Sclose);
    if (!s.mem_space.valid()) h5_fail(str(op, " (H5Screate_simple)"), path, name);
  }
  return s;
}

void check_type(const std::string& op, const std::string& path, const std::string& name, ElemType stored,
                ElemType given) {
  // HDF5 converts between the other numeric types; bit patterns of halves it cannot.
  MPT_CHECK(stored == given || (!is_half(stored) && !is_half(given)),
            str(op, " of dataset '", name, "' in '", path, "': dataset holds ", elem_name(stored),
                ", buffer is ", elem_name(given)),
            "convert the tensor (Tensor::to(dtype)) before writing, or after reading");
}

}  // namespace

void Hdf5File::write_raw(const std::string& name, const Shape& offset, const Shape& count, const void* data,
                         ElemType type) {
  const ElemType stored = dataset_info(name).type;
  check_type("write", path_, name, stored, type);
  H5Handle ds = open_dataset(name, "write");
  Selection sel = select(ds.get(), path_, name, offset, count, data == nullptr, "write");
  H5Handle dxpl(H5Pcreate(H5P_DATASET_XFER), H5Pclose);
  if (!dxpl.valid()) h5_fail("H5Pcreate(transfer)", path_, name);
  if (parallel_ && H5Pset_dxpl_mpio(dxpl.get(), H5FD_MPIO_COLLECTIVE) < 0) h5_fail("H5Pset_dxpl_mpio", path_, name);
  const uint64_t dummy = 0;  // HDF5 wants a non-null buffer even for an empty selection
  if (H5Dwrite(ds.get(), mem_type(type), sel.mem_space.get(), sel.file_space.get(), dxpl.get(),
               data ? data : &dummy) < 0)
    h5_fail(str("H5Dwrite offset ", shape_str(offset), " count ", shape_str(count)), path_, name,
            "the disk may be full; in parallel every rank must call write for the same dataset");
}

void Hdf5File::write_pieces(const std::string& name, const std::vector<Hyperslab>& pieces, const void* data,
                            ElemType type) {
  if (pieces.size() <= 1) {
    const DatasetInfo info = dataset_info(name);
    if (pieces.empty()) write_raw(name, Shape(info.shape.size(), 0), Shape(info.shape.size(), 0), nullptr, type);
    else write_raw(name, pieces[0].offset, pieces[0].count, data, type);
    return;
  }
  const ElemType stored = dataset_info(name).type;
  check_type("write", path_, name, stored, type);
  H5Handle ds = open_dataset(name, "write");
  // Validate every piece with the single-hyperslab checks, then select their union.
  hsize_t total = 0;
  for (const Hyperslab& h : pieces) {
    select(ds.get(), path_, name, h.offset, h.count, false, "write");
    total += static_cast<hsize_t>(shape_numel(h.count));
  }
  H5Handle file_space(H5Dget_space(ds.get()), H5Sclose);
  if (!file_space.valid()) h5_fail("write (H5Dget_space)", path_, name);
  bool first = true;
  for (const Hyperslab& h : pieces) {
    if (shape_numel(h.count) == 0) continue;
    std::vector<hsize_t> start(h.offset.begin(), h.offset.end()), cnt(h.count.begin(), h.count.end());
    if (H5Sselect_hyperslab(file_space.get(), first ? H5S_SELECT_SET : H5S_SELECT_OR, start.data(), nullptr,
                            cnt.data(), nullptr) < 0)
      h5_fail("write (H5Sselect_hyperslab union)", path_, name);
    first = false;
  }
  const hsize_t mem_n = std::max<hsize_t>(total, 1);
  H5Handle mem_space(H5Screate_simple(1, &mem_n, nullptr), H5Sclose);
  if (!mem_space.valid()) h5_fail("write (H5Screate_simple)", path_, name);
  if (total == 0 && (H5Sselect_none(mem_space.get()) < 0 || H5Sselect_none(file_space.get()) < 0))
    h5_fail("write (H5Sselect_none)", path_, name);
  H5Handle dxpl(H5Pcreate(H5P_DATASET_XFER), H5Pclose);
  if (!dxpl.valid()) h5_fail("H5Pcreate(transfer)", path_, name);
  if (parallel_ && H5Pset_dxpl_mpio(dxpl.get(), H5FD_MPIO_COLLECTIVE) < 0) h5_fail("H5Pset_dxpl_mpio", path_, name);
  const uint64_t dummy = 0;
  if (H5Dwrite(ds.get(), mem_type(type), mem_space.get(), file_space.get(), dxpl.get(), data ? data : &dummy) < 0)
    h5_fail(str("H5Dwrite of ", pieces.size(), " hyperslabs"), path_, name,
            "the disk may be full; in parallel every rank must call write for the same dataset");
}

void Hdf5File::write(const std::string& name, const Shape& offset, const Tensor& local) {
  if (!local.defined()) {
    const DatasetInfo info = dataset_info(name);
    write_raw(name, Shape(info.shape.size(), 0), Shape(info.shape.size(), 0), nullptr, info.type);
    return;
  }
  Tensor host = local.device().is_cpu() ? local : local.to(Device::cpu());
  if (!host.is_contiguous()) host = host.contiguous();
  write_raw(name, offset, host.shape(), host.numel() ? host.data_ptr() : nullptr, elem_type_of(host.dtype()));
}

void Hdf5File::read_raw(const std::string& name, const Shape& offset, const Shape& count, void* out,
                        ElemType type) const {
  const ElemType stored = dataset_info(name).type;
  check_type("read", path_, name, stored, type);
  H5Handle ds = open_dataset(name, "read");
  Selection sel = select(ds.get(), path_, name, offset, count, out == nullptr, "read");
  if (shape_numel(count) == 0 || out == nullptr) return;  // reads are independent: nothing to take part in
  if (H5Dread(ds.get(), mem_type(type), sel.mem_space.get(), sel.file_space.get(), H5P_DEFAULT, out) < 0)
    h5_fail(str("H5Dread offset ", shape_str(offset), " count ", shape_str(count)), path_, name,
            "the file may be truncated or damaged");
}

Tensor Hdf5File::read(const std::string& name, const Shape& offset, const Shape& count) const {
  const DatasetInfo info = dataset_info(name);
  Tensor t = Tensor::empty(count, dtype_of(info.type));
  read_raw(name, offset, count, t.numel() ? t.data_ptr() : nullptr, info.type);
  return t;
}

Tensor Hdf5File::read(const std::string& name) const {
  const DatasetInfo info = dataset_info(name);
  return read(name, Shape(info.shape.size(), 0), info.shape);
}

int64_t Hdf5File::data_file_offset(const std::string& name) const {
  H5Handle ds = open_dataset(name, "data_file_offset");
  const haddr_t a = H5Dget_offset(ds.get());
  H5Eclear2(H5E_DEFAULT);
  return a == HADDR_UNDEF ? -1 : static_cast<int64_t>(a);
}

Hdf5File::RawExtent Hdf5File::raw_extent(const std::string& name) const {
  RawExtent e;
  e.info = dataset_info(name);
  e.nbytes = static_cast<uint64_t>(shape_numel(e.info.shape)) * elem_size(e.info.type);
  H5Handle ds = open_dataset(name, "raw_extent");
  H5Handle dcpl(H5Dget_create_plist(ds.get()), H5Pclose);
  H5Handle type(H5Dget_type(ds.get()), H5Tclose);
  if (!dcpl.valid() || !type.valid()) h5_fail("raw_extent (H5Dget_create_plist/H5Dget_type)", path_, name);
  const int external = H5Pget_external_count(dcpl.get());
  if (H5Pget_layout(dcpl.get()) == H5D_CONTIGUOUS && external == 0) {
    const haddr_t a = H5Dget_offset(ds.get());
    if (a != HADDR_UNDEF) e.file_offset = static_cast<int64_t>(a);
  }
  H5Eclear2(H5E_DEFAULT);
  e.native = H5Tequal(type.get(), mem_type(e.info.type)) > 0;
  H5Eclear2(H5E_DEFAULT);
  return e;
}

// ---------------------------------------------------------------- attributes

void Hdf5File::write_attr(const std::string& obj, const std::string& key, hid_t ftype, hid_t mtype,
                          const void* value) {
  H5Handle o = open_object(obj, "set attribute");
  const htri_t exists = H5Aexists(o.get(), key.c_str());
  if (exists < 0) h5_fail(str("H5Aexists '", key, "'"), path_, obj_path(obj));
  if (exists > 0 && H5Adelete(o.get(), key.c_str()) < 0) h5_fail(str("H5Adelete '", key, "'"), path_, obj_path(obj));
  H5Handle space(H5Screate(H5S_SCALAR), H5Sclose);
  H5Handle a(H5Acreate2(o.get(), key.c_str(), ftype, space.get(), H5P_DEFAULT, H5P_DEFAULT), H5Aclose);
  if (!a.valid()) h5_fail(str("H5Acreate '", key, "'"), path_, obj_path(obj));
  if (H5Awrite(a.get(), mtype, value) < 0) h5_fail(str("H5Awrite '", key, "'"), path_, obj_path(obj));
  if (a.reset() < 0) h5_fail(str("H5Aclose '", key, "'"), path_, obj_path(obj));
}

void Hdf5File::set_attr_string(const std::string& obj, const std::string& key, const std::string& value) {
  H5Handle t(H5Tcopy(H5T_C_S1), H5Tclose);
  if (!t.valid() || H5Tset_size(t.get(), value.size() + 1) < 0 || H5Tset_strpad(t.get(), H5T_STR_NULLTERM) < 0 ||
      H5Tset_cset(t.get(), H5T_CSET_UTF8) < 0)
    h5_fail(str("string type for attribute '", key, "'"), path_, obj_path(obj));
  write_attr(obj, key, t.get(), t.get(), value.c_str());
}

void Hdf5File::set_attr_int(const std::string& obj, const std::string& key, int64_t value) {
  write_attr(obj, key, H5T_STD_I64LE, H5T_NATIVE_INT64, &value);
}

void Hdf5File::set_attr_double(const std::string& obj, const std::string& key, double value) {
  write_attr(obj, key, H5T_IEEE_F64LE, H5T_NATIVE_DOUBLE, &value);
}

void Hdf5File::set_attr_json(const std::string& obj, const std::string& key, const nlohmann::json& value) {
  set_attr_string(obj, key, value.dump());
}

bool Hdf5File::has_attr(const std::string& obj, const std::string& key) const {
  H5Handle o = open_object(obj, "has_attr");
  const htri_t e = H5Aexists(o.get(), key.c_str());
  if (e < 0) h5_fail(str("H5Aexists '", key, "'"), path_, obj_path(obj));
  return e > 0;
}

namespace {
herr_t collect_attr(hid_t, const char* name, const H5A_info_t*, void* out) {
  static_cast<std::vector<std::string>*>(out)->push_back(name);
  return 0;
}
}  // namespace

std::vector<std::string> Hdf5File::attr_names(const std::string& obj) const {
  H5Handle o = open_object(obj, "attr_names");
  std::vector<std::string> names;
  if (H5Aiterate2(o.get(), H5_INDEX_NAME, H5_ITER_INC, nullptr, collect_attr, &names) < 0)
    h5_fail("H5Aiterate", path_, obj_path(obj));
  return names;
}

H5Handle Hdf5File::open_attr(const std::string& obj, const std::string& key, const char* op) const {
  H5Handle o = open_object(obj, op);
  hid_t id = H5Aopen(o.get(), key.c_str(), H5P_DEFAULT);
  if (id < 0) h5_fail(str(op, " '", key, "' (H5Aopen)"), path_, obj_path(obj), "the attribute does not exist");
  return H5Handle(id, H5Aclose);
}

std::string Hdf5File::attr_string(const std::string& obj, const std::string& key) const {
  H5Handle a = open_attr(obj, key, "read string attribute");
  H5Handle t(H5Aget_type(a.get()), H5Tclose);
  MPT_CHECK(t.valid() && H5Tget_class(t.get()) == H5T_STRING,
            str("attribute '", key, "' of '", obj_path(obj), "' in '", path_, "' is not a string"), "");
  const htri_t vl = H5Tis_variable_str(t.get());
  if (vl > 0) {  // written by h5py or another tool
    H5Handle mt(H5Tcopy(H5T_C_S1), H5Tclose);
    H5Tset_size(mt.get(), H5T_VARIABLE);
    char* s = nullptr;
    if (H5Aread(a.get(), mt.get(), &s) < 0) h5_fail(str("H5Aread '", key, "'"), path_, obj_path(obj));
    std::string out = s ? s : "";
    H5free_memory(s);
    return out;
  }
  std::string buf(H5Tget_size(t.get()), '\0');
  if (H5Aread(a.get(), t.get(), buf.data()) < 0) h5_fail(str("H5Aread '", key, "'"), path_, obj_path(obj));
  buf.resize(std::strlen(buf.c_str()));
  return buf;
}

int64_t Hdf5File::attr_int(const std::string& obj, const std::string& key) const {
  H5Handle a = open_attr(obj, key, "read integer attribute");
  int64_t v = 0;
  if (H5Aread(a.get(), H5T_NATIVE_INT64, &v) < 0)
    h5_fail(str("H5Aread '", key, "' as int64"), path_, obj_path(obj), "is the attribute an integer?");
  return v;
}

std::vector<std::optional<int64_t>> Hdf5File::attr_ints(const std::string& obj,
                                                        const std::vector<std::string>& keys) const {
  H5Handle o = open_object(obj, "read integer attributes");
  std::vector<std::optional<int64_t>> out;
  for (const std::string& key : keys) {
    const htri_t e = H5Aexists(o.get(), key.c_str());
    if (e < 0) h5_fail(str("H5Aexists '", key, "'"), path_, obj_path(obj));
    if (e == 0) {
      out.emplace_back();
      continue;
    }
    H5Handle a(H5Aopen(o.get(), key.c_str(), H5P_DEFAULT), H5Aclose);
    if (!a.valid()) h5_fail(str("read integer attribute '", key, "' (H5Aopen)"), path_, obj_path(obj));
    int64_t v = 0;
    if (H5Aread(a.get(), H5T_NATIVE_INT64, &v) < 0)
      h5_fail(str("H5Aread '", key, "' as int64"), path_, obj_path(obj), "is the attribute an integer?");
    out.emplace_back(v);
  }
  return out;
}

double Hdf5File::attr_double(const std::string& obj, const std::string& key) const {
  H5Handle a = open_attr(obj, key, "read double attribute");
  double v = 0;
  if (H5Aread(a.get(), H5T_NATIVE_DOUBLE, &v) < 0)
    h5_fail(str("H5Aread '", key, "' as double"), path_, obj_path(obj), "is the attribute a number?");
  return v;
}

nlohmann::json Hdf5File::attr_json(const std::string& obj, const std::string& key) const {
  const std::string s = attr_string(obj, key);
  try {
    return nlohmann::json::parse(s);
  } catch (const std::exception& e) {
    MPT_THROW(str("attribute '", key, "' of '", obj_path(obj), "' in '", path_, "' is not valid JSON: ", e.what()),
              "");
  }
}

}  // namespace mpitron::io
