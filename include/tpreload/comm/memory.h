// Memory spaces and the buffers the data plane stages bucket bytes in. No torch,
// no MPI, no CUDA here: a device backend provides allocators for its spaces.
//
// A Buffer is the one owner of an allocation and frees it through its allocator's
// deleter when destroyed (move-only). An Allocator never returns a partly
// allocated buffer: it throws CommError naming the bytes and the memory space.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string_view>

namespace tpreload {

enum class MemoryKind : std::uint8_t {
  kHost,        // pageable host memory
  kPinnedHost,  // page-locked host memory (fast, asynchronous copies to a device)
  kDevice,      // accelerator memory (not addressable from the host in general)
};

// "host", "pinned host", "device".
std::string_view memory_kind_name(MemoryKind kind);

class Buffer {
 public:
  using Deleter = std::function<void(std::byte*)>;

  Buffer() = default;
  Buffer(std::byte* data, std::uint64_t size, MemoryKind kind, Deleter deleter)
      : data_(data), size_(size), kind_(kind), deleter_(std::move(deleter)) {}
  ~Buffer() { reset(); }
  Buffer(Buffer&& other) noexcept { *this = std::move(other); }
  Buffer& operator=(Buffer&& other) noexcept;
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;

  std::byte* data() const { return data_; }
  std::uint64_t size() const { return size_; }
  MemoryKind kind() const { return kind_; }
  explicit operator bool() const { return data_ != nullptr; }
  // Free now (through the deleter).
  void reset() noexcept;
  // Give up ownership without freeing (the memory leaks); returns the pointer.
  std::byte* release() noexcept;

 private:
  std::byte* data_ = nullptr;
  std::uint64_t size_ = 0;
  MemoryKind kind_ = MemoryKind::kHost;
  Deleter deleter_;
};

class Allocator {
 public:
  virtual ~Allocator() = default;
  virtual MemoryKind kind() const = 0;
  // At least `bytes` bytes (a zero-byte request may return an empty Buffer).
  // Throws CommError naming the space and the size when the memory cannot be had.
  virtual Buffer allocate(std::uint64_t bytes) = 0;
};

// Pageable host memory (operator new). Thread-safe.
Allocator& host_allocator();

}  // namespace tpreload
