// Internal: overflow-checked tensor sizes and shape formatting.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "tpreload/core/dtype.h"

namespace tpreload::detail {

// product(shape) x dtype_size(dtype); nullopt on a negative dimension or 64-bit overflow.
std::optional<std::uint64_t> checked_nbytes(const std::vector<std::int64_t>& shape, DType dtype);

// Number of elements; nullopt on a negative dimension or overflow.
std::optional<std::uint64_t> checked_numel(const std::vector<std::int64_t>& shape);

using tpreload::shape_string;  // (core/dtype.h)

}  // namespace tpreload::detail
