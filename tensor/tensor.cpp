#include "tensor/tensor.h"

#include <atomic>
#include <cstdlib>
#include <sstream>

#include "core/allocator.h"
#include "tensor/cpu/ops.h"
#include "tensor/cuda/ops.h"

#ifdef MPITRON_WITH_CUDA
#include <cuda_runtime.h>
#endif

namespace mpitron {

std::string shape_str(const Shape& s) {
  std::ostringstream os;
  os << "[";
  for (size_t i = 0; i < s.size(); ++i) os << (i ? ", " : "") << s[i];
  os << "]";
  return os.str();
}

int64_t shape_numel(const Shape& s) {
  int64_t n = 1;
  for (int64_t d : s) n *= d;
  return n;
}

Shape contiguous_strides(const Shape& shape) {
  Shape st(shape.size());
  int64_t acc = 1;
  for (int i = static_cast<int>(shape.size()) - 1; i >= 0; --i) {
    st[i] = acc;
    acc *= shape[i];
  }
  return st;
}

namespace {
// Bytes of live CPU tensor storage (the CPU analogue of the caching allocator's stats).
std::atomic<int64_t> g_cpu_current{0}, g_cpu_peak{0};
void cpu_track(int64_t delta) {
  const int64_t now = g_cpu_current.fetch_add(delta) + delta;
  int64_t peak = g_cpu_peak.load();
  while (now > peak && !g_cpu_peak.compare_exchange_weak(peak, now)) {
  }
}
}  // namespace

MemoryStats memory_stats(Device d) {
  if (d.is_cpu()) return {g_cpu_current.load(), g_cpu_peak.load()};
  const AllocatorStats st = cuda_caching_allocator(d.index).stats();
  return {static_cast<int64_t>(st.current_bytes), static_cast<int64_t>(st.peak_bytes)};
}

void reset_peak_memory(Device d) {
  if (d.is_cpu()) g_cpu_peak.store(g_cpu_current.load());
  else cuda_caching_allocator(d.index).reset_peak();
}

Storage::~Storage() {
  if (deleter && ptr) deleter(ptr);
}

static void check_shape(const Shape& shape) {
  for (int64_t d : shape)
    MPT_CHECK(d >= 0, str("negative dimension in shape ", shape_str(shape)), "");
}

Tensor Tensor::empty(const Shape& shape, DType dtype, Device device, Stream s) {
  check_shape(shape);
  Tensor t;
  auto st = std::make_shared<Storage>();
  st->bytes = static_cast<size_t>(shape_numel(shape)) * dtype_size(dtype);
  st->device = device;
  if (device.is_cpu()) {
    const size_t bytes = (std::max<size_t>(st->bytes, 1) + 63) / 64 * 64;
    st->ptr = std::aligned_alloc(64, bytes);
    MPT_CHECK(st->ptr, str("out of host memory allocating ", st->bytes, " bytes"), "");
    const int64_t tracked = static_cast<int64_t>(bytes);
    cpu_track(tracked);
    st->deleter = [tracked](void* p) {
      std::free(p);
      cpu_track(-tracked);
    };
  } else {
    CachingAllocator& a = cuda_caching_allocator(device.index);
    st->ptr = a.allocate(st->bytes, s);
    st->deleter = [&a](void* p) { a.release(p); };
  }
  t.storage_ = std::move(st);
  t.shape_ = shape;
  t.strides_ = contiguous_strides(shape);
  t.dtype_ = dtype;
  return t;
}

Tensor Tensor::zeros(const Shape& shape, DType dtype, Device device, Stream s) {
  Tensor t = empty(shape, dtype, device, s);
  t.zero(s);
  return t;
}

Tensor Tensor::from_blob(void* ptr, const Shape& shape, DType dtype, Device device,
                         std::shared_ptr<void> keepalive) {
  check_shape(shape);
  Tensor t;
  auto st = std::make_shared<Storage>();
  st->ptr = ptr;
  st->bytes = static_cast<size_t>(shape_numel(shape)) * dtype_size(dtype);
  st->device = device;
  if (keepalive) st->deleter = [k = std::move(keepalive)](void*) mutable { k.reset(); };
  t.storage_ = std::move(st);
  t.shape_ = shape;
  t.strides_ = contiguous_strides(shape);
  t.dtype_ = dtype;
  return t;
}

Tensor Tensor::from_vector(const std::vector<float>& v, const Shape& shape, DType dtype) {
  MPT_CHECK(static_cast<int64_t>(v.size()) == shape_numel(shape),
            str("from_vector: ", v.size(), " values for shape ", shape_str(shape)), "");
  Tensor t = empty(shape, dtype);
  dispatch_float(dtype, "from_vector", [&](auto tag) {
    using T = decltype(tag);
    T* p = t.data<T>();
    for (size_t i = 0; i < v.size(); ++i) p[i] = from_f32<T>(v[i]);
  });
  return t;
}

Tensor Tensor::from_ints(const std::vector<int64_t>& v, const Shape& shape, DType dtype) {
  MPT_CHECK(static_cast<int64_t>(v.size()) == shape_numel(shape),
            str("from_ints: ", v.size(), " values for shape ", shape_str(shape)), "");
  Tensor t = empty(shape, dtype);
  for (size_t i = 0; i < v.size(); ++i) {
    switch (dtype) {
      case DType::I32: t.data<int32_t>()[i] = static_cast<int32_t>(v[i]); break;
      case DType::I64: t.data<int64_t>()[i] = v[i]; break;
      case DType::U16: t.data<uint16_t>()[i] = static_cast<uint16_t>(v[i]); break;
      default: MPT_THROW(str("from_ints: dtype ", dtype_name(dtype), " is not an integer type"), "");
    }
  }
  return t;
}

int64_t Tensor::dim(int i) const {
  const int n = ndim();
  if (i < 0) i += n;
  MPT_CHECK(i >= 0 && i < n, str("dim ", i, " out of range for ", describe()), "");
  return shape_[i];
}

bool Tensor::is_contiguous() const { return strides_ == contiguous_strides(shape_) || numel() <= 1; }

std::string Tensor::describe() const {
  if (!defined()) return "undefined tensor";
  return str(dtype_name(dtype_), shape_str(shape_), " ", device().name(), is_contiguous() ? "" : " (strided)");
}

void* Tensor::data_ptr() const {
  MPT_CHECK(defined(), "data of an undefined tensor", "");
  return static_cast<char*>(storage_->ptr) + offset_ * static_cast<int64_t>(dtype_size(dtype_));
}

Tensor Tensor::view(const Shape& shape) const {
  MPT_CHECK(is_contiguous(), str("view of a non-contiguous tensor ", describe()), "call contiguous() first");
  Shape s = shape;
  int infer = -1;
  int64_t known = 1;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == -1) {
      MPT_CHECK(infer < 0, "view: only one dimension may be -1", "");
      infer = static_cast<int>(i);
    } else {
      known *= s[i];
    }
  }
  if (infer >= 0) {
    MPT_CHECK(known > 0 && numel() % known == 0, str("view: cannot infer -1 in ", shape_str(shape),
                                                     " for ", describe()), "");
    s[infer] = numel() / known;
  }
  MPT_CHECK(shape_numel(s) == numel(), str("view: shape ", shape_str(s), " does not match ", describe()), "");
  Tensor t = *this;
  t.shape_ = s;
  t.strides_ = contiguous_strides(s);
  return t;
}

