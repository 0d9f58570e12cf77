// Where each tensor-parallel rank's bytes lie in the rows of a checkpoint
// tensor (internal): row-parallel tensors give each rank a window of columns
// out of every row. Shared by the reader's cutting (bucket_reader.cpp) and the
// checksum chains of broadcast buckets (verify_chains.cpp). No torch here.
#pragma once

#include <cstdint>

#include "tpreload/reload/plan.h"

namespace tpreload::detail {

// Bytes of one column of a row (a row-parallel tensor's rows are split by column).
inline std::uint64_t column_bytes(const TensorInfo& info) {
  return shape_row_bytes(info.shape, info.dtype) / static_cast<std::uint64_t>(info.shape[1]);
}

// Bytes of tp rank r's column window in one row of a row-parallel tensor.
inline std::uint64_t window_bytes(const PlannedTensor& t, const TensorInfo& info, int r) {
  return static_cast<std::uint64_t>(t.placements[r].source_length) * column_bytes(info);
}

// Row-parallel: each rank takes a window of columns out of every row. (A row of
// zero columns has no bytes to cut: treated as contiguous rows.)
inline bool row_parallel(const PlannedTensor& t, const TensorInfo& info) {
  return !t.kernel() && t.placements[0].source_dim == 1 && info.shape.size() >= 2 &&
         info.shape[1] > 0;
}

// Where tp rank r's column window starts inside a row of a row-parallel tensor.
inline std::uint64_t window_skip(const PlannedTensor& t, const TensorInfo& info, int r) {
  return static_cast<std::uint64_t>(t.placements[r].source_start) * column_bytes(info);
}

}  // namespace tpreload::detail
