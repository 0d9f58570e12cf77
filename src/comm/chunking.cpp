#include "tpreload/comm/chunking.h"

#include <algorithm>
#include <numeric>

#include "tpreload/core/error.h"

namespace tpreload {

std::vector<ByteRange> split_range(std::uint64_t total, std::uint64_t max_bytes) {
  if (max_bytes == 0) raise<UsageError>("split_range: max_bytes must be positive");
  std::vector<ByteRange> pieces;
  for (std::uint64_t offset = 0; offset < total; offset += max_bytes)
    pieces.push_back({offset, std::min(max_bytes, total - offset)});
  return pieces;
}

namespace {

// Group the pieces of one chunk index into rounds whose offsets lie within max_span.
void add_rounds_for_chunk(const std::vector<ByteRange>& pieces, std::uint64_t recv_offset,
                          std::uint64_t max_span, std::vector<ScatterRound>& rounds) {
  const std::size_t n = pieces.size();
  std::vector<std::size_t> order(n);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
    return pieces[a].offset < pieces[b].offset;
  });
  ScatterRound round;
  bool open = false;
  for (std::size_t r : order) {
    if (pieces[r].length == 0) continue;
    if (open && pieces[r].offset - round.base > max_span) {
      rounds.push_back(round);
      open = false;
    }
    if (!open) {
      round = ScatterRound{pieces[r].offset, std::vector<ByteRange>(n),
                           std::vector<std::uint64_t>(n, 0)};
      open = true;
    }
    round.send[r] = pieces[r];
    round.recv_offset[r] = recv_offset;
  }
  if (open) rounds.push_back(round);
}

}  // namespace

std::vector<ScatterRound> plan_scatter_rounds(const std::vector<ByteRange>& ranges,
                                              std::uint64_t max_bytes, std::uint64_t max_span) {
  if (max_bytes == 0) raise<UsageError>("plan_scatter_rounds: max_bytes must be positive");
  std::uint64_t longest = 0;
  for (const auto& r : ranges) longest = std::max(longest, r.length);
  std::vector<ScatterRound> rounds;
  for (std::uint64_t at = 0; at < longest; at += max_bytes) {
    std::vector<ByteRange> pieces(ranges.size());
    for (std::size_t r = 0; r < ranges.size(); ++r) {
      if (ranges[r].length > at)
        pieces[r] = {ranges[r].offset + at, std::min(max_bytes, ranges[r].length - at)};
    }
    add_rounds_for_chunk(pieces, at, max_span, rounds);
  }
  return rounds;
}

}  // namespace tpreload
