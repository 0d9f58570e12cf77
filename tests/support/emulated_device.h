// A Device that runs on the host, so that every path around a device (staging
// through pinned memory, device transports, the sink's device writes, CRCs read
// back in chunks, slot reuse after events) runs and is checked on a machine
// without a GPU. Tests only.
//
// It is strict where a real device would fail silently or crash:
//  - work on a stream runs only when an event recorded after it is waited for
//    (done() returns false `polls_before_done` times first), so code that reads
//    device results without waiting reads stale bytes and fails its test;
//  - every operation checks that its pointers lie in the memory space its copy
//    kind says (device memory of this device, or host memory), so a host pointer
//    passed as device memory is an error here as it would be a fault there;
//  - kernels (conversion, int8) refuse elements at misaligned addresses;
//  - new device memory is filled with 0xCD, not zeros;
//  - allocations are counted per memory space (live and peak bytes).
// With stall() every event stays pending forever (a stuck device); set_delay()
// makes every event take at least that long (a slow one). A free, as CUDA's
// cudaFree and cudaFreeHost, would wait for the stuck work: frees while stalled
// are counted (frees_while_stalled(): each would never return on a GPU) until
// a wait for the device gives up (DeviceEvent::gave_up), after which what is
// freed while it stays stalled is leaked (leaked_bytes()), as the CUDA device
// does until the work the wait gave up on finishes.
//
// The device transport it pairs with (make_emulated_device_transport) delivers
// received bytes only when the transfer is waited for, so a reader of a receive
// buffer that did not wait reads stale bytes here too.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <utility>
#include <vector>

#include "tpreload/comm/data_transport.h"
#include "tpreload/comm/device.h"

namespace tpreload::testing {

class EmulatedDevice final : public Device {
 public:
  explicit EmulatedDevice(int polls_before_done = 2);
  ~EmulatedDevice() override;

  std::string describe() const override { return "emulated device"; }
  std::string backend() const override { return "emulated"; }
  int ordinal() const override { return 0; }
  bool host_addressable() const override { return true; }
  std::unique_ptr<Scope> make_current() override { return std::make_unique<Scope>(); }
  Allocator& memory() override;
  Allocator& pinned_memory() override;
  std::unique_ptr<DeviceStream> make_stream() override;

  // Whether [p, p + n) lies inside one live device allocation.
  bool is_device_memory(const void* p, std::uint64_t n) const;
  // Whether [p, p + n) lies inside one live pinned host allocation of this device.
  bool is_pinned_memory(const void* p, std::uint64_t n) const;
  // From now on the host side of every copy between host and device must be
  // pinned memory of this device: a GPU would copy from pageable memory (a file
  // mapping) through a synchronous bounce, or fault in its pages mid-copy.
  void require_pinned_host(bool on) { require_pinned_ = on; }
  bool requires_pinned_host() const { return require_pinned_; }
  std::uint64_t live_bytes(MemoryKind kind) const;
  std::uint64_t peak_bytes(MemoryKind kind) const;
  // Allocations made so far in `kind`'s space (each allocate() call).
  std::uint64_t allocations(MemoryKind kind) const;
  void reset_peaks();
  // Operations run so far (copies, fills, kernels).
  std::uint64_t operations() const { return operations_; }
  void stall(bool on) { stalled_ = on; }
  bool stalled() const { return stalled_; }
  // Internal (its events): a wait for its work gave up.
  void gave_up() noexcept {
    std::lock_guard<std::mutex> lock(mutex_);
    gave_up_ = true;
  }
  std::uint64_t frees_while_stalled() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return frees_while_stalled_;
  }
  std::uint64_t leaked_bytes() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return leaked_;
  }
  // The device stalls, as with stall(true), once a copy that writes into
  // [p, p + n) is queued: a device stuck in one particular copy.
  void stall_on_write_to(const void* p, std::uint64_t n) {
    std::lock_guard<std::mutex> lock(mutex_);
    stall_on_ = {static_cast<const std::byte*>(p), n};
  }
  // Device memory beyond `bytes` live at once is refused (CommError), as a full
  // GPU refuses it; 0: no limit.
  void set_memory_limit(std::uint64_t bytes) { memory_limit_ = bytes; }
  // Events complete no sooner than `delay` after they were recorded (a slow device).
  void set_delay(std::chrono::milliseconds delay) { delay_ms_ = delay.count(); }
  std::chrono::milliseconds delay() const { return std::chrono::milliseconds(delay_ms_.load()); }
  int polls_before_done() const { return polls_; }

  // Internal (the streams): a copy into [p, p + n) is queued.
  void queued_write(const void* p, std::uint64_t n) {
    std::lock_guard<std::mutex> lock(mutex_);
    const auto* d = static_cast<const std::byte*>(p);
    if (n && stall_on_.second && d < stall_on_.first + stall_on_.second && stall_on_.first < d + n)
      stalled_ = true;
  }
  // Internal (the allocators and streams): bookkeeping.
  std::byte* take(MemoryKind kind, std::uint64_t bytes);
  void give(MemoryKind kind, std::byte* p);
  void count_operation() { ++operations_; }

 private:
  struct Space;
  const int polls_;
  std::atomic<bool> stalled_{false}, require_pinned_{false};
  std::atomic<std::int64_t> delay_ms_{0};
  std::atomic<std::uint64_t> operations_{0};
  std::atomic<std::uint64_t> memory_limit_{0};
  mutable std::mutex mutex_;
  std::pair<const std::byte*, std::uint64_t> stall_on_{nullptr, 0};
  bool gave_up_ = false;
  std::uint64_t frees_while_stalled_ = 0, leaked_ = 0;
  std::vector<std::byte*> leaked_blocks_;
  std::map<const std::byte*, std::uint64_t> device_blocks_;  // device memory: start -> size
  std::map<const std::byte*, std::uint64_t> sizes_;          // every block: start -> size
  std::uint64_t live_[3] = {0, 0, 0}, peak_[3] = {0, 0, 0}, allocations_[3] = {0, 0, 0};
  std::unique_ptr<Allocator> memory_, pinned_;
};

// A data transport over host collectives that declares device memory: the data
// plane of an NCCL run, emulated. Every buffer it is given must be memory of
// `device`; it synchronizes nothing (as NCCL, it sees only device memory).
std::unique_ptr<DataTransport> make_emulated_device_transport(std::unique_ptr<DataTransport> host,
                                                              EmulatedDevice& device);

}  // namespace tpreload::testing
