#include "tpreload/comm/cuda_device.h"

#include <cuda_runtime.h>
#include <dlfcn.h>

#include <atomic>
#include <cstdio>
#include <memory>
#include <mutex>
#include <new>
#include <vector>

#include "quantize_int8.h"
#include "tpreload/core/error.h"
#include "tpreload/core/log.h"

namespace tpreload {

namespace detail {

[[noreturn]] void raise_cuda_error(int code, const char* expr, const char* file, int line) {
  const auto e = static_cast<cudaError_t>(code);
  raise<CommError>(expr, " failed with CUDA error ", code, " (", cudaGetErrorName(e), ": ",
                   cudaGetErrorString(e), ") at ", file, ":", line);
}

}  // namespace detail

namespace {

// Whether the calling thread has a CUDA context current: the driver's
// cuCtxGetCurrent, looked up once in the driver the runtime loaded. False where
// it cannot be asked (then no device is restored: see DeviceGuard).
bool thread_has_context() noexcept {
  using GetCurrent = int (*)(void**);
  static const GetCurrent get = []() -> GetCurrent {
    void* driver = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    return driver ? reinterpret_cast<GetCurrent>(dlsym(driver, "cuCtxGetCurrent")) : nullptr;
  }();
  void* context = nullptr;
  return get && get(&context) == 0 && context != nullptr;
}

// CUDA's current device is per thread, and other code on the thread (LibTorch,
// the host program) sets its own: every entry point makes ours current for its
// scope and restores the previous one after, but only a device the thread had.
// A thread with no context current reports device 0 all the same, and since
// CUDA 12 setting device 0 creates its primary context (hundreds of MiB, and a
// failure under exclusive-process mode or on a full GPU 0): such a thread (a
// worker of the pipeline) keeps ours, set once, as its device. `nothrow` for
// destructors.
class DeviceGuard {
 public:
  explicit DeviceGuard(int ordinal) {
    int current = 0;
    CUDA_CHECK(cudaGetDevice(&current));
    if (current == ordinal) return;
    const bool had = thread_has_context();
    CUDA_CHECK(cudaSetDevice(ordinal));
    if (had) previous_ = current;
  }
  DeviceGuard(int ordinal, std::nothrow_t) noexcept {
    int current = 0;
    if (cudaGetDevice(&current) != cudaSuccess || current == ordinal) return;
    const bool had = thread_has_context();
    if (cudaSetDevice(ordinal) == cudaSuccess && had) previous_ = current;
  }
  ~DeviceGuard() {
    if (previous_ >= 0) cudaSetDevice(previous_);
  }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int previous_ = -1;  // the device to restore; -1: none
};

cuda::Float float_of(DType dtype) {
  switch (dtype) {
    case DType::kFloat32:
      return cuda::Float::kFloat32;
    case DType::kFloat16:
      return cuda::Float::kFloat16;
    case DType::kBFloat16:
      return cuda::Float::kBFloat16;
    case DType::kFloat64:
      return cuda::Float::kFloat64;
    default:
      raise<ModelError>("device conversion of ", dtype_name(dtype), " (floating dtypes only)");
  }
}

cudaMemcpyKind kind_of(CopyKind kind) {
  switch (kind) {
    case CopyKind::kHostToDevice:
      return cudaMemcpyHostToDevice;
    case CopyKind::kDeviceToHost:
      return cudaMemcpyDeviceToHost;
    case CopyKind::kDeviceToDevice:
      return cudaMemcpyDeviceToDevice;
  }
  return cudaMemcpyDefault;
}

// Whether a wait for the device's work gave up (DeviceEvent::gave_up): the
// device is stuck. cudaFree and cudaFreeHost wait for all of the device's work,
// so while that work has not finished a free would block its thread: the memory
// freed is leaked instead (said once). An event recorded after the work the
// wait gave up on tells when it finished after all (a late peer, a slow copy):
// from then on memory is freed again.
class Stuck {
 public:
  Stuck(int ordinal, std::string name) : ordinal_(ordinal), name_(std::move(name)) {}
  ~Stuck() {
    DeviceGuard guard(ordinal_, std::nothrow);
    for (cudaEvent_t e : pending_) cudaEventDestroy(e);
  }
  Stuck(const Stuck&) = delete;
  Stuck& operator=(const Stuck&) = delete;