Tensor Tensor::flatten_to_2d() const {
  MPT_CHECK(ndim() >= 1, "flatten_to_2d of a scalar", "");
  const int64_t c = shape_.back();
  return view({c == 0 ? 0 : numel() / c, c});
}

Tensor Tensor::slice(int d, int64_t start, int64_t end) const {
  if (d < 0) d += ndim();
  MPT_CHECK(d >= 0 && d < ndim(), str("slice: dim ", d, " out of range for ", describe()), "");
  MPT_CHECK(0 <= start && start <= end && end <= shape_[d],
            str("slice [", start, ", ", end, ") of dim ", d, " out of range for ", describe()), "");
  Tensor t = *this;
  t.offset_ += start * strides_[d];
  t.shape_[d] = end - start;
  return t;
}

Tensor Tensor::select(int d, int64_t i) const {
  if (d < 0) d += ndim();
  Tensor t = slice(d, i, i + 1);
  t.shape_.erase(t.shape_.begin() + d);
  t.strides_.erase(t.strides_.begin() + d);
  return t;
}

Tensor Tensor::transpose(int d0, int d1) const {
  if (d0 < 0) d0 += ndim();
  if (d1 < 0) d1 += ndim();
  MPT_CHECK(d0 >= 0 && d0 < ndim() && d1 >= 0 && d1 < ndim(), str("transpose dims out of range for ", describe()), "");
  Tensor t = *this;
  std::swap(t.shape_[d0], t.shape_[d1]);
  std::swap(t.strides_[d0], t.strides_[d1]);
  return t;
}

Tensor Tensor::flat_range(int64_t start, int64_t n) const {
  MPT_CHECK(is_contiguous(), str("flat_range of a non-contiguous tensor ", describe()), "");
  MPT_CHECK(start >= 0 && n >= 0 && start + n <= numel(),
            str("flat_range [", start, ", ", start + n, ") out of range for ", describe()), "");
  Tensor t = *this;
  t.offset_ += start;
  t.shape_ = {n};
  t.strides_ = {1};
  return t;
}

Tensor Tensor::contiguous(Stream s) const {
  if (is_contiguous()) return *this;
  Tensor t = empty(shape_, dtype_, device(), s);
  t.copy_from(*this, s);
  return t;
}

Tensor Tensor::to(Device d, Stream s) const {
  if (d == device()) return *this;
  Tensor t = empty(shape_, dtype_, d, s);
  t.copy_from(*this, s);
  return t;
}

Tensor Tensor::to(DType dt, Stream s) const {
  if (dt == dtype_) return *this;
  Tensor src = contiguous(s);
  Tensor t = empty(shape_, dt, device(), s);
  mpitron::cast(src, t, s);
  return t;
}

