#include "tpreload/comm/memory.h"

#include <new>

#include "tpreload/core/error.h"

namespace tpreload {

std::string_view memory_kind_name(MemoryKind kind) {
  switch (kind) {
    case MemoryKind::kHost:
      return "host";
    case MemoryKind::kPinnedHost:
      return "pinned host";
    case MemoryKind::kDevice:
      return "device";
  }
  return "?";
}

Buffer& Buffer::operator=(Buffer&& other) noexcept {
  if (this != &other) {
    reset();
    data_ = other.data_;
    size_ = other.size_;
    kind_ = other.kind_;
    deleter_ = std::move(other.deleter_);
    other.data_ = nullptr;
    other.size_ = 0;
    other.deleter_ = nullptr;
  }
  return *this;
}

std::byte* Buffer::release() noexcept {
  std::byte* data = data_;
  data_ = nullptr;
  size_ = 0;
  deleter_ = nullptr;
  return data;
}

void Buffer::reset() noexcept {
  if (data_ && deleter_) deleter_(data_);
  data_ = nullptr;
  size_ = 0;
  deleter_ = nullptr;
}

namespace {

class HostAllocator final : public Allocator {
 public:
  MemoryKind kind() const override { return MemoryKind::kHost; }
  Buffer allocate(std::uint64_t bytes) override {
    if (bytes == 0) return {};
    std::byte* data = new (std::nothrow) std::byte[bytes];
    if (!data) raise<CommError>("cannot allocate ", bytes, " bytes of host memory");
    return Buffer(data, bytes, MemoryKind::kHost, [](std::byte* p) { delete[] p; });
  }
};

}  // namespace

Allocator& host_allocator() {
  static HostAllocator allocator;
  return allocator;
}

}  // namespace tpreload