  // A wait for the work on `stream` gave up. Never blocks.
  void mark(cudaStream_t stream) noexcept {
    std::lock_guard<std::mutex> lock(mutex_);
    DeviceGuard guard(ordinal_, std::nothrow);
    cudaEvent_t after = nullptr;
    if (cudaEventCreateWithFlags(&after, cudaEventDisableTiming) == cudaSuccess &&
        cudaEventRecord(after, stream) == cudaSuccess) {
      pending_.push_back(after);
    } else {  // (then it stays stuck: nothing tells when the work finished)
      if (after) cudaEventDestroy(after);
      cudaGetLastError();
      forever_ = true;
    }
  }
  // Whether `bytes` freed now must be leaked instead.
  bool leak(std::uint64_t bytes) noexcept {
    std::lock_guard<std::mutex> lock(mutex_);
    if (pending_.empty() && !forever_) return false;
    DeviceGuard guard(ordinal_, std::nothrow);
    for (std::size_t i = pending_.size(); i-- > 0;) {
      if (cudaEventQuery(pending_[i]) != cudaSuccess) continue;  // (an error: still pending)
      cudaEventDestroy(pending_[i]);
      pending_.erase(pending_.begin() + static_cast<std::ptrdiff_t>(i));
    }
    cudaGetLastError();
    if (pending_.empty() && !forever_) {
      say(true);
      said_ = false;
      return false;
    }
    leaked_ += bytes;
    if (!said_) {
      said_ = true;
      say(false);
    }
    return true;
  }

 private:
  void say(bool finished) const noexcept {
    try {  // (never thrown out of a free)
      if (finished)
        log().warn(
            "{}: the work a wait gave up on has finished; memory is freed again ({} bytes were "
            "leaked while it was stuck)",
            name_, leaked_);
      else
        log().warn(
            "{} is stuck: memory freed now is leaked, not returned to it (a free would wait for "
            "the stuck work); if the work never finishes, end the process to get the device back",
            name_);
    } catch (...) {
    }
  }
  int ordinal_;
  std::string name_;
  std::mutex mutex_;
  std::vector<cudaEvent_t> pending_;  // recorded after work a wait gave up on
  bool forever_ = false, said_ = false;
  std::uint64_t leaked_ = 0;
};

class CudaEvent final : public DeviceEvent {
 public:
  CudaEvent(int ordinal, cudaStream_t stream, std::shared_ptr<Stuck> stuck)
      : ordinal_(ordinal), stream_(stream), stuck_(std::move(stuck)) {
    DeviceGuard guard(ordinal_);
    CUDA_CHECK(cudaEventCreateWithFlags(&event_, cudaEventDisableTiming));
    const cudaError_t rc = cudaEventRecord(event_, stream);
    if (rc != cudaSuccess) {
      cudaEventDestroy(event_);
      CUDA_CHECK(rc);
    }
  }
  ~CudaEvent() override {
    DeviceGuard guard(ordinal_, std::nothrow);
    cudaEventDestroy(event_);
  }
  CudaEvent(const CudaEvent&) = delete;
  CudaEvent& operator=(const CudaEvent&) = delete;

  bool done() override {
    DeviceGuard guard(ordinal_);
    const cudaError_t rc = cudaEventQuery(event_);
    if (rc == cudaErrorNotReady) {
      // Expected, but left as the thread's last error: cleared here (as
      // PyTorch's event query does), or a check of the last error would see it.
      cudaGetLastError();
      return false;
    }
    CUDA_CHECK(rc);
    return true;
  }
  cudaEvent_t get() const { return event_; }
  void gave_up() noexcept override { stuck_->mark(stream_); }

 private:
  int ordinal_;
  cudaStream_t stream_;
  std::shared_ptr<Stuck> stuck_;
  cudaEvent_t event_ = nullptr;
};

class CudaStream final : public DeviceStream {
 public:
  CudaStream(int ordinal, std::shared_ptr<Stuck> stuck)
      : ordinal_(ordinal), stuck_(std::move(stuck)) {
    DeviceGuard guard(ordinal_);
    CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  }
  // Local: destroying a stream with work queued lets that work finish first.
  ~CudaStream() override {
    DeviceGuard guard(ordinal_, std::nothrow);
    cudaStreamDestroy(stream_);
  }
  CudaStream(const CudaStream&) = delete;
  CudaStream& operator=(const CudaStream&) = delete;

