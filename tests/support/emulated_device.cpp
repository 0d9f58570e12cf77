#include "emulated_device.h"

#include <cstring>
#include <deque>
#include <functional>
#include <mutex>
#include <vector>

#include "tpreload/core/crc32c.h"
#include "tpreload/core/error.h"
#include "tpreload/core/float8.h"
#include "tpreload/model/convert.h"
#include "tpreload/model/quantize.h"

namespace tpreload::testing {
namespace {

std::size_t index_of(MemoryKind kind) {
  return static_cast<std::size_t>(kind);
}

class EmulatedAllocator final : public Allocator {
 public:
  EmulatedAllocator(EmulatedDevice& device, MemoryKind kind) : device_(device), kind_(kind) {}
  MemoryKind kind() const override { return kind_; }
  Buffer allocate(std::uint64_t bytes) override {
    if (bytes == 0) return {};
    EmulatedDevice* device = &device_;
    const MemoryKind kind = kind_;
    return Buffer(device_.take(kind_, bytes), bytes, kind_,
                  [device, kind](std::byte* p) { device->give(kind, p); });
  }

 private:
  EmulatedDevice& device_;
  MemoryKind kind_;
};

class EmulatedStream;

class EmulatedEvent final : public DeviceEvent {
 public:
  EmulatedEvent(EmulatedStream& stream, std::uint64_t seq, int polls)
      : stream_(stream),
        seq_(seq),
        polls_left_(polls),
        recorded_(std::chrono::steady_clock::now()) {}
  bool done() override;
  void gave_up() noexcept override;
  EmulatedStream& stream() const { return stream_; }
  std::uint64_t seq() const { return seq_; }

 private:
  EmulatedStream& stream_;
  std::uint64_t seq_;
  int polls_left_;
  std::chrono::steady_clock::time_point recorded_;
};

// Work is queued and runs in order when an event after it is waited for.
class EmulatedStream final : public DeviceStream {
 public:
  explicit EmulatedStream(EmulatedDevice& device) : device_(device) {}

