#include "shape_util.h"

namespace tpreload::detail {

std::optional<std::uint64_t> checked_numel(const std::vector<std::int64_t>& shape) {
  std::uint64_t n = 1;
  for (const std::int64_t d : shape) {
    if (d < 0 || __builtin_mul_overflow(n, static_cast<std::uint64_t>(d), &n)) return std::nullopt;
  }
  return n;
}

std::optional<std::uint64_t> checked_nbytes(const std::vector<std::int64_t>& shape, DType dtype) {
  auto n = checked_numel(shape);
  std::uint64_t bytes = 0;
  if (!n || __builtin_mul_overflow(*n, static_cast<std::uint64_t>(dtype_size(dtype)), &bytes))
    return std::nullopt;
  return bytes;
}

}  // namespace tpreload::detail