  void copy(void* dst, const void* src, std::uint64_t bytes, CopyKind kind) override {
    if (bytes == 0) return;
    DeviceGuard guard(ordinal_);
    CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, kind_of(kind), stream_));
  }
  void copy_rows(void* dst, std::uint64_t dst_pitch, const void* src, std::uint64_t src_pitch,
                 std::uint64_t width, std::uint64_t rows, CopyKind kind) override {
    if (rows == 0 || width == 0) return;
    DeviceGuard guard(ordinal_);
    CUDA_CHECK(
        cudaMemcpy2DAsync(dst, dst_pitch, src, src_pitch, width, rows, kind_of(kind), stream_));
  }
  void zero(void* dst, std::uint64_t bytes) override {
    if (bytes == 0) return;
    DeviceGuard guard(ordinal_);
    CUDA_CHECK(cudaMemsetAsync(dst, 0, bytes, stream_));
  }
  void quantize_int8(const void* src, DType dtype, std::int64_t rows, std::int64_t cols,
                     std::int64_t row_stride, std::int8_t* q, float* scale) override {
    cuda::QuantizeSource source;
    switch (dtype) {
      case DType::kBFloat16:
        source = cuda::QuantizeSource::kBFloat16;
        break;
      case DType::kFloat16:
        source = cuda::QuantizeSource::kFloat16;
        break;
      case DType::kFloat32:
        source = cuda::QuantizeSource::kFloat32;
        break;
      default:
        raise<ModelError>("int8 quantization on the device: unsupported source dtype ",
                          dtype_name(dtype));
    }
    DeviceGuard guard(ordinal_);
    CUDA_CHECK(cuda::launch_quantize_int8(src, source, rows, cols, row_stride, q, scale, stream_));
  }
  void requantize_fp8(std::uint8_t* w, std::uint64_t n, const float* staged, std::uint32_t from,
                      std::uint32_t first, std::uint32_t count, float* out) override {
    DeviceGuard guard(ordinal_);
    CUDA_CHECK(cuda::launch_requantize_fp8(w, n, staged, from, first, count, out, stream_));
  }
  void quantize_fp8(const void* x, DType dtype, std::uint64_t n, std::uint8_t* codes,
                    float* scale) override {
    DeviceGuard guard(ordinal_);
    CUDA_CHECK(cuda::launch_quantize_fp8(x, float_of(dtype), n, codes, scale, stream_));
  }
  void quantize_fp8_block(const void* x, DType dtype, std::int64_t rows, std::int64_t cols,
                          std::int64_t block, std::uint8_t* codes, float* grid) override {
    DeviceGuard guard(ordinal_);
    CUDA_CHECK(cuda::launch_quantize_fp8_block(x, float_of(dtype), rows, cols, block, codes, grid,
                                               stream_));
  }
  void convert(const void* src, DType from, std::int64_t src_stride, void* dst, DType to,
               std::int64_t rows, std::int64_t cols) override {
    DeviceGuard guard(ordinal_);
    CUDA_CHECK(cuda::launch_convert(src, float_of(from), src_stride, dst, float_of(to), rows, cols,
                                    stream_));
  }
  void head_rows(const HeadRows& a) override {
    DeviceGuard guard(ordinal_);
    CUDA_CHECK(cuda::launch_head_rows(a, stream_));
  }
  void crc32c_blocks(const void* src, std::uint64_t bytes, std::uint32_t* raw) override {
    DeviceGuard guard(ordinal_);
    CUDA_CHECK(cuda::launch_crc32c_blocks(src, bytes, raw, stream_));
  }
  std::unique_ptr<DeviceEvent> record() override {
    return std::make_unique<CudaEvent>(ordinal_, stream_, stuck_);
  }
  void wait_for(DeviceEvent& event) override {
    DeviceGuard guard(ordinal_);
    CUDA_CHECK(cudaStreamWaitEvent(stream_, static_cast<CudaEvent&>(event).get(), 0));
  }
  void* native_handle() override { return stream_; }

 private:
  int ordinal_;
  std::shared_ptr<Stuck> stuck_;
  cudaStream_t stream_ = nullptr;
};

std::string gib(std::uint64_t bytes) {
  char text[32];
  std::snprintf(text, sizeof text, "%.1f GiB", static_cast<double>(bytes) / (1ull << 30));
  return text;
}

class DeviceMemoryAllocator final : public Allocator {
 public:
  DeviceMemoryAllocator(int ordinal, std::string name, std::shared_ptr<Stuck> stuck)
      : ordinal_(ordinal), name_(std::move(name)), stuck_(std::move(stuck)) {}
  MemoryKind kind() const override { return MemoryKind::kDevice; }
  Buffer allocate(std::uint64_t bytes) override {
    if (bytes == 0) return {};
    DeviceGuard guard(ordinal_);
    void* p = nullptr;
    const cudaError_t rc = cudaMalloc(&p, bytes);
    if (rc != cudaSuccess) {
      std::size_t free = 0, total = 0;
      cudaGetLastError();  // clear the sticky error of the failed allocation
      cudaMemGetInfo(&free, &total);
      raise<CommError>("cannot allocate ", bytes, " bytes of device memory on ", name_, ": ",
                       cudaGetErrorString(rc), " (", gib(free), " free of ", gib(total), ")");
    }
    const int ordinal = ordinal_;
    return Buffer(static_cast<std::byte*>(p), bytes, MemoryKind::kDevice,
                  [ordinal, bytes, stuck = stuck_](std::byte* d) {
                    if (stuck->leak(bytes)) return;
                    DeviceGuard guard(ordinal, std::nothrow);
                    cudaFree(d);
                  });
  }

