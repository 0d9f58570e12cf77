// Byte spans (C++17 has no std::span) and 64-bit byte ranges.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace tpreload {

// A non-owning view of mutable bytes.
struct MutableBytes {
  std::byte* data = nullptr;
  std::size_t size = 0;

  MutableBytes() = default;
  MutableBytes(void* p, std::size_t n) : data(static_cast<std::byte*>(p)), size(n) {}
  template <typename T>
  explicit MutableBytes(std::vector<T>& v) : MutableBytes(v.data(), v.size() * sizeof(T)) {}
  MutableBytes subspan(std::size_t offset, std::size_t length) const {
    return {data + offset, length};
  }
};

// A non-owning view of read-only bytes.
struct ConstBytes {
  const std::byte* data = nullptr;
  std::size_t size = 0;

  ConstBytes() = default;
  ConstBytes(const void* p, std::size_t n) : data(static_cast<const std::byte*>(p)), size(n) {}
  ConstBytes(MutableBytes m) : data(m.data), size(m.size) {}  // NOLINT: implicit by design
  template <typename T>
  explicit ConstBytes(const std::vector<T>& v) : ConstBytes(v.data(), v.size() * sizeof(T)) {}
  ConstBytes subspan(std::size_t offset, std::size_t length) const {
    return {data + offset, length};
  }
};

// [offset, offset + length) within some buffer; 64-bit throughout.
struct ByteRange {
  std::uint64_t offset = 0;
  std::uint64_t length = 0;

  std::uint64_t end() const { return offset + length; }
  bool operator==(const ByteRange& o) const { return offset == o.offset && length == o.length; }
};

}  // namespace tpreload