  void copy(void* dst, const void* src, std::uint64_t bytes, CopyKind kind) override {
    check(dst, bytes, src, bytes, kind, "copy");
    const auto* d = static_cast<const std::byte*>(dst);
    const auto* s = static_cast<const std::byte*>(src);
    if (bytes && d < s + bytes && s < d + bytes)
      raise<CommError>("emulated device: copy of ", bytes, " bytes between overlapping ranges");
    enqueue([=] { std::memcpy(dst, src, bytes); });
  }
  void copy_rows(void* dst, std::uint64_t dst_pitch, const void* src, std::uint64_t src_pitch,
                 std::uint64_t width, std::uint64_t rows, CopyKind kind) override {
    if (rows == 0) return;
    if (width > dst_pitch || width > src_pitch)
      raise<CommError>("emulated device: copy_rows width ", width, " exceeds a pitch (", dst_pitch,
                       ", ", src_pitch, ")");
    check(dst, (rows - 1) * dst_pitch + width, src, (rows - 1) * src_pitch + width, kind,
          "copy_rows");
    enqueue([=] {
      for (std::uint64_t r = 0; r < rows; ++r)
        std::memcpy(static_cast<std::byte*>(dst) + r * dst_pitch,
                    static_cast<const std::byte*>(src) + r * src_pitch, width);
    });
  }
  void zero(void* dst, std::uint64_t bytes) override {
    require_device(dst, bytes, "zero");
    enqueue([=] { std::memset(dst, 0, bytes); });
  }
  void quantize_int8(const void* src, DType dtype, std::int64_t rows, std::int64_t cols,
                     std::int64_t row_stride, std::int8_t* q, float* scale) override {
    if (rows <= 0) return;
    require_aligned(src, dtype_size(dtype), "quantize_int8 source");
    const std::uint64_t in = ((rows - 1) * row_stride + cols) * dtype_size(dtype);
    require_device(src, in, "quantize_int8 source");
    require_device(q, rows * cols, "quantize_int8 output");
    require_device(scale, rows * sizeof(float), "quantize_int8 scales");
    enqueue([=] {
      if (dtype == DType::kBFloat16)
        quantize_rows_bf16(static_cast<const std::uint16_t*>(src), rows, cols, row_stride, q,
                           scale);
      else if (dtype == DType::kFloat16)
        quantize_rows_f16(static_cast<const std::uint16_t*>(src), rows, cols, row_stride, q, scale);
      else
        quantize_rows_f32(static_cast<const float*>(src), rows, cols, row_stride, q, scale);
    });
  }
  void convert(const void* src, DType from, std::int64_t src_stride, void* dst, DType to,
               std::int64_t rows, std::int64_t cols) override {
    if (rows <= 0 || cols <= 0) return;
    require_aligned(src, dtype_size(from), "convert source");
    require_aligned(dst, dtype_size(to), "convert destination");
    require_device(src, ((rows - 1) * src_stride + cols) * dtype_size(from), "convert source");
    require_device(dst, rows * cols * dtype_size(to), "convert destination");
    enqueue([=] { convert_rows(src, from, src_stride, dst, to, rows, cols); });
  }
  void requantize_fp8(std::uint8_t* w, std::uint64_t n, const float* staged, std::uint32_t from,
                      std::uint32_t first, std::uint32_t count, float* out) override {
    if (n) require_device(w, n, "requantize_fp8 weights");
    require_aligned(staged, sizeof(float), "requantize_fp8 scales");
    require_device(staged + first, count * sizeof(float), "requantize_fp8 scales");
    require_device(staged + from, sizeof(float), "requantize_fp8 scale");
    if (out) require_device(out, sizeof(float), "requantize_fp8 output scale");
    enqueue([=] { fp8::requantize_step(w, n, staged, from, first, count, out); });
  }
  void quantize_fp8(const void* x, DType dtype, std::uint64_t n, std::uint8_t* codes,
                    float* scale) override {
    require_aligned(x, dtype_size(dtype), "quantize_fp8 input");
    if (n) require_device(x, n * dtype_size(dtype), "quantize_fp8 input");
    if (n) require_device(codes, n, "quantize_fp8 codes");
    require_device(scale, sizeof(float), "quantize_fp8 scale");
    enqueue([=] { quantize_fp8_host(x, dtype, n, codes, scale); });
  }
  void quantize_fp8_block(const void* x, DType dtype, std::int64_t rows, std::int64_t cols,
                          std::int64_t block, std::uint8_t* codes, float* grid) override {
    const auto n = static_cast<std::uint64_t>(rows * cols);
    const auto tiles =
        static_cast<std::uint64_t>(((rows + block - 1) / block) * ((cols + block - 1) / block));
    require_aligned(x, dtype_size(dtype), "quantize_fp8_block input");
    if (n) require_device(x, n * dtype_size(dtype), "quantize_fp8_block input");
    if (n) require_device(codes, n, "quantize_fp8_block codes");
    if (tiles) require_device(grid, tiles * sizeof(float), "quantize_fp8_block grid");
    enqueue([=] { quantize_fp8_blocks_host(x, dtype, rows, cols, block, codes, grid); });
  }
  void head_rows(const HeadRows& a) override {
    const auto n = static_cast<std::uint64_t>(a.elements());
    if (n == 0) return;
    const auto w_rows = static_cast<std::uint64_t>(a.heads * a.head_rows);
    require_device(a.w, w_rows * a.cols * dtype_size(a.w_dtype), "head_rows weight");
    require_device(a.out, n * dtype_size(a.out_dtype), "head_rows output");
    if (a.scale_kind != HeadRows::Scale::kNone) require_device(a.scale, 4, "head_rows scales");
    enqueue([a] { head_rows_host(a); });
  }
  void crc32c_blocks(const void* src, std::uint64_t bytes, std::uint32_t* raw) override {
    if (bytes == 0) return;
    require_device(src, bytes, "crc32c source");
    enqueue([=] {
      const auto* p = static_cast<const std::byte*>(src);
      for (std::uint64_t i = 0; i < tpreload::crc32c_blocks(bytes); ++i)
        raw[i] = crc32c_raw(p + i * kCrc32cBlock, std::min(kCrc32cBlock, bytes - i * kCrc32cBlock));
    });
  }
  std::unique_ptr<DeviceEvent> record() override {
    std::lock_guard<std::mutex> lock(mutex_);
    return std::make_unique<EmulatedEvent>(*this, queued_, device_.polls_before_done());
  }
  void wait_for(DeviceEvent& event) override {
    auto& e = static_cast<EmulatedEvent&>(event);
    EmulatedStream* other = &e.stream();
    const std::uint64_t seq = e.seq();
    enqueue([other, seq] { other->run_until(seq); }, /*count=*/false);
  }
  void* native_handle() override { return this; }

  // Run queued work up to (not including) operation number `seq`, in order. The
  // queue lock is not held while work runs (work may wait on other streams); a
  // recursive execution lock keeps the order when several threads wait.
  void run_until(std::uint64_t seq) {
    std::lock_guard<std::recursive_mutex> running(exec_mutex_);
    for (;;) {
      std::function<void()> op;
      {
        std::lock_guard<std::mutex> lock(mutex_);
        if (done_ >= seq || work_.empty()) return;
        op = std::move(work_.front());
        work_.pop_front();
        ++done_;
      }
      op();
    }
  }
  EmulatedDevice& device() { return device_; }