Tensor Tensor::clone(Stream s) const {
  Tensor t = empty(shape_, dtype_, device(), s);
  t.copy_from(*this, s);
  return t;
}

void Tensor::copy_from(const Tensor& src, Stream s) const {
  MPT_CHECK(src.shape_ == shape_ && src.dtype_ == dtype_,
            str("copy_from: source ", src.describe(), " does not match destination ", describe()), "");
  if (numel() == 0) return;
  if (device() == src.device()) {
    if (device().is_cpu()) cpu::copy_strided(src, *this, s);
#ifdef MPITRON_WITH_CUDA
    else cuda::copy_strided(src, *this, s);
#endif
    return;
  }
#ifdef MPITRON_WITH_CUDA
  // Cross-device: stage through contiguous buffers on each side.
  Tensor csrc = src.contiguous(s);
  Tensor cdst = is_contiguous() ? *this : empty(shape_, dtype_, device(), s);
  cudaError_t e = cudaMemcpyAsync(cdst.data_ptr(), csrc.data_ptr(), nbytes(), cudaMemcpyDefault,
                                  static_cast<cudaStream_t>(s.handle()));
  MPT_CHECK(e == cudaSuccess, str("copy ", src.describe(), " -> ", describe(), ": ", cudaGetErrorString(e)), "");
  e = cudaStreamSynchronize(static_cast<cudaStream_t>(s.handle()));
  MPT_CHECK(e == cudaSuccess, str("copy ", src.describe(), " -> ", describe(), ": ", cudaGetErrorString(e)), "");
  if (!cdst.shares_storage(*this) || cdst.offset_ != offset_) copy_from(cdst, s);
#else
  MPT_THROW(str("copy between ", src.device().name(), " and ", device().name()), cuda_unavailable_reason());
#endif
}

void Tensor::fill(double value, Stream s) const {
  if (numel() == 0) return;
  MPT_CHECK(is_contiguous(), str("fill of a non-contiguous tensor ", describe()), "");
  if (device().is_cpu()) cpu::fill(*this, value, s);
#ifdef MPITRON_WITH_CUDA
  else cuda::fill(*this, value, s);
#endif
}

std::vector<float> Tensor::to_floats() const {
  Tensor h = to(Device::cpu()).contiguous();
  std::vector<float> v(static_cast<size_t>(numel()));
  switch (dtype_) {
    case DType::F32: for (size_t i = 0; i < v.size(); ++i) v[i] = h.data<float>()[i]; break;
    case DType::BF16: for (size_t i = 0; i < v.size(); ++i) v[i] = bf16_to_f32(h.data<bf16_t>()[i]); break;
    case DType::F16: for (size_t i = 0; i < v.size(); ++i) v[i] = f16_to_f32(h.data<f16_t>()[i]); break;
    case DType::I32: for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>(h.data<int32_t>()[i]); break;
    case DType::I64: for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>(h.data<int64_t>()[i]); break;
    case DType::U16: for (size_t i = 0; i < v.size(); ++i) v[i] = h.data<uint16_t>()[i]; break;
  }
  return v;
}

std::vector<int64_t> Tensor::to_ints() const {
  Tensor h = to(Device::cpu()).contiguous();
  std::vector<int64_t> v(static_cast<size_t>(numel()));
  switch (dtype_) {
    case DType::I32: for (size_t i = 0; i < v.size(); ++i) v[i] = h.data<int32_t>()[i]; break;
    case DType::I64: for (size_t i = 0; i < v.size(); ++i) v[i] = h.data<int64_t>()[i]; break;
    case DType::U16: for (size_t i = 0; i < v.size(); ++i) v[i] = h.data<uint16_t>()[i]; break;
    default: MPT_THROW(str("to_ints of a ", dtype_name(dtype_), " tensor"), "use to_floats()");
  }
  return v;
}

float Tensor::item() const {
  MPT_CHECK(numel() == 1, str("item() of ", describe(), " which has ", numel(), " elements"), "");
  return to_floats()[0];
}

void check_same_shape(const char* op, const Tensor& a, const char* an, const Tensor& b, const char* bn) {
  MPT_CHECK(a.shape() == b.shape(), str(op, ": ", an, " is ", a.describe(), " but ", bn, " is ", b.describe()), "");
}

void check_same_device(const char* op, std::initializer_list<const Tensor*> ts) {
  const Tensor* first = nullptr;
  for (const Tensor* t : ts) {
    if (!t->defined()) continue;
    if (!first) first = t;
    MPT_CHECK(t->device() == first->device(),
              str(op, ": tensors on different devices (", first->describe(), " and ", t->describe(), ")"),
              "move them to one device with .to()");
  }
}

void check_contiguous(const char* op, std::initializer_list<std::pair<const Tensor*, const char*>> ts) {
  for (auto& [t, name] : ts)
    if (t->defined())
      MPT_CHECK(t->is_contiguous(), str(op, ": ", name, " must be contiguous, got ", t->describe()),
                "call contiguous() first");
}

}  // namespace mpitron
