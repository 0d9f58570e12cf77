// How a large collective is cut into messages a backend with 32-bit counts and
// displacements accepts. Pure functions, identical on every rank for identical
// input, so every rank makes the same sequence of calls.
#pragma once

#include <cstdint>
#include <vector>

#include "tpreload/core/span.h"

namespace tpreload {

// Consecutive pieces of [0, total) of at most `max_bytes` each (none if total is 0).
std::vector<ByteRange> split_range(std::uint64_t total, std::uint64_t max_bytes);

// One backend scatterv call: per rank, the piece of the root buffer it receives
// (`send[r]`, length 0 when it gets nothing this call) and where that piece lands
// in its receive buffer (`recv_offset[r]`). `base` is the smallest send offset, so
// that send[r].offset - base fits the backend's displacement type.
struct ScatterRound {
  std::uint64_t base = 0;
  std::vector<ByteRange> send;
  std::vector<std::uint64_t> recv_offset;
};

// Plan a scatterv of `ranges` (one per rank) as rounds in which every piece is at
// most `max_bytes` long and lies within `max_span` bytes of the round's base.
std::vector<ScatterRound> plan_scatter_rounds(const std::vector<ByteRange>& ranges,
                                              std::uint64_t max_bytes, std::uint64_t max_span);

}  // namespace tpreload