 private:
  void enqueue(std::function<void()> op, bool count = true) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (count) device_.count_operation();
    work_.push_back(std::move(op));
    ++queued_;
  }
  void require_device(const void* p, std::uint64_t n, const char* what) const {
    if (n && !device_.is_device_memory(p, n))
      raise<CommError>("emulated device: ", what, " of ", n, " bytes at ", p,
                       " is not device memory of this device");
  }
  // Kernels read elements in place: a GPU faults on a misaligned element.
  static void require_aligned(const void* p, std::size_t size, const char* what) {
    if (reinterpret_cast<std::uintptr_t>(p) % size != 0)
      raise<CommError>("emulated device: ", what, " at ", p, " is not aligned to its ", size,
                       "-byte elements");
  }
  void require_host(const void* p, std::uint64_t n, const char* what) const {
    if (n && device_.is_device_memory(p, 1))
      raise<CommError>("emulated device: ", what, " of ", n, " bytes at ", p,
                       " is device memory where host memory was declared");
    if (n && device_.requires_pinned_host() && !device_.is_pinned_memory(p, n))
      raise<CommError>("emulated device: ", what, " of ", n, " bytes at ", p,
                       " is not pinned host memory of this device");
  }
  void check(const void* dst, std::uint64_t dn, const void* src, std::uint64_t sn, CopyKind kind,
             const char* what) const {
    const std::string op = std::string(what);
    device_.queued_write(dst, dn);
    if (kind == CopyKind::kHostToDevice) {
      require_device(dst, dn, (op + " destination").c_str());
      require_host(src, sn, (op + " source").c_str());
    } else if (kind == CopyKind::kDeviceToHost) {
      require_host(dst, dn, (op + " destination").c_str());
      require_device(src, sn, (op + " source").c_str());
    } else {
      require_device(dst, dn, (op + " destination").c_str());
      require_device(src, sn, (op + " source").c_str());
    }
  }

  EmulatedDevice& device_;
  std::mutex mutex_;
  std::recursive_mutex exec_mutex_;
  std::deque<std::function<void()>> work_;
  std::uint64_t queued_ = 0, done_ = 0;
};

bool EmulatedEvent::done() {
  if (stream_.device().stalled()) return false;
  if (std::chrono::steady_clock::now() - recorded_ < stream_.device().delay()) return false;
  if (polls_left_ > 0) {
    --polls_left_;
    return false;
  }
  stream_.run_until(seq_);
  return true;
}

void EmulatedEvent::gave_up() noexcept {
  stream_.device().gave_up();
}

// Received bytes land in the caller's buffer only when the transfer is waited
// for (after a few polls), as a device transfer's do.
class Delivery final : public Transfer {
 public:
  Delivery(MutableBytes into, std::string what)
      : Transfer(std::move(what), Clock::now() + std::chrono::minutes(1)),
        staged(into.size),
        into_(into) {}
  std::vector<std::byte> staged;

 private:
  bool poll() override {
    if (polls_++ < 2) return false;
    if (!staged.empty()) std::memcpy(into_.data, staged.data(), staged.size());
    return true;
  }
  void expire() override { raise<CommTimeoutError>(what(), ": expired"); }
  MutableBytes into_;
  int polls_ = 0;
};

// Buffers a device transport sends and receives must be device memory.
class EmulatedDeviceTransport final : public DataTransport {
 public:
  EmulatedDeviceTransport(std::unique_ptr<DataTransport> host, EmulatedDevice& device)
      : host_(std::move(host)), device_(device) {}
  int rank() const override { return host_->rank(); }
  int size() const override { return host_->size(); }
  std::string backend() const override { return "emulated-device"; }
  MemoryKind memory() const override { return MemoryKind::kDevice; }
  Device* device() const override { return &device_; }
  std::unique_ptr<Transfer> broadcast(MutableBytes buffer, int root) override {
    require(buffer.data, buffer.size, "broadcast buffer");
    if (rank() == root) return host_->broadcast(buffer, root);
    auto t = std::make_unique<Delivery>(buffer, "emulated device broadcast");
    host_->broadcast(MutableBytes(t->staged.data(), t->staged.size()), root)->wait();
    return t;
  }
  std::unique_ptr<Transfer> scatter(ConstBytes send, const std::vector<ByteRange>& ranges,
                                    MutableBytes recv, int root) override {
    require(recv.data, recv.size, "scatter receive buffer");
    if (rank() == root) {
      for (const ByteRange& r : ranges)
        require(send.data + r.offset, r.length, "scatter send range");
      return host_->scatter(send, ranges, recv, root);
    }
    auto t = std::make_unique<Delivery>(recv, "emulated device scatter");
    host_->scatter(send, ranges, MutableBytes(t->staged.data(), t->staged.size()), root)->wait();
    return t;
  }
  std::unique_ptr<DataTransport> split(Communicator& group, int color, int key) override {
    return std::make_unique<EmulatedDeviceTransport>(host_->split(group, color, key), device_);
  }

