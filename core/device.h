// core/device.h — devices, streams and events.
//
// Without a GPU (or in a build without CUDA) cuda_available() is false and
// everything runs on the CPU backend; nothing here crashes or hangs then.
#pragma once
#include <cstdint>
#include <string>

namespace mpitron {

enum class DeviceType : uint8_t { CPU = 0, CUDA = 1 };

struct Device {
  DeviceType type = DeviceType::CPU;
  int index = 0;
  static Device cpu() { return {DeviceType::CPU, 0}; }
  static Device cuda(int i = 0) { return {DeviceType::CUDA, i}; }
  bool is_cpu() const { return type == DeviceType::CPU; }
  bool is_cuda() const { return type == DeviceType::CUDA; }
  bool operator==(const Device& o) const { return type == o.type && (is_cpu() || index == o.index); }
  bool operator!=(const Device& o) const { return !(*this == o); }
  std::string name() const;
};

// True when this build has the CUDA backend AND the runtime finds a device.
bool cuda_available();
// Why cuda_available() is false ("built without CUDA", "no device: insufficient driver", …).
std::string cuda_unavailable_reason();
int cuda_device_count();
void cuda_set_device(int index);
int cuda_current_device();

// A stream handle: on the CPU a no-op; on CUDA wraps cudaStream_t (null = the
// legacy default stream). Invariant: every stream ops run on is ordered with the
// legacy default stream (create() makes blocking streams), so to()/item(),
// which synchronise the default stream, see all earlier work (docs/cuda.md).
class Stream {
 public:
  Stream() = default;
  explicit Stream(void* handle) : handle_(handle) {}
  static Stream create();  // a new blocking CUDA stream (owned by the caller: call destroy())
  void destroy();
  void synchronize() const;
  void* handle() const { return handle_; }
  bool operator==(const Stream& o) const { return handle_ == o.handle_; }

 private:
  void* handle_ = nullptr;
};

// A CUDA event for timing and ordering; on the CPU records wall time.
class Event {
 public:
  Event();
  ~Event();
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;
  void record(Stream s = Stream());
  void synchronize() const;
  bool done() const;
  // Milliseconds between two recorded events.
  static float elapsed_ms(const Event& start, const Event& stop);

 private:
  void* ev_ = nullptr;
  double host_ms_ = 0;
};

// Synchronise the whole current device (no-op without CUDA).
void device_synchronize();

}  // namespace mpitron