 private:
  int ordinal_;
  std::string name_;
  std::shared_ptr<Stuck> stuck_;
};

class PinnedAllocator final : public Allocator {
 public:
  PinnedAllocator(int ordinal, std::string name, std::shared_ptr<Stuck> stuck)
      : ordinal_(ordinal), name_(std::move(name)), stuck_(std::move(stuck)) {}
  MemoryKind kind() const override { return MemoryKind::kPinnedHost; }
  Buffer allocate(std::uint64_t bytes) override {
    if (bytes == 0) return {};
    DeviceGuard guard(ordinal_);
    void* p = nullptr;
    const cudaError_t rc = cudaHostAlloc(&p, bytes, cudaHostAllocPortable);
    if (rc != cudaSuccess) {
      cudaGetLastError();
      raise<CommError>("cannot allocate ", bytes, " bytes of pinned host memory for ", name_, ": ",
                       cudaGetErrorString(rc));
    }
    const int ordinal = ordinal_;
    return Buffer(static_cast<std::byte*>(p), bytes, MemoryKind::kPinnedHost,
                  [ordinal, bytes, stuck = stuck_](std::byte* h) {
                    if (stuck->leak(bytes)) return;
                    DeviceGuard guard(ordinal, std::nothrow);
                    cudaFreeHost(h);
                  });
  }

 private:
  int ordinal_;
  std::string name_;
  std::shared_ptr<Stuck> stuck_;
};

class CudaDevice final : public Device {
 public:
  CudaDevice(int ordinal, std::string name)
      : ordinal_(ordinal),
        name_(std::move(name)),
        stuck_(std::make_shared<Stuck>(ordinal, name_)),
        memory_(ordinal, name_, stuck_),
        pinned_(ordinal, name_, stuck_) {}
  std::string describe() const override { return name_; }
  std::string backend() const override { return "cuda"; }
  int ordinal() const override { return ordinal_; }
  bool host_addressable() const override { return false; }
  std::unique_ptr<Scope> make_current() override {
    struct Current final : Scope {
      explicit Current(int ordinal) : guard(ordinal) {}
      DeviceGuard guard;
    };
    return std::make_unique<Current>(ordinal_);
  }
  Allocator& memory() override { return memory_; }
  Allocator& pinned_memory() override { return pinned_; }
  std::unique_ptr<DeviceStream> make_stream() override {
    return std::make_unique<CudaStream>(ordinal_, stuck_);
  }

 private:
  int ordinal_;
  std::string name_;
  std::shared_ptr<Stuck> stuck_;  // (shared with its buffers, streams and events)
  DeviceMemoryAllocator memory_;
  PinnedAllocator pinned_;
};

}  // namespace

CudaProbe probe_cuda() {
  CudaProbe p;
  // The runtime is linked statically; the driver is the one thing it loads.
  if (void* driver = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL)) {
    p.driver = true;
    dlclose(driver);
  } else {
    const char* why = dlerror();
    p.problem =
        std::string("no NVIDIA driver: libcuda.so.1 cannot be loaded (") + (why ? why : "?") + ")";
    return p;
  }
  cudaDriverGetVersion(&p.driver_version);
  const cudaError_t rc = cudaGetDeviceCount(&p.devices);
  if (rc != cudaSuccess) {
    p.devices = 0;
    p.problem = std::string("no CUDA device: ") + cudaGetErrorName(rc) + " (" +
                cudaGetErrorString(rc) + "), driver version " + std::to_string(p.driver_version);
  } else if (p.devices == 0) {
    p.problem = "no CUDA device: the driver sees none";
  }
  return p;
}

std::shared_ptr<Device> open_cuda_device(int ordinal) {
  const CudaProbe probe = probe_cuda();
  if (!probe.problem.empty()) raise<CommError>(probe.problem);
  if (ordinal < 0 || ordinal >= probe.devices)
    raise<CommError>("CUDA device ", ordinal, " does not exist (this process sees ", probe.devices,
                     ")");
  DeviceGuard guard(ordinal);
  cudaDeviceProp prop{};
  CUDA_CHECK(cudaGetDeviceProperties(&prop, ordinal));
  // Every kernel's module now: a lazy load at a first launch while an NCCL kernel
  // spins on the device can wait for it forever.
  CUDA_CHECK(cuda::load_convert());
  CUDA_CHECK(cuda::load_crc32c());
  CUDA_CHECK(cuda::load_quantize_int8());
  const std::string name =
      "cuda:" + std::to_string(ordinal) + " (" + prop.name + ", " + gib(prop.totalGlobalMem) + ")";
  log().debug("opened {}", name);
  return std::make_shared<CudaDevice>(ordinal, name);
}

}  // namespace tpreload