 private:
  void require(const void* p, std::uint64_t n, const char* what) const {
    if (n && !device_.is_device_memory(p, n))
      raise<CommError>("emulated device transport: ", what, " of ", n,
                       " bytes is not device memory");
  }
  std::unique_ptr<DataTransport> host_;
  EmulatedDevice& device_;
};

}  // namespace

EmulatedDevice::EmulatedDevice(int polls_before_done)
    : polls_(polls_before_done),
      memory_(std::make_unique<EmulatedAllocator>(*this, MemoryKind::kDevice)),
      pinned_(std::make_unique<EmulatedAllocator>(*this, MemoryKind::kPinnedHost)) {}

EmulatedDevice::~EmulatedDevice() {
  for (std::byte* p : leaked_blocks_) delete[] p;
}

Allocator& EmulatedDevice::memory() {
  return *memory_;
}
Allocator& EmulatedDevice::pinned_memory() {
  return *pinned_;
}
std::unique_ptr<DeviceStream> EmulatedDevice::make_stream() {
  return std::make_unique<EmulatedStream>(*this);
}

std::byte* EmulatedDevice::take(MemoryKind kind, std::uint64_t bytes) {
  if (kind == MemoryKind::kDevice && memory_limit_ &&
      live_bytes(MemoryKind::kDevice) + bytes > memory_limit_)
    raise<CommError>("out of memory on the emulated device: ", bytes, " bytes asked, ",
                     memory_limit_ - std::min<std::uint64_t>(memory_limit_, live_bytes(kind)),
                     " free");
  auto* p = new std::byte[bytes];
  std::memset(p, kind == MemoryKind::kDevice ? 0xCD : 0xAB, bytes);
  std::lock_guard<std::mutex> lock(mutex_);
  if (kind == MemoryKind::kDevice) device_blocks_[p] = bytes;
  const std::size_t i = index_of(kind);
  live_[i] += bytes;
  peak_[i] = std::max(peak_[i], live_[i]);
  ++allocations_[i];
  sizes_[p] = bytes;
  return p;
}

void EmulatedDevice::give(MemoryKind kind, std::byte* p) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (gave_up_ && stalled_) {  // as CUDA's: leaked, still live (a free would wait)
      leaked_ += sizes_.at(p);
      leaked_blocks_.push_back(p);  // (deleted with the device)
      return;
    }
    gave_up_ = gave_up_ && stalled_;       // (the work it gave up on has finished)
    if (stalled_) ++frees_while_stalled_;  // (a CUDA free here would never return)
    device_blocks_.erase(p);
    live_[index_of(kind)] -= sizes_.at(p);
    sizes_.erase(p);
  }
  delete[] p;
}

// The start of the block of `blocks` that holds all of [p, p + n), or null.
static const std::byte* holder(const std::map<const std::byte*, std::uint64_t>& blocks,
                               const void* p, std::uint64_t n) {
  const auto* b = static_cast<const std::byte*>(p);
  auto it = blocks.upper_bound(b);
  if (it == blocks.begin()) return nullptr;
  --it;
  return b >= it->first && b + n <= it->first + it->second ? it->first : nullptr;
}

bool EmulatedDevice::is_pinned_memory(const void* p, std::uint64_t n) const {
  std::lock_guard<std::mutex> lock(mutex_);
  const std::byte* block = holder(sizes_, p, n);
  return block && !device_blocks_.count(block);
}

bool EmulatedDevice::is_device_memory(const void* p, std::uint64_t n) const {
  std::lock_guard<std::mutex> lock(mutex_);
  return holder(device_blocks_, p, n) != nullptr;
}

std::uint64_t EmulatedDevice::live_bytes(MemoryKind kind) const {
  std::lock_guard<std::mutex> lock(mutex_);
  return live_[index_of(kind)];
}

std::uint64_t EmulatedDevice::peak_bytes(MemoryKind kind) const {
  std::lock_guard<std::mutex> lock(mutex_);
  return peak_[index_of(kind)];
}

std::uint64_t EmulatedDevice::allocations(MemoryKind kind) const {
  std::lock_guard<std::mutex> lock(mutex_);
  return allocations_[index_of(kind)];
}

void EmulatedDevice::reset_peaks() {
  std::lock_guard<std::mutex> lock(mutex_);
  for (int i = 0; i < 3; ++i) peak_[i] = live_[i];
}

std::unique_ptr<DataTransport> make_emulated_device_transport(std::unique_ptr<DataTransport> host,
                                                              EmulatedDevice& device) {
  return std::make_unique<EmulatedDeviceTransport>(std::move(host), device);
}

}  // namespace tpreload::testing
