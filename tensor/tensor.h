// tensor/tensor.h — Tensor: a typed, shaped, strided view of ref-counted storage.
//
// Storage lives on one device (CPU heap, or a CUDA device through the caching
// allocator) and is shared by every view of it; the last view to go frees it.
// Shapes and strides are in elements; offset is in elements from the storage
// start. Ops in tensor/*.h take tensors as handles: an "out" tensor is passed
// as `const Tensor&` and its elements are written (the handle does not change).
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/device.h"
#include "core/error.h"
#include "tensor/dtype.h"

namespace mpitron {

using Shape = std::vector<int64_t>;
std::string shape_str(const Shape& s);
int64_t shape_numel(const Shape& s);

struct Storage {
  void* ptr = nullptr;
  size_t bytes = 0;
  Device device;
  std::function<void(void*)> deleter;  // empty for borrowed memory (e.g. mmap owned elsewhere)
  ~Storage();
};

class Tensor {
 public:
  Tensor() = default;

  // ---- creation ----
  static Tensor empty(const Shape& shape, DType dtype, Device device = Device::cpu(), Stream s = Stream());
  static Tensor zeros(const Shape& shape, DType dtype, Device device = Device::cpu(), Stream s = Stream());
  // A view of memory owned by someone else (kept alive by `keepalive`, may be null).
  static Tensor from_blob(void* ptr, const Shape& shape, DType dtype, Device device = Device::cpu(),
                          std::shared_ptr<void> keepalive = nullptr);
  // Host tensor from values (converted to dtype).
  static Tensor from_vector(const std::vector<float>& v, const Shape& shape, DType dtype = DType::F32);
  static Tensor from_ints(const std::vector<int64_t>& v, const Shape& shape, DType dtype = DType::I32);

  // ---- properties ----
  bool defined() const { return storage_ != nullptr; }
  const Shape& shape() const { return shape_; }
  const Shape& strides() const { return strides_; }
  int ndim() const { return static_cast<int>(shape_.size()); }
  int64_t dim(int i) const;  // negative i counts from the end
  int64_t numel() const { return shape_numel(shape_); }
  size_t nbytes() const { return static_cast<size_t>(numel()) * dtype_size(dtype_); }
  DType dtype() const { return dtype_; }
  Device device() const { return storage_ ? storage_->device : Device::cpu(); }
  int64_t offset() const { return offset_; }
  bool is_contiguous() const;
  std::string describe() const;  // "bf16[4, 8] cuda:0"

  void* data_ptr() const;
  template <typename T> T* data() const {
    MPT_CHECK(dtype_of<T>::value == dtype_, str("tensor is ", dtype_name(dtype_), ", accessed as ",
                                                 dtype_name(dtype_of<T>::value)), "");
    return static_cast<T*>(data_ptr());
  }
  bool shares_storage(const Tensor& o) const { return storage_ && storage_ == o.storage_; }

  // ---- views (share storage) ----
  Tensor view(const Shape& shape) const;  // contiguous only; one dim may be -1
  Tensor flatten_to_2d() const;           // (prod of leading dims, last dim)
  Tensor slice(int d, int64_t start, int64_t end) const;
  Tensor select(int d, int64_t i) const;  // drops dim d
  Tensor transpose(int d0, int d1) const;
  // Elements [start, start+n) of a contiguous tensor as a 1-D tensor.
  Tensor flat_range(int64_t start, int64_t n) const;

  // ---- copies ----
  Tensor contiguous(Stream s = Stream()) const;
  Tensor to(Device d, Stream s = Stream()) const;       // same dtype
  Tensor to(DType t, Stream s = Stream()) const;        // same device (cast op)
  Tensor clone(Stream s = Stream()) const;
  void copy_from(const Tensor& src, Stream s = Stream()) const;  // same shape and dtype, any devices
  void fill(double value, Stream s = Stream()) const;
  void zero(Stream s = Stream()) const { fill(0.0, s); }

  // Host values as float / int64 (copies from the device, converts dtype).
  std::vector<float> to_floats() const;
  std::vector<int64_t> to_ints() const;
  float item() const;  // single element

 private:
  std::shared_ptr<Storage> storage_;
  Shape shape_, strides_;
  int64_t offset_ = 0;
  DType dtype_ = DType::F32;
};

Shape contiguous_strides(const Shape& shape);

// Tensor memory on a device: live bytes and the peak since the last reset
// (CPU: every Tensor::empty; CUDA: the caching allocator's live blocks).
struct MemoryStats {
  int64_t current_bytes = 0;
  int64_t peak_bytes = 0;
};
MemoryStats memory_stats(Device d);
void reset_peak_memory(Device d);

// Precondition checks shared by the ops (they throw with the op name in the message).
void check_same_shape(const char* op, const Tensor& a, const char* an, const Tensor& b, const char* bn);
void check_same_device(const char* op, std::initializer_list<const Tensor*> ts);
void check_contiguous(const char* op, std::initializer_list<std::pair<const Tensor*, const char*>> ts);

}  // namespace mpitron
